"""A TCP proxy that hands the API server's bytes to its client ``delay`` seconds late: a watch that lags.

A busy or distant API server delivers watch events later than it answers a request that has just been sent; on
an idle loopback one both take a millisecond. The proxy stands between a guard and the real API server (TLS
passes through untouched: the server's certificate names 127.0.0.1, where the proxy listens) and delays every
byte coming back by the same amount, in order. A request sent after a write therefore still sees the write (the
server answers from its current state, late), while the watch event of that write arrives ``delay`` later.
"""

from __future__ import annotations

import heapq
import socket
import threading
import time


class LaggingProxy:
    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []

    def start(self) -> LaggingProxy:
        threading.Thread(target=self._accept, name="lag-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        self._closing.set()
        for s in [self.listener, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.delay), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
        """Copy ``src`` to ``dst``; each chunk leaves ``delay`` seconds after it arrived (order kept)."""
        if not delay:
            self._copy(src, dst)
            return
        pending: list[tuple[float, int, bytes]] = []
        cond = threading.Condition()
        done = threading.Event()

        def read() -> None:
            n = 0
            while data := self._recv(src):
                with cond:
                    n += 1
                    heapq.heappush(pending, (time.monotonic() + delay, n, data))
                    cond.notify()
            done.set()
            with cond:
                cond.notify()

        threading.Thread(target=read, daemon=True).start()
        while True:
            with cond:
                while not pending and not done.is_set():
                    cond.wait()
                if not pending:
                    break
                due, _, data = pending[0]
                wait = due - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                heapq.heappop(pending)
            try:
                dst.sendall(data)
            except OSError:
                break
        self._close(dst)

    def _copy(self, src: socket.socket, dst: socket.socket) -> None:
        while data := self._recv(src):
            try:
                dst.sendall(data)
            except OSError:
                break
        self._close(dst)

    @staticmethod
    def _recv(s: socket.socket) -> bytes:
        try:
            return s.recv(65536)
        except OSError:
            return b""

    @staticmethod
    def _close(s: socket.socket) -> None:
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
