"""The plain-HTTP side port: ``/metrics``, ``/healthz`` and ``/readyz`` only.

Prometheus scrapes without the webhook's CA, so the chart gives it its own
plain-HTTP port. The same FastAPI app answers there (identical probes and
metrics), behind an allow-list so that the admission endpoints are never
reachable without TLS. The same bounds on clients hold here as on the HTTPS
port (``protocol.py``: header budgets, request and idle timeouts, its own
connection cap). It runs in its own thread with its own event loop, so a
slow scrape can never delay an admission answer; for the same reason its
``/healthz`` and ``/readyz`` also read the HTTPS loop's heartbeat
(``GuardContext.webhook_beat``): a stalled webhook port fails them.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import orjson

from app.metrics import Metrics
from app.transport.http import HttpLimits, Listener, event_loop

SIDE_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})


def only_paths(app, allowed: frozenset[str] = SIDE_PATHS):
    """ASGI wrapper answering 404 for every HTTP path outside ``allowed``."""

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in allowed:
            body = orjson.dumps({"error": f"no such endpoint on the metrics port: {scope['path']}", "code": 404})
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return guarded


class MetricsServer:
    """The side port in a thread of its own, with its own event loop and the same bounds as the HTTPS port."""

    def __init__(self, app, metrics: Metrics, sock: socket.socket, limits: HttpLimits | None = None) -> None:
        """``app``: the guard's ASGI app (served behind ``only_paths``); ``sock``: already bound (``serve`` binds it
        before loading anything)."""
        limits = limits or HttpLimits()
        closed = metrics.connections_closed
        self.listener = Listener(only_paths(app), limits,
                                 on_close=lambda reason: closed.labels("metrics", reason).inc())
        metrics.open_connections.labels("metrics").set_function(lambda: len(self.listener.table))
        self.sock = sock
        self._loop = event_loop()
        self._started = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.listener.start(self.sock))
        except BaseException as e:  # noqa: BLE001 - handed to start()
            self._failed = e
            self._started.set()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def start(self, timeout: float = 10.0) -> MetricsServer:
        self._thread.start()
        if not self._started.wait(timeout) or self._failed is not None:
            raise OSError(f"the metrics port did not start: {self._failed or 'timed out'}")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop.is_closed() or not self._thread.is_alive():
            return

        async def down() -> None:
            await self.listener.shutdown(1.0)
            loop.stop()

        asyncio.run_coroutine_threadsafe(down(), loop)
        self._thread.join(timeout=3)
