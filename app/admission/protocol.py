"""The guard's HTTP/1.1 server: one asyncio protocol per connection, httptools' parser, the ASGI app behind it.

Why its own protocol rather than a general-purpose server's: every eviction in the cluster waits on this port,
and each resource a connection can hold must have a bound, whatever the client does. The API server sends one
AdmissionReview at a time per connection (Go's client never pipelines), with a handful of headers and a body of
a few KiB, and gives up after the webhook's timeoutSeconds (at most 30 s); anything bigger, slower or more
concurrent is not it. General-purpose servers queue pipelined requests without a cap, keep reading while they
answer, leave trailers unbudgeted, and miss connections dropped without TLS close_notify; fixing that meant
subclassing a server's private classes. Here everything rests on public APIs: ``loop.sock_accept``,
``loop.connect_accepted_socket`` and httptools' parser. Per connection:

- counted from the moment it is accepted (before TLS) until ``connection_lost``, however it ends; at most
  ``max_connections`` per listener, a newcomer past the cap closes the connection whose current phase began
  longest ago (clients that hold connections churn among themselves, the API server is rarely the oldest);
- the TLS handshake must finish within ``tls_handshake_timeout``;
- one request at a time: once a request is complete, reading stops until it is answered and the answer has left
  the write buffer (so a client that never reads stops being read); a single read that already holds more than
  ``MAX_PIPELINED`` complete requests closes the connection;
- the request line, headers and trailers share ``max_header_bytes`` and ``max_headers``
  (past either: 431, close); the body ``max_body_bytes`` (past it: 413, close); chunk framing may not use more
  than the header budget plus a few bytes per chunk;
- a timer is armed in every phase: a new connection must start its first request within ``request_timeout`` (or
  the idle timeout, if shorter), an idle one is closed ``idle_timeout`` after its last answer, and from the first
  byte of a request until its answer has been written the connection may take ``request_timeout``.

The ASGI side is small because the body is read whole (bounded) before the app is called: ``receive`` hands it
over in one message, ``send`` writes the answer in one ``write``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import orjson

log = logging.getLogger("kubevirt_eviction_guard.http")

# why a connection was closed by a bound (kubevirt_eviction_guard_connections_closed_total{reason})
CAPACITY, TLS_HANDSHAKE, HEADERS, REQUEST_TIMEOUT, PIPELINE, BODY, UPGRADE, CLIENT_CERT = (
    "capacity", "tls_handshake", "headers", "request_timeout", "pipelining", "body", "upgrade", "client_certificate")
MAX_PIPELINED = 8  # complete requests one read may bring before the connection is closed
REFUSED_LINGER = 1.0  # seconds a refused connection may take to deliver its answer before it is cut
CHUNK_FRAMING = 24  # bytes of framing allowed per chunk (size in hex, CRLFs) beyond the header budget
STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


@dataclass(frozen=True)
class HttpLimits:
    """The per-listener bounds (serve's flags of the same names)."""

    request_timeout: float = 10.0  # seconds from a request's first byte until its answer is written
    max_header_bytes: int = 16 * 1024  # request line, headers and trailers of one request
    max_headers: int = 100
    max_connections: int = 512
    tls_handshake_timeout: float = 10.0
    idle_timeout: float = 5.0
    max_body_bytes: int = 64 * 1024


class OpenConnections:
    """The connections of one listener, the one whose current phase began longest ago first."""

    def __init__(self, limit: int, on_close: Callable[[str], None] | None = None) -> None:
        self.limit = limit
        self.on_close = on_close or (lambda reason: None)
        self._open: OrderedDict[int, Connection] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self):
        return iter(list(self._open.values()))

    def admit(self, conn: Connection) -> None:
        while len(self._open) >= self.limit:
            _, oldest = self._open.popitem(last=False)
            self.on_close(CAPACITY)
            oldest.abort()
        self._open[id(conn)] = conn

    def touch(self, conn: Connection) -> None:
        """``conn`` began a new phase (handshake done, request begun, answer written)."""
        try:
            self._open.move_to_end(id(conn))
        except KeyError:
            pass

    def release(self, conn: Connection) -> None:
        self._open.pop(id(conn), None)


