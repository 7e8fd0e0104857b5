"""The background loops of the effects (held nodes, the canceller, history reconcile): one daemon thread each."""

from __future__ import annotations

import threading


class BackgroundLoop:
    """Runs ``_run`` on a daemon thread named ``thread_name``; ``_run`` waits on ``_stop`` and returns once it is set."""

    thread_name = "background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        raise NotImplementedError

    def start(self):
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake_up()
        if self._thread is not None:
            self._thread.join(timeout)

    def _wake_up(self) -> None:
        """Anything else the loop may be waiting on (nothing by default)."""
