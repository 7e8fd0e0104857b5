"""uvicorn's httptools protocol with the bounds a webhook on the eviction path needs, on both ports.

uvicorn keeps every header a client sends, arms its keep-alive timer only
*after* a response, has no limit on how long a request may take to arrive,
and lets asyncio hold a connection that never finishes its TLS handshake for
60 s. The API server sends a whole AdmissionReview at once, with a handful of
headers, and gives up after the webhook's timeoutSeconds (at most 30 s), so
anything bigger or slower is not it. Per connection:

- the TLS handshake must finish within ``tls_handshake_timeout``;
- a new connection must start its first request within ``request_timeout``
  (or ``timeout_keep_alive``, if shorter), and an idle one is closed
  ``timeout_keep_alive`` after each response;
- a request must be complete (headers and body) within ``request_timeout`` of
  its first byte;
- its request line and headers may take ``max_header_bytes`` and
  ``max_headers`` headers; past either the answer is 431 and the connection
  closes.

And per listener, at most ``max_connections`` connections exist at once,
counted from the moment they are accepted (before TLS: a connection that never
sends a byte costs the TLS buffers already). A connection past the cap closes
the one whose current phase (handshake, request, or idle wait) began longest
ago: clients that hold connections without finishing them churn among
themselves, while a client that finishes its requests in milliseconds (the API
server, a probe) is rarely the oldest. This is why TLS is set up here
(the loop's own TLS protocol, put in front of this one in ``connection_made``)
rather than by the server: only a protocol that sees the
raw connection can count it, time it and close it.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ssl
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

# why a connection was closed by a bound (kubevirt_eviction_guard_connections_closed_total{reason})
CAPACITY, TLS_HANDSHAKE, HEADERS, REQUEST_TIMEOUT = "capacity", "tls_handshake", "headers", "request_timeout"
TOO_LARGE = b'{"error":"request headers too large","code":431}'


@dataclass(frozen=True)
class HttpLimits:
    """The per-listener bounds (serve's flags of the same names)."""

    request_timeout: float = 10.0  # seconds from a request's first byte to its last
    max_header_bytes: int = 16 * 1024  # request line and headers of one request
    max_headers: int = 100
    max_connections: int = 512
    tls_handshake_timeout: float = 10.0


class OpenConnections:
    """The connections of one listener, the one whose current phase began longest ago first."""

    def __init__(self, limit: int, on_close: Callable[[str], None] | None = None) -> None:
        self.limit = limit
        self.on_close = on_close or (lambda reason: None)
        self._open: OrderedDict[int, GuardHttpProtocol] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, conn: GuardHttpProtocol) -> None:
        while len(self._open) >= self.limit:
            _, oldest = self._open.popitem(last=False)
            oldest.shed()
            self.on_close(CAPACITY)
        self._open[id(conn)] = conn

    def touch(self, conn: GuardHttpProtocol) -> None:
        """``conn`` began a new phase (handshake done, request begun, response sent)."""
        try:
            self._open.move_to_end(id(conn))
        except KeyError:
            pass

    def release(self, conn: GuardHttpProtocol) -> None:
        self._open.pop(id(conn), None)


class HeadersTooLarge(Exception):
    pass