class Refused(Exception):
    """A bound was crossed while parsing: answer ``status`` and close."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def error_response(status: int, message: str, close: bool = True) -> bytes:
    body = orjson.dumps({"error": message, "code": status})
    return b"".join([STATUS_LINES.get(status, b"HTTP/1.1 %d Error\r\n" % status),
                     b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                     b"\r\nconnection: close\r\n\r\n" if close else b"\r\n\r\n", body])


class Listener:
    """One port: its ASGI app, bounds, TLS context (None: plain HTTP) and connection table.

    ``on_close(reason)`` is told of every connection a bound closed. ``peer_cert_required``: paths that need a
    verified client certificate when the TLS context asks for one (the context then only *asks*, so that kubelet
    probes, which send none, still reach /healthz and /readyz)."""

    def __init__(self, app: Any, limits: HttpLimits, tls: ssl.SSLContext | None = None,
                 on_close: Callable[[str], None] | None = None,
                 peer_cert_required: frozenset[str] = frozenset()) -> None:
        self.app, self.limits, self.tls = app, limits, tls
        self.table = OpenConnections(limits.max_connections, on_close)
        self.peer_cert_required = peer_cert_required
        self.sock: socket.socket | None = None
        self.accepting: asyncio.Task | None = None
        self.closing = False  # shutting down: answer what is in flight, then close

    async def start(self, sock: socket.socket) -> None:
        """Accept on ``sock`` (bound and listening). The accept loop is ours, not ``create_server``'s, so that a
        connection is counted and can be shed while its TLS handshake runs: ``connect_accepted_socket`` then does
        the handshake within its timeout and raises when it fails."""
        sock.setblocking(False)
        self.sock = sock
        self.accepting = asyncio.get_running_loop().create_task(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as e:  # out of file descriptors, mostly: let connections close, then go on
                log.warning("accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            Connection(self).accepted(conn)

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, close idle connections, let requests in flight finish within ``grace``, abort the rest."""
        self.closing = True
        if self.accepting is not None:
            self.accepting.cancel()
        if self.sock is not None:
            self.sock.close()
        for conn in self.table:
            conn.close_if_idle()
        deadline = time.monotonic() + grace
        while len(self.table) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in self.table:
            conn.abort()


