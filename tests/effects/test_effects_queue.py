"""The background queue: never blocks the producer, bounded, keyed, retries with capped backoff."""

import threading

import pytest

from app.backoff import Backoff
from app.effects.queue import EffectQueue, Later, Retry
from app.metrics import Metrics
from tests.effects.support import FakeClock


class Job:
    def __init__(self, key, kind="annotation", script=(), gate: threading.Event | None = None):
        self.key = key
        self.kind = kind
        self.script = list(script)  # exceptions to raise, in order, before succeeding
        self.gate = gate
        self.runs = 0

    def run(self):
        self.runs += 1
        if self.gate is not None:
            self.gate.wait(10)
        if self.script:
            raise self.script.pop(0)
        return "applied"


def sample(metrics: Metrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value("kubevirt_eviction_guard_" + name, labels)
    return value or 0.0


def test_submit_returns_while_a_job_hangs_and_the_worker_runs_the_rest_later():
    gate = threading.Event()
    q = EffectQueue(Metrics())
    q.start()
    try:
        hanging = Job("a", gate=gate)
        q.submit(hanging)
        for i in range(50):
            q.submit(Job(("b", i)))
        # the producer never waits for the worker: the 50 are in while the first still hangs (a submit that waited
        # would return only once the gate timed out and the queue had run dry)
        assert not q.wait_idle(0.2)
        gate.set()
        assert q.wait_idle(5)
        assert hanging.runs == 1
    finally:
        gate.set()
        q.stop()


def test_equal_keys_are_queued_once():
    clock = FakeClock()
    q = EffectQueue(Metrics(), clock=clock)
    first, second = Job("same"), Job("same")
    assert q.submit(first) is True
    assert q.submit(second) is False
    assert q.run_once() and not q.run_once()
    assert (first.runs, second.runs) == (1, 0)
    assert q.submit(second) is True  # once run, the key may be queued again


def test_a_full_lane_drops_its_own_oldest_job_and_counts_it():
    m = Metrics()
    q = EffectQueue(m, capacity=3, clock=FakeClock(), state_capacity=3)
    jobs = [Job(i, kind="annotation") for i in range(5)]
    for j in jobs:
        q.submit(j)
    assert len(q) == 3
    while q.run_once():
        pass
    assert [j.runs for j in jobs] == [0, 0, 1, 1, 1]
    assert sample(m, "side_effects_dropped_total", kind="annotation") == 2


def test_an_event_flood_drops_only_events():
    m = Metrics()
    q = EffectQueue(m, capacity=10, clock=FakeClock())
    kept = [Job(("a", i), kind="annotation") for i in range(5)] + [Job(("h", i), kind="history") for i in range(5)]
    for i, j in enumerate(kept):
        q.submit(j)
        for k in range(1000):
            q.submit(Job((i, k), kind="event"))
    while q.run_once():
        pass
    assert all(j.runs == 1 for j in kept)
    assert sample(m, "side_effects_dropped_total", kind="event") == 10 * 1000 - 10
    assert sample(m, "side_effects_dropped_total", kind="annotation") == 0


def test_delayed_job_waits_for_its_time():
    clock = FakeClock()
    q = EffectQueue(Metrics(), clock=clock)
    j = Job("later")
    q.submit(j, delay=30)
    assert not q.run_once()
    clock.advance(30)
    assert q.run_once() and j.runs == 1


def test_transient_failures_are_retried_with_growing_capped_backoff():
    clock, m = FakeClock(), Metrics()
    q = EffectQueue(m, max_attempts=5, backoff=Backoff(base=1, cap=3), clock=clock, rand=lambda: 1.0)
    j = Job("flaky", script=[Retry("503")] * 3)
    q.submit(j)
    waits = []
    while j.runs < 4:
        if not q.run_once():
            clock.advance(0.5)
            waits.append(clock.t)
    assert q.run_once() is False and len(q) == 0
    # attempt 1 fails -> 1s, attempt 2 -> 2s, attempt 3 -> min(4, cap 3) = 3s
    assert len(waits) == (1 + 2 + 3) * 2
    assert sample(m, "side_effect_errors_total", kind="annotation") == 3
    assert sample(m, "side_effects_total", kind="annotation", outcome="applied") == 1


def test_gives_up_after_max_attempts_and_counts_the_failure():
    clock, m = FakeClock(), Metrics()
    q = EffectQueue(m, max_attempts=3, backoff=Backoff(base=1, cap=1), clock=clock, rand=lambda: 1.0)
    j = Job("down", kind="event", script=[Retry("refused")] * 10)
    q.submit(j)
    for _ in range(10):
        q.run_once()
        clock.advance(1)
    assert j.runs == 3 and len(q) == 0
    assert sample(m, "side_effect_errors_total", kind="event") == 3
    assert sample(m, "side_effects_total", kind="event", outcome="failed") == 1


def test_a_permanent_error_is_not_retried_and_does_not_kill_the_worker():
    m = Metrics()
    q = EffectQueue(m)
    q.start()
    try:
        bad, good = Job("bad", script=[PermissionError("403 Forbidden")]), Job("good")
        q.submit(bad)
        q.submit(good)
        assert q.wait_idle(5)
        assert (bad.runs, good.runs) == (1, 1)
        assert sample(m, "side_effects_total", kind="annotation", outcome="failed") == 1
    finally:
        q.stop()


@pytest.mark.parametrize("attempt,ceiling", [(1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (40, 30.0)])
def test_backoff_is_full_jitter_under_a_capped_exponential(attempt, ceiling):
    b = Backoff(base=0.5, cap=30)
    assert b.delay(attempt, rand=lambda: 1.0) == ceiling
    assert b.delay(attempt, rand=lambda: 0.0) == 0.0
    assert 0 <= b.delay(attempt) <= ceiling


def test_stop_reports_abandoned_work():
    q = EffectQueue(Metrics(), clock=FakeClock())
    q.start()
    q.submit(Job("x"), delay=3600)
    assert q.stop(timeout=2) == 1


def test_waiting_is_retried_but_not_counted_as_an_error():
    clock, m = FakeClock(), Metrics()
    q = EffectQueue(m, backoff=Backoff(base=1, cap=1), clock=clock, rand=lambda: 1.0)
    j = Job("waits", script=[Later("store behind")])
    q.submit(j)
    q.run_once()
    clock.advance(1)
    assert q.run_once() and j.runs == 2
    assert sample(m, "side_effect_errors_total", kind="annotation") == 0
    assert sample(m, "side_effects_total", kind="annotation", outcome="applied") == 1


def test_a_queue_kept_full_keeps_the_newest_jobs_in_ready_order_and_stays_bounded():
    """Dropping the oldest is O(1) (the heap keeps tombstones); many drops must neither lose live jobs,
    nor run a dropped one, nor let the tombstones pile up."""
    clock, m = FakeClock(), Metrics()
    q = EffectQueue(m, capacity=5, clock=clock, state_capacity=5)
    jobs = [Job(i) for i in range(1000)]
    for i, j in enumerate(jobs):
        q.submit(j, delay=(1000 - i) % 7)  # ready times out of submission order
    assert len(q) == 5 and len(q._heap) <= 2 * 5 + 64 + 1
    clock.advance(10)
    ran = []
    while q.run_once():
        ran.append(next(i for i, j in enumerate(jobs) if j.runs == 1 and i not in ran))
    assert ran == [999, 998, 997, 996, 995]  # ready 1s, 2s, ... after submission
    assert sum(j.runs for j in jobs) == 5
    assert sample(m, "side_effects_dropped_total", kind="annotation") == 995
    assert sample(m, "side_effect_queue_depth") == 0


def test_a_queue_that_stays_full_warns_once_with_a_count_not_once_per_drop(caplog):
    m = Metrics()
    q = EffectQueue(m, capacity=2, clock=FakeClock(), state_capacity=2)
    with caplog.at_level("WARNING", logger="kubevirt_eviction_guard.effects"):
        for i in range(102):
            q.submit(Job(i))
    lines = [r for r in caplog.records if "queue full" in r.getMessage()]
    assert len(lines) == 1 and lines[0].dropped == 1 and lines[0].capacity == 2
    assert sample(m, "side_effects_dropped_total", kind="annotation") == 100  # the metric counts every drop
