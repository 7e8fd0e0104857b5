"""The plain-HTTP side port: ``/metrics``, ``/healthz`` and ``/readyz`` only.

Prometheus scrapes without the webhook's CA, so the chart gives it its own
plain-HTTP port. The same FastAPI app answers there (identical probes and
metrics), behind an allow-list so that the admission endpoints are never
reachable without TLS. The same bounds on clients hold here as on the HTTPS
port (``protocol.py``: header budgets, request and idle timeouts, its own
connection cap). It runs in its own thread with its own event loop: a
slow scrape can never delay an admission answer, and uvicorn installs no
signal handlers outside the main thread, so SIGTERM still belongs to the
HTTPS server.
"""

from __future__ import annotations

import socket
import threading
import time

import orjson
import uvicorn

from app.admission.protocol import HttpLimits, protocol_class
from app.admission.server import GuardContext, create_app

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
    def __init__(self, ctx: GuardContext, host: str, port: int, http: type | None = None,
                 idle_timeout: float = 30.0, sock: socket.socket | None = None) -> None:
        """``http``: the protocol class (serve passes the HTTPS port's, bound to this port's own table);
        ``sock``: already bound to host:port (``serve`` binds it before loading anything)."""
        config = uvicorn.Config(
            only_paths(create_app(ctx)), host=host, port=port, log_config=None, access_log=False,
            lifespan="off", timeout_graceful_shutdown=2, http=http or protocol_class(HttpLimits()),
            timeout_keep_alive=idle_timeout,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock] if sock else None},
                                        name="metrics-http", daemon=True)

    def start(self, timeout: float = 10.0) -> MetricsServer:
        """Start listening; raises OSError when the port cannot be bound (uvicorn's thread just ends then)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                cfg = self.server.config
                raise OSError(f"--metrics-port {cfg.port}: cannot listen on {cfg.host}:{cfg.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=2)
