"""How much the guard can trust each kind of cluster state right now.

Each watch loop owns one ``KindStatus`` and writes to it; the admission server
reads all of them through ``CacheHealthBoard.health()`` on every request. The
writes are single attribute assignments (atomic under the GIL) and the reader
only needs a consistent-enough view, so there is no lock on the request path.

Two different questions, two different answers:

- *not synced*: the kind has never been listed. The guard knows nothing, so it
  is not ready (``/readyz`` 503) and policy fails open with ``cache_not_ready``.
- *stale*: the kind was listed, but its watch has been broken for longer than
  ``stale_after``. The guard keeps serving the last known state (readiness stays
  true: pulling every replica out of the Service because the API server blinked
  would turn a blip into an outage of the webhook), but policy fails open with
  ``cache_stale`` for decisions that depend on that kind, rather than denying an
  eviction because of a migration that may have finished minutes ago.

Staleness is measured on the real clock (``clock``), never on the decision time
passed to ``health(now)``: with ``--now`` a what-if run decides "as of" a fixed
time, but a broken watch is broken in real time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from app.domain.view import CacheHealth

NOT_LISTED = "not listed yet"


class KindStatus:
    """The state of one kind's list+watch loop, as its loop reports it."""

    def __init__(self, kind: str, clock: Callable[[], float] = time.time) -> None:
        self.kind = kind
        self.clock = clock
        self.synced = False  # listed at least once
        self.broken_since: float | None = None  # when the watch last stopped delivering, while it is down
        self.problem = NOT_LISTED  # why not synced or why broken, for /readyz and logs

    def listed(self) -> None:
        self.synced = True
        self.healthy()

    def healthy(self) -> None:
        self.broken_since = None
        self.problem = ""

    def broken(self, why: str, since: float | None = None) -> None:
        """The loop cannot get data; ``since`` when the last good data was seen (default: now).
        The earliest moment wins until ``healthy()``: a flapping watch stays broken."""
        if self.broken_since is None:
            self.broken_since = since if since is not None else self.clock()
        self.problem = why

    def stale(self, stale_after: float) -> bool:
        since = self.broken_since
        return since is not None and self.clock() - since > stale_after


class CacheHealthBoard:
    """``health(now)`` and ``readiness_detail()`` for ``GuardContext``, over every kind's status."""

    def __init__(self, statuses: Iterable[KindStatus], stale_after: float) -> None:
        self.statuses = {s.kind: s for s in statuses}
        self.stale_after = stale_after

    def health(self, now: float | None = None) -> CacheHealth:
        not_synced = [k for k, s in self.statuses.items() if not s.synced]
        stale = [k for k, s in self.statuses.items() if s.synced and s.stale(self.stale_after)]
        return CacheHealth(not_synced=frozenset(not_synced), stale=frozenset(stale))

    def readiness_detail(self) -> dict[str, str]:
        """Per kind, why it is not synced (or why its watch is broken); kinds that are fine are absent."""
        return {k: s.problem or NOT_LISTED for k, s in self.statuses.items() if not s.synced or s.broken_since}
