"""Capped exponential backoff with jitter, shared by the watch loops and the side-effect queue.

The delay before retry ``attempt`` (1, 2, ...) is ``min(cap, base * 2^(attempt-1))``,
jittered. Two jitters, for two jobs:

- ``equal``: half fixed, half random. The watch loops use it: the fixed half
  guarantees a dead API server never sees a tight loop, the random half spreads
  the replicas of every controller apart when it comes back.
- ``full``: uniform in [0, delay]. The side-effect queue uses it: its retries are
  independent writes, and full jitter spreads them most (AWS architecture blog,
  "Exponential Backoff And Jitter").
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

EQUAL, FULL = "equal", "full"


@dataclass(frozen=True)
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    jitter: str = FULL

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry ``attempt`` (the first retry is attempt 1)."""
        d = min(self.cap, self.base * 2 ** min(max(attempt - 1, 0), 60))
        return d / 2 + rand() * d / 2 if self.jitter == EQUAL else rand() * d
