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
  the write buffer (so a client that never reads stops being read); what a client pipelined behind it waits
  unparsed, at most two requests' budgets of it, and at most ``MAX_PIPELINED`` requests are answered from what
  arrived at once (past either: 429, close);
- each request, however reads split it: the request line, headers, chunk framing and trailers share
  ``max_header_bytes`` (plus a few bytes per chunk) and ``max_headers`` (past either: 431, close); the body
  ``max_body_bytes``, kept in one buffer (past it: 413, close); HTTP/1.0 or 1.1 only (else 505), one Host, the
  target a path (or an absolute URL naming that Host); ``100 Continue`` only to HTTP/1.1 clients with a body to
  come (RFC 9110 10.1.1);
- a timer is armed in every phase: a new connection must start its first request within ``request_timeout`` (or
  the idle timeout, if shorter), an idle one is closed ``idle_timeout`` after its last answer, from the first byte
  of a request until its answer has been written the connection may take ``request_timeout``, and a connection
  closed after an answer (``Connection: close``, HTTP/1.0, a refusal) is cut ``CLOSE_LINGER`` later;
- a client that half-closes or sends close_notify right after a complete request still gets its answer.

The ASGI side is small because the body is read whole (bounded) before the app is called: ``receive`` hands it
over in one message, ``send`` writes the answer in one ``write``. The app is started at once, not as a task, so
an answer that waits on nothing is written within the read that brought its request.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
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
CAPACITY, TLS_HANDSHAKE, HEADERS, REQUEST_TIMEOUT, PIPELINE, BODY, UPGRADE, CLIENT_CERT, VERSION = (
    "capacity", "tls_handshake", "headers", "request_timeout", "pipelining", "body", "upgrade", "client_certificate",
    "version")