class Connection(asyncio.Protocol):
    """One client connection; see the module docstring for its bounds."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.limits = listener.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None  # while the TLS handshake runs
        self.closed = False
        self.parser = httptools.HttpRequestParser(self)
        self.scheme = "https" if listener.tls is not None else "http"
        self.client = self.server = None
        self.peer_cert = False
        self.due = 0.0  # loop time at which the current phase runs out
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.busy = False  # a request is being answered
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.queue: list[tuple] = []  # complete requests not yet answered (pipelined in one read)
        self.task: asyncio.Task | None = None
        self.disconnected: asyncio.Future | None = None
        self._reset_message()

    # ---- connection life ---------------------------------------------------------------------

    def accepted(self, sock: socket.socket) -> None:
        self.sock = sock
        self.listener.table.admit(self)
        self.loop.create_task(self._handshake(sock))

    async def _handshake(self, sock: socket.socket) -> None:
        tls = self.listener.tls
        try:
            await self.loop.connect_accepted_socket(lambda: self, sock, ssl=tls,
                                                    ssl_handshake_timeout=tls and self.limits.tls_handshake_timeout)
        except (Exception, asyncio.CancelledError):
            if not self.closed:  # not shed for capacity: timed out, broken, or the client left
                self.listener.table.on_close(TLS_HANDSHAKE)
            self._lost()
            sock.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Called once TLS is up (at once for plain HTTP)."""
        self.sock = None
        if self.closed:  # shed while the handshake ran
            transport.abort()
            return
        self.client = transport.get_extra_info("peername")
        self.server = transport.get_extra_info("sockname")
        obj = transport.get_extra_info("ssl_object")
        self.peer_cert = bool(obj is not None and obj.getpeercert())
        self._established(transport)

    def _established(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.listener.table.touch(self)
        # before the first request: a client that connects has its request ready (the API server, a probe)
        self._phase(min(self.limits.idle_timeout, self.limits.request_timeout))

    def abort(self) -> None:
        """Close now (shed for capacity, a timeout, shutdown)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        elif self.sock is not None:  # in the TLS handshake: make it fail now
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close_if_idle(self) -> None:
        if self.transport is None or (not self.busy and self.message_started is None):
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def _lost(self) -> None:
        """Everything the connection holds is released here, however it ended."""
        self.closed = True
        self.listener.table.release(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()
        self.can_write.set()
        if self.disconnected is not None and not self.disconnected.done():
            self.disconnected.set_result(None)
        self.parser = None  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    # ---- timers: one per connection, re-armed lazily ------------------------------------------------

    def _phase(self, seconds: float) -> None:
        self.due = due = self.loop.time() + seconds
        if self.timer is None or due < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.timer_at = self.loop.call_at(due, self._expired), due

    def _expired(self) -> None:
        self.timer = None
        if self.closed:
            return
        if self.loop.time() < self.due:
            self.timer, self.timer_at = self.loop.call_at(self.due, self._expired), self.due
            return
        if self.busy or self.message_started is not None:
            log.info("closing a connection whose request was not complete and answered within %.0fs",
                     self.limits.request_timeout)
            self.listener.table.on_close(REQUEST_TIMEOUT)
        self.abort()

    # ---- reading -----------------------------------------------------------------------------------

    def _reset_message(self) -> None:
        self.message_started: float | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_count = 0  # headers and trailers
        self.head_bytes = 0  # raw bytes fed while in the head or trailers
        self.in_body = False
        self.body: list[bytes] = []
        self.body_size = 0
        self.framing_left = self.limits.max_header_bytes
        self.expect_continue = False

    def data_received(self, data: bytes) -> None:
        if self.closed or self.parser is None:
            return
        try:
            if self.in_body:
                before = self.body_size
                self.parser.feed_data(data)
                # what was not body was chunk framing or trailers: both come out of the header budget
                if self.in_body or self.message_started is not None:
                    self._framing(len(data) - (self.body_size - before))
            else:
                self._feed_head(data)
        except Refused as r:
            self._refuse(r.status, r.reason, r.message)
            return
        except httptools.HttpParserUpgrade:
            self._refuse(400, UPGRADE, "protocol upgrades are not served here")
            return
        except httptools.HttpParserCallbackError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, Refused):
                self._refuse(cause.status, cause.reason, cause.message)
            else:
                self._refuse(400, "", "malformed request")
            return
        except httptools.HttpParserError as e:
            self._refuse(400, "", f"malformed request: {e}"[:200])
            return
        if self.queue or self.busy:
            self.transport.pause_reading()  # type: ignore[union-attr]
            self._next()

    def _feed_head(self, data: bytes) -> None:
        """A head may not grow past its budget: feed only what it may still use, then see whether it ended."""
        left = self.limits.max_header_bytes - self.head_bytes
        if len(data) <= left:
            self.head_bytes += len(data)
            self.parser.feed_data(data)
            return
        self.head_bytes += left
        self.parser.feed_data(data[:left])
        if self.in_body or self.message_started is None:  # the head ended within the budget: feed the rest
            self.data_received(data[left:])
        else:
            raise Refused(431, HEADERS, "request headers too large")

    def _framing(self, nbytes: int) -> None:
        self.framing_left -= nbytes
        if self.framing_left < 0:
            raise Refused(431, HEADERS, "request trailers or chunk framing too large")

    def on_message_begin(self) -> None:
        self.message_started = self.loop.time()
        if not self.busy:
            self.listener.table.touch(self)
            self._phase(self.limits.request_timeout)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        if self.header_count > self.limits.max_headers:
            raise Refused(431, HEADERS, "too many request headers")
        if not self.in_body:  # a trailer is counted, not kept
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.in_body = True
        for name, value in self.headers:
            if name == b"content-length" and value.strip().isdigit() and int(value) > self.limits.max_body_bytes:
                raise Refused(413, BODY, f"request body larger than {self.limits.max_body_bytes} bytes")
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_continue = True
        if self.expect_continue and not self.busy and not self.queue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_chunk_header(self) -> None:
        self.framing_left += CHUNK_FRAMING

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.limits.max_body_bytes:
            raise Refused(413, BODY, f"request body larger than {self.limits.max_body_bytes} bytes")
        self.body.append(body)

    def on_message_complete(self) -> None:
        if len(self.queue) >= MAX_PIPELINED:
            raise Refused(429, PIPELINE, f"more than {MAX_PIPELINED} pipelined requests")
        parser = self.parser
        self.queue.append((parser.get_method(), self.url, self.headers, b"".join(self.body),
                           parser.get_http_version(), parser.should_keep_alive()))
        self._reset_message()

    def _refuse(self, status: int, reason: str, message: str) -> None:
        if reason:
            self.listener.table.on_close(reason)
        self.queue.clear()
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(error_response(status, message))
            self.transport.close()
            # A closing TLS transport keeps reading (and decrypting) what the client sends while it waits for the
            # answer to drain and for close_notify: a client that keeps sending would keep it busy. One second.
            self.loop.call_later(REFUSED_LINGER, self.transport.abort)

    # ---- answering ---------------------------------------------------------------------------------

    def _next(self) -> None:
        if self.busy or not self.queue or self.closed:
            return
        self.busy = True
        request = self.queue.pop(0)
        self.task = self.loop.create_task(self._answer(*request))

    async def _answer(self, method: bytes, url: bytes, headers: list, body: bytes, version: str,
                      keep_alive: bool) -> None:
        path_bytes, _, query = url.partition(b"?")
        path = unquote(path_bytes.decode("latin-1"))
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
            "server": self.server, "client": self.client, "scheme": self.scheme, "method": method.decode("ascii"),
            "root_path": "", "path": path, "raw_path": path_bytes, "query_string": query, "headers": headers,
            "state": {},
        }
        response = Response(method == b"HEAD")
        if path in self.listener.peer_cert_required and self.listener.tls is not None \
                and self.listener.tls.verify_mode != ssl.CERT_NONE and not self.peer_cert:
            self.listener.table.on_close(CLIENT_CERT)
            response.parts = [error_response(403, "a verified client certificate is required")]
            response.keep_alive, response.done = False, True
        else:
            delivered = False

            async def receive() -> dict:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                if self.disconnected is None:
                    self.disconnected = self.loop.create_future()
                    if self.closed:
                        self.disconnected.set_result(None)
                await self.disconnected
                return {"type": "http.disconnect"}

            try:
                await self.listener.app(scope, receive, response.send)
            except Exception:
                log.exception("the app failed on %s %s", scope["method"], path)
                if not response.started:
                    response.parts = [error_response(500, "internal error", close=False)]
                    response.done = True
        if self.closed:
            return
        if not response.done:
            log.error("the app returned without an answer on %s %s", scope["method"], path)
            response.parts = [error_response(500, "internal error", close=False)]
        keep_alive = keep_alive and response.keep_alive and not self.listener.closing
        self.transport.write(b"".join(response.parts))  # type: ignore[union-attr]
        if not keep_alive:
            self.closed = True
            self.transport.close()  # type: ignore[union-attr]
            return
        if not self.can_write.is_set():  # the client does not read: wait, within the request's deadline
            await self.can_write.wait()
            if self.closed:
                return
        self.busy = False
        self.task = None
        self.listener.table.touch(self)
        if self.queue:
            self._phase(self.limits.request_timeout)
            self._next()
            return
        self._phase(self.limits.idle_timeout if self.message_started is None else self.limits.request_timeout)
        self.transport.resume_reading()  # type: ignore[union-attr]


class Response:
    """What the app sent, made into one write."""

    __slots__ = ("head_only", "parts", "started", "done", "keep_alive", "_head", "_length")

    def __init__(self, head_only: bool) -> None:
        self.head_only = head_only
        self.parts: list[bytes] = []
        self.started = self.done = False
        self.keep_alive = True
        self._head: list[bytes] = []
        self._length: int | None = None

    async def send(self, message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            status = message["status"]
            head = [STATUS_LINES.get(status, b"HTTP/1.1 %d Status\r\n" % status)]
            for name, value in message.get("headers", ()):
                lname = name.lower()
                if lname == b"content-length":
                    self._length = int(value)
                elif lname == b"connection" and value.lower() == b"close":
                    self.keep_alive = False
                elif lname == b"transfer-encoding":
                    continue  # the answer is written whole, with its length
                head.append(b"%s: %s\r\n" % (name, value))
            self._head = head
            self.started = True
        elif kind == "http.response.body":
            if not self.started or self.done:
                raise RuntimeError("http.response.body out of order")
            body = message.get("body", b"")
            if body and not self.head_only:
                self.parts.append(body)
            if not message.get("more_body", False):
                self.done = True
                length = self._length if self._length is not None else sum(map(len, self.parts))
                if self._length is None:
                    self._head.append(b"content-length: %d\r\n" % length)
                self._head.append(b"\r\n")
                self.parts[:0] = self._head


def event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it is a dependency), else asyncio's own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
