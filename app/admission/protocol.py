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
    """The request deadline is one timer per connection, not one per request: a request only notes when its
    first byte came, and the timer, when it fires, closes the connection if the request in progress is past
    its deadline, re-arms for the one in progress otherwise, and stays off while the connection is idle
    (the keep-alive timer's business). Under keep-alive load that is one timer callback per connection every
    ``request_timeout`` instead of a timer created and cancelled for every request."""

    request_timeout: float = REQUEST_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_started: float | None = None  # loop time of the first byte of the request in progress
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # idle before the first request: the same limit as between requests
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_started = started = self.loop.time()
        if self._deadline is None:
            self._deadline = self.loop.call_at(started + self.request_timeout, self._check_deadline)

    def on_message_complete(self) -> None:
        self._request_started = None
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._request_started = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def _check_deadline(self) -> None:
        self._deadline = None
        started = self._request_started
        if started is None:
            return  # idle: the next request arms the timer again
        due = started + self.request_timeout
        if self.loop.time() < due:  # a later request than the one that armed it
            self._deadline = self.loop.call_at(due, self._check_deadline)
        elif not self.transport.is_closing():
            self.logger.info("closing a connection whose request did not arrive within %.0fs", self.request_timeout)
            self.transport.close()