MAX_BODY_BYTES = 64 * 1024  # the default body limit (--max-body-bytes): an eviction review is a few KiB
MAX_PIPELINED = 8  # requests answered one after the other from what arrived at once; past it: 429, close
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
CLOSE_LINGER = 1.0  # seconds a closing connection may take to deliver its last answer before it is cut
TLS_READ_AHEAD = 32 * 1024  # encrypted bytes the TLS layer takes from the socket before the protocol asks
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
    max_body_bytes: int = MAX_BODY_BYTES


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
        self.buffer = b""  # bytes received and not yet parsed (the next pipelined request, while one is answered)
        self.tail = b""  # the last bytes parsed, to see a blank line split across two reads
        self.piece_body = 0  # body bytes the parser handed over from the piece being fed
        self.request: tuple | None = None  # a complete request, not yet answered
        self.eof = False  # the client sent all it will send
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
        if obj is not None:  # TLS reads ahead of the protocol up to this much (the event loop's default: 256 KiB)
            transport.set_read_buffer_limits(TLS_READ_AHEAD)  # type: ignore[attr-defined]
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
        if self.transport is None or (not self.busy and self.request is None and self.message_started is None):
            self.abort()

    def _close(self) -> None:
        """Close after what was written has left; a client that does not take it (or never sends TLS close_notify
        back) is cut after ``CLOSE_LINGER``: a closing TLS transport otherwise waits up to the event loop's own
        shutdown timeout, and keeps reading and decrypting what the client sends meanwhile."""
        self.closed = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            self.loop.call_later(CLOSE_LINGER, transport.abort)

    def eof_received(self) -> bool:
        """The client half-closed (TCP FIN) or sent TLS close_notify. A request already complete is still
        answered (over plain TCP the transport stays open for it; TLS closes its side, so an answer the app gives
        at once, before this is called, is what gets through); anything else is over."""
        self.eof = True
        if self.busy or self.request is not None:
            return True
        self._close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def _lost(self) -> None:
        """Everything the connection holds is released here, however it ended."""
        self.closed = True
        self.listener.table.release(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.request = None
        self.buffer = b""
        self._reset_message()
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
        if self.busy or self.request is not None or self.message_started is not None:
            log.info("closing a connection whose request was not complete and answered within %.0fs",
                     self.limits.request_timeout)
            self.listener.table.on_close(REQUEST_TIMEOUT)
        self.abort()

    # ---- reading -----------------------------------------------------------------------------------
    #
    # The parser is fed in pieces that never reach past the end of a request: a piece ends at the end of a
    # Content-Length body, or at a blank line (CRLF CRLF, where every head and every chunked body ends), or where
    # the request's budget runs out. So each request is charged exactly its own bytes, however the reads split
    # them, and bytes of the next request stay unparsed (in ``buffer``, reading paused) until this one is answered.

    def _reset_message(self) -> None:
        self.message_started: float | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_count = 0  # headers and trailers
        self.overhead = 0  # bytes that were not body: request line, headers, chunk framing, trailers
        self.chunks = 0
        self.in_body = False
        self.body = bytearray()  # one buffer: a body in many small chunks costs its length, not an object a chunk
        self.body_left: int | None = None  # bytes of a Content-Length body still to come (None: chunked)
        self.target: tuple[str, bytes, bytes] | None = None  # (path, raw path, query)
        self.complete: tuple[bytes, str, bool] | None = None

    def data_received(self, data: bytes) -> None:
        if self.closed or self.parser is None:
            return
        self.buffer = self.buffer + data if self.buffer else data
        if self.busy or self.request is not None:
            # pipelined ahead of the answer: up to one more request's worth (reading is paused; one read may bring it)
            if len(self.buffer) > 2 * (self.limits.max_header_bytes + self.limits.max_body_bytes):
                self._refuse(429, PIPELINE, "too much pipelined ahead of the request being answered")
            return
        self._serve()

    def _serve(self) -> None:
        """Parse and answer what has arrived, one request at a time, for as long as answers come at once."""
        started = 0
        while not self.closed:
            if self.busy:
                break
            if self.request is not None:
                if started == MAX_PIPELINED:  # one client may not keep the event loop to itself
                    self._refuse(429, PIPELINE, f"more than {MAX_PIPELINED} pipelined requests")
                    break
                request, self.request = self.request, None
                started += 1
                self._start(request)
                continue
            if not self.buffer:
                break
            try:
                self._parse()
            except Refused as r:
                self._refuse(r.status, r.reason, r.message)
            except httptools.HttpParserUpgrade:
                self._refuse(400, UPGRADE, "protocol upgrades are not served here")
            except httptools.HttpParserCallbackError as e:
                cause = e.__cause__ or e.__context__
                if isinstance(cause, Refused):
                    self._refuse(cause.status, cause.reason, cause.message)
                else:
                    self._refuse(400, "", "malformed request")
            except httptools.HttpParserError as e:
                self._refuse(400, "", f"malformed request: {e}"[:200])
        if self.closed or self.transport is None:
            return
        if self.busy:
            self.transport.pause_reading()
        elif self.eof:
            self._close()  # the client has sent all it will: nothing more to answer
        else:
            self.transport.resume_reading()

    def _parse(self) -> None:
        """Feed the parser one piece of ``buffer`` (see above); charge the request what was not body."""
        data = self.buffer
        room = max(self.limits.max_header_bytes + CHUNK_FRAMING * self.chunks - self.overhead, 1)
        if self.in_body:
            room = self.body_left if self.body_left is not None else room + self.limits.max_body_bytes - len(self.body) + 1
        cut = min(len(data), room)
        end = data.find(b"\r\n\r\n", 0, cut)
        if end >= 0:
            cut = end + 4
        if self.tail:  # a blank line split across two reads
            end = (self.tail + data[:3]).find(b"\r\n\r\n")
            if end >= 0:
                cut = min(cut, end + 4 - len(self.tail))
        piece, self.buffer = (data, b"") if cut >= len(data) else (data[:cut], data[cut:])
        self.piece_body = 0
        self.parser.feed_data(piece)
        self.tail = (self.tail + piece)[-3:] if len(piece) < 3 else piece[-3:]
        self.overhead += len(piece) - self.piece_body
        if self.overhead > self.limits.max_header_bytes + CHUNK_FRAMING * self.chunks:
            raise Refused(431, HEADERS, "request headers, trailers or chunk framing too large")
        if self.complete:
            method, version, keep_alive = self.complete
            path, raw_path, query = self.target  # type: ignore[misc]
            self.request = (method, path, raw_path, query, self.headers, bytes(self.body), version, keep_alive)
            self._reset_message()

    def on_message_begin(self) -> None:
        if self.complete:  # two requests in one piece: the boundary was not where a request must end
            raise Refused(400, "", "malformed request")
        self.message_started = self.loop.time()
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
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise Refused(505, VERSION, f"HTTP/{version} is not served here")
        hosts, length, expect, chunked = [], None, None, False
        for name, value in self.headers:
            if name == b"host":
                hosts.append(value)
            elif name == b"content-length":
                length = int(value)  # the parser took only one, of digits
            elif name == b"expect":
                expect = value.strip().lower()
            elif name == b"transfer-encoding":
                chunked = True
        if len(hosts) > 1 or (version == "1.1" and not hosts):
            raise Refused(400, "", "a request needs exactly one Host header")
        self.target = self._target(hosts[0] if hosts else b"")
        if length is not None and length > self.limits.max_body_bytes:
            raise Refused(413, BODY, f"request body larger than {self.limits.max_body_bytes} bytes")
        self.body_left = None if chunked else length or 0
        # RFC 9110 10.1.1: not to HTTP/1.0, only for a body still to come, and not after the body has begun
        if expect == b"100-continue" and version == "1.1" and (chunked or length) and not self.buffer:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def _target(self, host: bytes) -> tuple[str, bytes, bytes]:
        """(path, raw path, query) of the request target (RFC 9112 3.2): origin-form, or absolute-form naming
        this server as the Host header does (a proxy's request for another is refused); nothing else."""
        url = self.url
        if url[:1] != b"/":
            scheme, _, rest = url.partition(b"://")
            authority, slash, path = rest.partition(b"/")
            if scheme.lower() != self.scheme.encode() or not authority or authority.lower() != host.lower():
                raise Refused(400, "", "request target must be a path on this server")
            url = slash + path or b"/"
        raw_path, _, query = url.partition(b"?")
        raw_path = raw_path.partition(b"#")[0]
        return unquote(raw_path.decode("latin-1")), raw_path, query

    def on_chunk_header(self) -> None:
        self.chunks += 1

    def on_body(self, body: bytes) -> None:
        self.piece_body += len(body)
        if len(self.body) + len(body) > self.limits.max_body_bytes:
            raise Refused(413, BODY, f"request body larger than {self.limits.max_body_bytes} bytes")
        self.body += body
        if self.body_left is not None:
            self.body_left -= len(body)

    def on_message_complete(self) -> None:
        parser = self.parser  # read now: the parser forgets them once the next request begins
        self.complete = (parser.get_method(), parser.get_http_version(), parser.should_keep_alive())

    def _refuse(self, status: int, reason: str, message: str) -> None:
        if reason:
            self.listener.table.on_close(reason)
        self.request = None
        self.buffer = b""
        transport = self.transport
        if transport is not None and not transport.is_closing() and not self.closed:
            transport.write(error_response(status, message))
        self._close()

    # ---- answering ---------------------------------------------------------------------------------

    def _start(self, request: tuple) -> None:
        """Answer ``request``: at once when the app does not wait on anything (most answers), so the answer is
        written before the read that brought the request returns (and before a close_notify right behind it is
        seen); else the rest runs as a task."""
        self.busy = True
        coro = self._answer(*request)
        try:
            waiting = coro.send(None)
        except StopIteration:
            return
        self.task = self.loop.create_task(resumed(coro, waiting))

    async def _answer(self, method: bytes, path: str, raw_path: bytes, query: bytes, headers: list, body: bytes,
                      version: str, keep_alive: bool) -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
            "server": self.server, "client": self.client, "scheme": self.scheme, "method": method.decode("ascii"),
            "root_path": "", "path": path, "raw_path": raw_path, "query_string": query, "headers": headers,
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
        keep_alive = keep_alive and response.keep_alive and not self.listener.closing and not self.eof
        self.transport.write(b"".join(response.parts))  # type: ignore[union-attr]
        if not keep_alive:
            self._close()
            return
        if not self.can_write.is_set():  # the client does not read: wait, within the request's deadline
            await self.can_write.wait()
            if self.closed:
                return
        self.busy = False
        self.listener.table.touch(self)
        self._phase(self.limits.request_timeout if self.buffer else self.limits.idle_timeout)
        if self.task is not None:  # answered later than the read that brought the request: go on from here
            self.task = None
            self._serve()


async def resumed(coro: Any, waiting: Any) -> None:
    """Drive on a coroutine whose first step (run at once, outside any task) left it waiting on ``waiting``:
    what a task does, for a coroutine already started (Python 3.12's eager tasks, on 3.11 too)."""
    while True:
        try:
            if waiting is None:  # a bare yield (asyncio.sleep(0))
                await asyncio.sleep(0)
            else:
                await asyncio.wait([waiting])
        except asyncio.CancelledError as e:
            try:
                waiting = coro.throw(e)
            except StopIteration:
                return
            continue
        try:
            waiting = coro.send(None)
        except StopIteration:
            return


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


def return_freed_memory() -> None:
    """Make glibc's malloc give buffers of 64 KiB and more back to the system when they are freed. Its default
    raises that threshold as large buffers come and go (TLS records, bodies, reads), after which they are carved
    from the heap and a burst of clients leaves the process that much bigger for good. The price: each TLS read
    (the event loop reads into a fresh 256 KiB buffer) becomes an mmap and a munmap. A threshold above that buffer
    (512 KiB) spares it, but 200 TLS connections of 2-byte chunks then grow the process by 85 MiB, not 62-64.
    Elsewhere: nothing."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    except (OSError, AttributeError):  # not glibc
        pass


def event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it is a dependency), else asyncio's own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
