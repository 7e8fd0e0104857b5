"""POST /mutate and /validate as a bare ASGI endpoint, in front of the FastAPI app.

Every eviction in the cluster waits for this answer, and the answer itself
(decode, decide, encode) costs a few tens of microseconds. FastAPI's request
path around it (middleware stack, routing, dependency solving, Request and
Response objects) costs about as much again, for features these two routes do
not use. So the two routes bypass it: ``GuardApp`` hands ``POST /mutate`` and
``POST /validate`` straight to ``AdmissionEndpoint``; every other request (other
methods on these paths, health, readiness, metrics) goes through FastAPI as
usual. The same endpoint is also registered as the routes' ASGI app, so the
routing table still tells the truth and a 405 for ``GET /mutate`` still comes
from FastAPI.

The endpoint only moves bytes: it reads the body (never more than the limit),
calls ``answer(content_type, body, started)`` and writes what that returns.
Judgement and bookkeeping stay in ``server.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from inspect import isawaitable
from typing import Any

from fastapi import FastAPI

log = logging.getLogger("kubevirt_eviction_guard.admission")
ADMISSION_PATHS = frozenset({"/mutate", "/validate"})
JSON_HEADERS = [(b"content-type", b"application/json")]
INTERNAL_ERROR = b'{"error":"internal error in the admission endpoint","code":500}'

# (content type, body or None when over the limit, perf_counter at arrival) -> (status, JSON bytes), or a coroutine
# giving them when the answer must wait on something (the one answer that reads the API server)
Answer = Callable[[str, "bytes | None", float], "tuple[int, bytes] | Awaitable[tuple[int, bytes]]"]


class AdmissionEndpoint:
    def __init__(self, answer: Answer, max_body_bytes: int) -> None:
        self.answer = answer
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        started = time.perf_counter()
        ctype, length = "", None
        for name, value in scope["headers"]:
            if name == b"content-type":
                ctype = value.decode("latin-1")
            elif name == b"content-length":
                length = value
        body = await self._read(receive, length)
        if body is False:  # the client went away; nobody to answer
            return
        try:
            answer = self.answer(ctype, body, started)
            status, payload = await answer if isawaitable(answer) else answer
        except Exception:  # answer() fails open on policy errors; anything else is a bug: say so, in JSON
            log.exception("admission endpoint failed")
            status, payload = 500, INTERNAL_ERROR
        headers = [*JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
        if body is None:  # over the limit: the rest of it is not read, and the client does not get to send more
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _read(self, receive: Callable, length: bytes | None) -> bytes | None | bool:
        """The body; None when it is larger than the limit (without reading the rest);
        False when the client disconnected."""
        limit = self.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            return None
        message = await receive()
        if message["type"] != "http.request":
            return False
        body = message.get("body", b"")
        if not message.get("more_body", False):  # the usual case: one message
            return body if len(body) <= limit else None
        chunks, size = [body], len(body)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class GuardApp(FastAPI):
    """The FastAPI app, with the admission routes answered before its request path."""

    admission: AdmissionEndpoint | None = None

    def serve_admission(self, endpoint: AdmissionEndpoint) -> None:
        self.admission = endpoint
        for path in sorted(ADMISSION_PATHS):
            self.router.add_route(path, endpoint, methods=["POST"], include_in_schema=False)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            self.admission is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in ADMISSION_PATHS
        ):
            await self.admission(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
