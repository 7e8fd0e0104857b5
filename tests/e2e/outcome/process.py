"""What the outcome run's helper processes (Prometheus, the descheduler) share: stopping them."""

from __future__ import annotations

import subprocess


class Service:
    """A process the run started (``self.proc``): SIGTERM, then SIGKILL if it does not go."""

    proc: subprocess.Popen

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 15) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
