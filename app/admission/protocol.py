"""uvicorn's httptools protocol with the two timeouts a webhook on the eviction path needs.

uvicorn arms its keep-alive timer only *after* a response, and has no limit on
how long a request may take to arrive. So a client that connects and sends
nothing, dribbles its headers one byte at a time (slowloris), or never
finishes its body would hold a connection (and a file descriptor) for ever.
The API server sends a whole AdmissionReview at once and gives up after the
webhook's timeoutSeconds (at most 30 s), so anything slower is not it:

- an idle connection, before its first request as after each response, is
  closed after ``timeout_keep_alive``;
- a request must be complete (headers and body) within ``REQUEST_TIMEOUT`` of
  its first byte, or the connection is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last; set by serve


class GuardHttpProtocol(HttpToolsProtocol):
    request_timeout: float = REQUEST_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # idle before the first request: the same limit as between requests
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._cancel_deadline()
        self._request_deadline = self.loop.call_later(self.request_timeout, self._request_too_slow)

    def on_message_complete(self) -> None:
        self._cancel_deadline()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _cancel_deadline(self) -> None:
        if self._request_deadline is not None:
            self._request_deadline.cancel()
            self._request_deadline = None

    def _request_too_slow(self) -> None:
        self._request_deadline = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection whose request did not arrive within %.0fs", self.request_timeout)
            self.transport.close()
