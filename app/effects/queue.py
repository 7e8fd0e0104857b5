"""A bounded background queue for side effects: one worker thread, retries, backoff.

Why a thread and not the event loop: the kubernetes client is synchronous
(urllib3), and a side effect must never hold up an admission answer. The
request path only appends to a heap under a lock (microseconds); the worker
thread does the API calls, each bounded by the client's request timeout.

Why bounded, dropping the oldest: when the API server is slow or down, work
piles up faster than it drains. The newest work reflects the newest cluster
state, and every job re-reads the store when it runs, so an old job is the
least valuable one to keep. Every drop is counted (``side_effects_dropped_total``); the warning
comes at the first drop and then at most every ``DROP_LOG_INTERVAL`` seconds, with the count since the last.

Why two lanes: Events are the one effect anyone who reaches the port can multiply (a forged review of each of
thousands of VMs); the annotation and history jobs keep the state the policy reads across restarts and must not
be crowded out by them. Event jobs (kind ``event``) are bounded to ``capacity``, all others separately to
``state_capacity`` (ten times as many by default: they are keyed by real objects, one per pod or VMI at most, a
few hundred bytes each), and a full lane drops its own oldest job only.

Why keyed: a descheduler loop asks about the same pod again and again. A job
whose key is already waiting is not queued twice; the waiting one will see the
latest state when it runs.

Retries: a job raises ``Retry`` for a transient failure (connection refused,
timeout, 429, 5xx, an optimistic-concurrency conflict) and is run again after
a capped exponential backoff with full jitter, up to ``max_attempts`` times;
then it is given up and counted in ``side_effect_errors_total{kind}``. Any
other exception is a permanent failure: counted and logged once, no retry.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from app.backoff import Backoff
from app.metrics import Metrics

log = logging.getLogger("kubevirt_eviction_guard.effects")
EVENT = "event"  # the kind of the jobs in the Event lane
DROP_LOG_INTERVAL = 10.0  # seconds between "queue full" warnings while the queue stays full


class Retry(Exception):
    """A transient failure: run the job again after a backoff."""


class Later(Retry):
    """Not a failure: the job is waiting for something (the store to catch up); run it again later."""


class Job(Protocol):
    kind: str  # metric label: "annotation", "event", "history"
    key: Hashable  # jobs with equal keys are not queued twice

    def run(self) -> str:
        """Do the work; return the outcome label ("applied", "not_needed", ...)."""
        ...


@dataclass(order=True)
class _Entry:
    ready_at: float
    seq: int
    job: Job = field(compare=False)
    attempt: int = field(default=1, compare=False)


class EffectQueue:
    def __init__(
        self,
        metrics: Metrics,
        capacity: int = 1000,
        max_attempts: int = 5,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        state_capacity: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.metrics = metrics
        self.capacity = capacity
        self.state_capacity = state_capacity or 10 * capacity
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.clock = clock
        self.rand = rand
        # Two views of the same jobs: a heap by ready time for the worker, and submission order (seq -> entry)
        # for dropping the oldest in O(1). A dropped job stays in the heap as a tombstone (its seq is no longer
        # in ``_live``) until it reaches the top or the heap is compacted.
        self._heap: list[_Entry] = []
        self._live: OrderedDict[int, _Entry] = OrderedDict()
        self._lanes: dict[bool, OrderedDict[int, _Entry]] = {True: OrderedDict(), False: OrderedDict()}  # event?
        self._keys: set[Hashable] = set()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._depth = metrics.side_effect_queue_depth
        self._dropped_unlogged = 0  # drops since the last "queue full" line
        self._next_drop_log = float("-inf")

    # ---- producer side (request path: never blocks on I/O) ---------------------

    def submit(self, job: Job, delay: float = 0.0) -> bool:
        """Queue ``job`` to run after ``delay`` seconds; False if one with its key is waiting."""
        return self._push(job, delay, attempt=1)

    def _push(self, job: Job, delay: float, attempt: int) -> bool:
        with self._cond:
            if job.key in self._keys:
                return False
            event = job.kind == EVENT
            lane = self._lanes[event]
            if len(lane) >= (self.capacity if event else self.state_capacity):
                self._drop_oldest(lane)
            entry = _Entry(self.clock() + delay, next(self._seq), job, attempt)
            heapq.heappush(self._heap, entry)
            self._live[entry.seq] = entry
            lane[entry.seq] = entry
            self._keys.add(job.key)
            self._depth.set(len(self._live))
            if self._heap[0] is entry:  # due before what the worker waits for: wake it. Otherwise leave it asleep
                self._cond.notify()  # (a wake-up per submit costs the request path a GIL hand-over each time)
            return True

    def _drop_oldest(self, lane: OrderedDict[int, _Entry]) -> None:
        """Drop the lane's job submitted first (lowest sequence number), whatever its ready time: O(1), its heap
        entry becomes a tombstone."""
        seq, entry = lane.popitem(last=False)
        del self._live[seq]
        self._keys.discard(entry.job.key)
        if len(self._heap) > 2 * len(self._live) + 64:  # mostly tombstones: rebuild (amortised O(1) per drop)
            self._heap = [e for e in self._heap if e.seq in self._live]
            heapq.heapify(self._heap)
        self.metrics.side_effects_dropped_by(entry.job.kind).inc()
        # A queue that stays full drops on nearly every submit: say so at once, then at most every DROP_LOG_INTERVAL
        # with the count since the last line (a warning per drop was a burst of lines competing with the answers).
        self._dropped_unlogged += 1
        now = time.monotonic()
        if now >= self._next_drop_log:
            log.warning("side-effect queue full; dropped the oldest job", extra={
                "kind": entry.job.kind, "capacity": len(lane) + 1, "dropped": self._dropped_unlogged})
            self._dropped_unlogged, self._next_drop_log = 0, now + DROP_LOG_INTERVAL

    def _head(self) -> _Entry | None:
        """The live job with the earliest ready time (tombstones on top are discarded); None when empty."""
        heap = self._heap
        while heap:
            if heap[0].seq in self._live:
                return heap[0]
            heapq.heappop(heap)
        return None

    def __len__(self) -> int:
        return len(self._live)

    # ---- worker side -------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._work, name="side-effects", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> int:
        """Stop the worker after its current job; return how many queued jobs were abandoned."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._cond:
            abandoned = len(self._live)
            if abandoned:
                log.info("side-effect queue stopped with work pending", extra={"abandoned": abandoned})
            return abandoned

    def wait_idle(self, timeout: float, ready_only: bool = False) -> bool:
        """Wait until nothing is queued or running (tests and graceful shutdown);
        with ``ready_only``, jobs scheduled for later (held-back Events) do not count."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy or ((head := self._head()) is not None and (not ready_only or head.ready_at <= self.clock())):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    def run_once(self) -> bool:
        """Run the next job if one is ready now, in the caller's thread (tests, without
        ``start``); False when none is ready."""
        with self._cond:
            head = self._head()
            if head is None or head.ready_at > self.clock():
                return False
            entry = self._pop()
        self._run_and_release(entry)
        return True

    def _pop(self) -> _Entry:
        entry = heapq.heappop(self._heap)  # callers checked _head(): the top is live
        del self._live[entry.seq]
        del self._lanes[entry.job.kind == EVENT][entry.seq]
        self._keys.discard(entry.job.key)  # a new submit may queue it again meanwhile
        self._depth.set(len(self._live))
        self._busy = True
        return entry

    def _next(self) -> _Entry | None:
        with self._cond:
            while not self._stopping:
                if (head := self._head()) is not None:
                    wait = head.ready_at - self.clock()
                    if wait <= 0:
                        return self._pop()
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def _work(self) -> None:
        while (entry := self._next()) is not None:
            self._run_and_release(entry)

    def _run_and_release(self, entry: _Entry) -> None:
        try:
            self._run(entry)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _run(self, entry: _Entry) -> None:
        job = entry.job
        try:
            outcome = job.run()
        except Retry as e:
            if not isinstance(e, Later):
                self.metrics.side_effect_errors.labels(job.kind).inc()
            if entry.attempt >= self.max_attempts:
                self._give_up(job, entry.attempt, str(e))
                return
            delay = self.backoff.delay(entry.attempt, self.rand)
            log.info("side effect failed; will retry",
                     extra={"kind": job.kind, "attempt": entry.attempt, "retry_in_s": round(delay, 3), "error": str(e)})
            self._push(job, delay, entry.attempt + 1)  # no-op when a fresher job for the key is waiting
            return
        except Exception as e:  # a permanent failure, or a bug: never kill the worker
            self.metrics.side_effect_errors.labels(job.kind).inc()
            self._give_up(job, entry.attempt, f"{type(e).__name__}: {e}")
            return
        self.metrics.side_effects.labels(job.kind, outcome).inc()

    def _give_up(self, job: Job, attempts: int, error: str) -> None:
        self.metrics.side_effects.labels(job.kind, "failed").inc()
        log.warning("side effect failed; giving up", extra={"kind": job.kind, "attempts": attempts, "error": error})