class GuardHttpProtocol(HttpToolsProtocol):
    """Use ``protocol_class`` to get one bound to a listener's limits, TLS context and connection table.

    The request deadline is one timer per connection, not one per request: a request only notes when its
    first byte came, and the timer, when it fires, closes the connection if the request in progress is past
    its deadline, re-arms for the one in progress otherwise, and stays off while the connection is idle
    (the keep-alive timer's business). Under keep-alive load that is one timer callback per connection every
    ``request_timeout`` instead of a timer created and cancelled for every request."""

    limits: HttpLimits = HttpLimits()
    tls: ssl.SSLContext | None = None
    table: OpenConnections = OpenConnections(HttpLimits.max_connections)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_started: float | None = None  # loop time of the first byte of the request in progress
        self._deadline: asyncio.TimerHandle | None = None
        self._tls_started = False
        self._raw: asyncio.Transport | None = None  # the TCP transport, while the TLS handshake runs
        self._lost = False
        self._head_left = self.limits.max_header_bytes  # header bytes the request being read may still use
        self._headers_seen = 0

    # ---- connection life -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.tls is not None and not self._tls_started:
            self._start_tls(transport)  # the TLS layer calls connection_made again once the handshake is done
            return
        if self.tls is None:
            self.table.admit(self)
        self._raw = None
        self._established(transport)

    def _start_tls(self, raw: asyncio.Transport) -> None:
        """Put the loop's own TLS protocol between the TCP connection and this one, as the loop's server does
        for ``create_server(ssl=...)``, but with the connection counted and its handshake in our hands.
        Done in connection_made, before the loop starts reading: the ClientHello goes to the TLS layer."""
        self._tls_started = True
        self.table.admit(self)
        self._raw = raw
        waiter = self.loop.create_future()
        waiter.add_done_callback(self._handshake_done)
        layer = tls_protocol_class(self.loop)(self.loop, self, self.tls, waiter, server_side=True,
                                               server_hostname=None,
                                               ssl_handshake_timeout=self.limits.tls_handshake_timeout)
        raw.set_protocol(layer)
        layer.connection_made(raw)

    def _handshake_done(self, waiter: asyncio.Future) -> None:
        if self._raw is None:
            return  # established (connection_made came first)
        raw, self._raw = self._raw, None
        self.table.release(self)
        if not self._lost:  # timed out, broken, or the client left; not shed (counted as capacity)
            self._lost = True
            self.table.on_close(TLS_HANDSHAKE)
        if not waiter.cancelled():
            waiter.exception()  # retrieved: the failure is counted, not "never retrieved"
        raw.abort()

    def _established(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self.table.touch(self)
        # before the first request: a client that connects has its request ready (the API server, a probe)
        first = min(self.timeout_keep_alive, self.limits.request_timeout)
        self.timeout_keep_alive_task = self.loop.call_later(first, self.timeout_keep_alive_handler)

    def shed(self) -> None:
        """Closed to make room for a newer connection."""
        if self._raw is not None:
            self._lost = True
            self._raw.abort()
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.table.release(self)
        self._lost = True
        self._request_started = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self.transport is None:  # TLS never came up: nothing of uvicorn's to tear down
            return
        super().connection_lost(exc)

    # ---- reading ---------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        left = self._head_left
        if left is None or len(data) <= left:  # a body, or a head within its budget: the usual case
            if left is not None:
                self._head_left = left - len(data)
            super().data_received(data)
            return
        # The head may not grow past its budget: feed only what it may still use, then see whether it ended.
        # (A chunk fed whole above may hold the start of a pipelined request's head: that head gets its budget
        # on top of what it had in that chunk, which the transport's read size bounds.)
        self._head_left = 0
        super().data_received(data[:left])
        if self.transport.is_closing():
            return
        if self._head_left != 0:  # the head ended within the budget; the rest is body (or the next request)
            super().data_received(data[left:])
        else:
            self._too_large()

    def send_400_response(self, msg: str) -> None:
        if self._headers_seen > self.limits.max_headers:  # on_header stopped the parser
            self._too_large()
        else:
            super().send_400_response(msg)

    def _too_large(self) -> None:
        self.table.on_close(HEADERS)
        self.transport.write(b"".join([
            STATUS_LINE[431], b"content-type: application/json\r\ncontent-length: ", str(len(TOO_LARGE)).encode(),
            b"\r\nconnection: close\r\n\r\n", TOO_LARGE]))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.table.touch(self)
        self._headers_seen = 0
        self._request_started = started = self.loop.time()
        if self._deadline is None:
            self._deadline = self.loop.call_at(started + self.limits.request_timeout, self._check_deadline)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers_seen += 1
        if self._headers_seen > self.limits.max_headers:
            raise HeadersTooLarge  # httptools stops parsing; send_400_response answers 431 instead
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_left = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._request_started = None
        self._head_left = self.limits.max_header_bytes
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.table.touch(self)
        super().on_response_complete()

    def _check_deadline(self) -> None:
        self._deadline = None
        started = self._request_started
        if started is None:
            return  # idle: the next request arms the timer again
        due = started + self.limits.request_timeout
        if self.loop.time() < due:  # a later request than the one that armed it
            self._deadline = self.loop.call_at(due, self._check_deadline)
        elif not self.transport.is_closing():
            self.logger.info("closing a connection whose request did not arrive within %.0fs",
                             self.limits.request_timeout)
            self.table.on_close(REQUEST_TIMEOUT)
            self.transport.close()


def tls_protocol_class(loop: asyncio.AbstractEventLoop) -> type:
    """The TLS protocol of ``loop``'s own ``create_server(ssl=...)``: uvloop's, or asyncio's."""
    try:
        import uvloop.loop
    except ImportError:  # pragma: no cover - uvloop is a dependency (uvicorn[standard])
        uvloop = None  # type: ignore[assignment]
    if uvloop is not None and isinstance(loop, uvloop.loop.Loop):
        return uvloop.loop.SSLProtocol
    return asyncio.sslproto.SSLProtocol


def protocol_class(limits: HttpLimits, tls: ssl.SSLContext | None = None,
                   on_close: Callable[[str], None] | None = None) -> type[GuardHttpProtocol]:
    """A protocol class for one listener: its limits, its TLS context (None: plain HTTP), its own connection
    table (``.table``); ``on_close(reason)`` is told of every connection a bound closed."""
    table = OpenConnections(limits.max_connections, on_close)
    return type("GuardHttpProtocol", (GuardHttpProtocol,), {"limits": limits, "tls": tls, "table": table})
