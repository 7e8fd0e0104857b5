"""Evacuations that keep failing, whatever caused them: shown (gauge, Event with the count, age and the fix),
never cancelled by the guard unless the descheduler caused them."""

from __future__ import annotations

import pytest

from app.effects.failing import EVENT_REASON, FailingEvacuationWatch
from app.metrics import Metrics
from app.policy import PolicySettings
from app.policy.cancel import evacuations_to_cancel
from app.policy.failing import failing_evacuation
from tests.builders import NOW, NS, condition, failing_evacuation as attempts, node, store_of, vmi, vmim

SRC = {"kubevirt.io/eviction-source": "descheduler"}
S = PolicySettings(evacuation_stale_after_failures=2)


def failing(*objects, settings: PolicySettings = S):
    store = store_of(*objects)
    v = store.vmi(NS, "db")
    src = v.evacuation_node or "worker-a"
    return failing_evacuation(v, store.migrations(NS, "db"), store.node(src), NOW, settings)


@pytest.mark.parametrize(("row", "objects", "cause", "guard_cancels"), [
    ("a drain's (node cordoned), KubeVirt 1.9 priority", [node("worker-a", cordoned=True),
                                                          vmi("db", "worker-a", evacuation="worker-a"),
                                                          *attempts("db", "worker-a", 2, priority="system-critical")],
     "evacuation", False),
    ("a drain's, KubeVirt 1.8 defaults (no priority, no eviction source)",
     [node("worker-a", cordoned=True), vmi("db", "worker-a", evacuation="worker-a"),
      *attempts("db", "worker-a", 3, priority=None)], "evacuation", False),
    ("an admin's eviction, node not cordoned", [node("worker-a"), vmi("db", "worker-a", evacuation="worker-a"),
                                                *attempts("db", "worker-a", 2, priority=None)], "evacuation", False),
    ("the descheduler's", [node("worker-a"), vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
                           *attempts("db", "worker-a", 2, priority=None)], "descheduler", True),
])
def test_failing_evacuations_of_every_cause_are_found(row, objects, cause, guard_cancels):
    f = failing(*objects)
    assert f is not None, row
    assert (f.cause, f.cancelled_by_guard, f.failures, f.node) == (cause, guard_cancels, len(
        [o for o in objects if o["kind"] == "VirtualMachineInstanceMigration"]), "worker-a"), row
    text = f.message()
    assert f"failed {f.failures} time(s)" in text and "virtctl evacuate-cancel vmi db -n vms" in text, text
    # the canceller's own rule agrees: it cancels only the descheduler's
    store = store_of(*objects)
    assert bool(evacuations_to_cancel(store.vmis(), store, NOW, S)) is guard_cancels, row


@pytest.mark.parametrize(("row", "objects"), [
    ("one failure, below evacuationStaleAfterFailures", [vmi("db", "worker-a", evacuation="worker-a"),
                                                         *attempts("db", "worker-a", 1, priority=None)]),
    ("marked, no failure yet", [vmi("db", "worker-a", evacuation="worker-a")]),
    ("failures, but the evacuation is over (not marked, nothing queued)", [vmi("db", "worker-a"),
                                                                            *attempts("db", "worker-a", 3)]),
    ("waiting on a KubeVirt condition is not failing", [
        vmi("db", "worker-a", evacuation="worker-a"), *attempts("db", "worker-a", 2, priority=None),
        vmim("held", "db", "Pending", 1, evacuation="worker-a",
             conditions=[condition("migrationBlockedByBackup", "BackupInProgress", "nightly")])]),
])
def test_not_failing(row, objects):
    assert failing(node("worker-a"), *objects) is None, row


def test_one_failure_counts_once_the_evacuation_is_older_than_stale_after():
    objs = [node("worker-a"), vmi("db", "worker-a", evacuation="worker-a"), *attempts("db", "worker-a", 1, priority=None)]
    assert failing(*objs, settings=PolicySettings(evacuation_stale_after_failures=0, evacuation_stale_after=60)) \
        is not None
    assert failing(*objs, settings=PolicySettings(evacuation_stale_after_failures=0, evacuation_stale_after=7200)) \
        is None


class _Api:
    def __init__(self):
        self.events = []

    def create_event(self, namespace, event):
        self.events.append(event)


class _Queue:
    def submit(self, job, delay=0.0):
        job.run()
        return True


def sample(metrics: Metrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(f"kubevirt_eviction_guard_{name}", labels) or 0.0


def test_watch_sets_the_gauge_and_writes_one_event_per_failure_count():
    store = store_of(node("worker-a", cordoned=True), vmi("db", "worker-a", evacuation="worker-a"),
                     *attempts("db", "worker-a", 2, priority=None), vmi("calm", "worker-b"))
    api, metrics = _Api(), Metrics()
    watch = FailingEvacuationWatch(store, api, _Queue(), metrics, S, clock=lambda: NOW)
    assert watch.scan() == 1 and watch.scan() == 0  # told once per failure count
    assert sample(metrics, "failing_evacuations", cause="evacuation") == 1
    assert sample(metrics, "failing_evacuations", cause="descheduler") == 0
    assert sample(metrics, "failing_evacuation_oldest_seconds") > 0
    (event,) = api.events
    assert event["reason"] == EVENT_REASON and event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "db" and "failed 2 time(s)" in event["message"], event
    assert "never cancels" in event["message"]
    # a third failure: told again
    watch.view = store_of(node("worker-a", cordoned=True), vmi("db", "worker-a", evacuation="worker-a"),
                          *attempts("db", "worker-a", 3, priority=None))
    assert watch.scan() == 1 and "failed 3 time(s)" in api.events[-1]["message"]
    # over: the gauge goes back to 0
    watch.view = store_of(vmi("db", "worker-b"), *attempts("db", "worker-a", 3, priority=None))
    assert watch.scan() == 0 and sample(metrics, "failing_evacuations", cause="evacuation") == 0
