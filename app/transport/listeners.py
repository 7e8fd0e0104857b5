"""The HTTPS port's listening socket, its listener (bounds counted in the metrics) and the loop that serves it."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from typing import Protocol

from app.metrics import Metrics
from app.transport.http import HttpLimits, Listener, event_loop

log = logging.getLogger("kubevirt_eviction_guard")


class Beating(Protocol):
    """What the serving loop tells the application (``GuardContext`` is one)."""

    webhook_beat: float | None  # time.monotonic() of the loop's last heartbeat
    shutting_down: bool  # draining after SIGTERM: readiness off


class GuardServer:
    """The HTTPS listener on its own event loop, in the main thread (it owns SIGTERM and SIGINT).

    SIGINT (Ctrl-C) stops at once. The first SIGTERM turns readiness off and keeps serving for ``drain_seconds``
    (the API server keeps sending to an endpoint until it is removed from the Service), then stops accepting,
    closes idle connections and lets requests in flight finish within ``graceful_seconds``; the process then
    exits with status 0 (Kubernetes reads death by a signal as a crash). A second signal stops now.

    The loop also beats a heartbeat (``ctx.webhook_beat``) twice a second: the metrics port runs its own loop,
    and its probes read the heartbeat, so they fail when this loop stalls rather than staying green beside it.
    """

    def __init__(self, listener: Listener, sock: socket.socket, ctx: Beating, drain_seconds: float,
                 graceful_seconds: float) -> None:
        self.listener, self.sock, self.ctx = listener, sock, ctx
        self.drain_seconds, self.graceful_seconds = drain_seconds, graceful_seconds
        self._stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0
        self.started = threading.Event()

    def run(self) -> None:
        loop = event_loop()
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._main())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    async def _main(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        signals = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.handle_exit, sig)
        self._beat(loop)
        await self.listener.start(self.sock)
        self.started.set()
        try:
            await self._stop.wait()
            await self.listener.shutdown(0.0 if self._signals > 1 else self.graceful_seconds)
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
        log.info("shutdown complete")

    def stop(self) -> None:
        """From another thread (tests): stop as after SIGINT."""
        self.loop.call_soon_threadsafe(self._stop.set)  # type: ignore[union-attr]

    def _beat(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ctx.webhook_beat = time.monotonic()
        loop.call_later(0.5, self._beat, loop)

    def handle_exit(self, sig: int) -> None:
        self._signals += 1
        assert self._stop is not None
        if self._stop.is_set() or self.ctx.shutting_down:  # the second signal: stop now
            self._signals = 2
            self._stop.set()
            for conn in self.listener.table:
                conn.abort()
            return
        if self.drain_seconds <= 0 or sig != signal.SIGTERM:
            self._stop.set()
            return
        self.ctx.shutting_down = True
        log.info("shutting down: readiness off, draining", extra={"drain_seconds": self.drain_seconds})
        asyncio.get_running_loop().call_later(self.drain_seconds, self._stop.set)


def listener(app, limits: HttpLimits, metrics: Metrics, name: str, tls=None,
             peer_cert_required: frozenset[str] = frozenset()) -> Listener:
    """One port's listener, its bounds counted in ``metrics``."""
    closed = metrics.connections_closed
    port = Listener(app, limits, tls, on_close=lambda reason: closed.labels(name, reason).inc(),
                             peer_cert_required=peer_cert_required)
    metrics.open_connections.labels(name).set_function(lambda: len(port.table))
    return port


def listen(host: str, port: int, backlog: int, flag: str = "--port") -> socket.socket:
    """A listening socket, bound here so that a bad address or a port in use is one line, not a traceback."""
    sock = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restarts need no wait
        sock.bind(address)
        sock.listen(backlog)
        return sock
    except OSError as e:
        if sock is not None:
            sock.close()
        raise OSError(f"{flag} {port}: cannot listen on {host}: {e.strerror or e}") from None
