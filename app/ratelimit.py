"""The one token bucket: the Event write budget and the fresh reads before an allow both spend from one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` per second, at most ``burst`` saved up; thread-safe."""

    def __init__(self, rate: float, burst: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.monotonic = rate, burst, monotonic
        self.tokens, self.at = burst, monotonic()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1:
                return False
            self.tokens -= 1
            return True
