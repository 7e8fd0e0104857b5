"""What the canceller may cancel (app.policy.cancel): pure, on the store, like the decision table."""

from __future__ import annotations

from app.policy import PolicySettings
from app.policy.cancel import evacuations_to_cancel
from tests.builders import NOW, condition, failing_evacuation, node, pod, store_of, vmi, vmim

SRC = {"kubevirt.io/eviction-source": "descheduler"}
DEFAULTS = PolicySettings()


def to_cancel(*objects, settings=DEFAULTS) -> list[str]:
    store = store_of(node("worker-a"), node("worker-b"), node("worker-c", cordoned=True),
                     node("worker-d", taints=("ToBeDeletedByClusterAutoscaler",)), *objects)
    return [s.name for s in evacuations_to_cancel(store.vmis(), store, NOW, settings)]


def test_a_stuck_descheduler_evacuation_is_cancelled():
    assert to_cancel(vmi("db", "worker-a", evacuation="worker-a", annotations=SRC), pod("db", "worker-a"),
                     *failing_evacuation("db", "worker-a", 3)) == ["db"]


def test_never_a_drain_nor_what_is_not_stuck():
    cases = {
        "two failures": [vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
                         *failing_evacuation("db", "worker-a", 2)],
        "a drain's VMIMs": [vmi("db", "worker-a", evacuation="worker-a"),
                            *failing_evacuation("db", "worker-a", 3, priority="system-critical")],
        "cordoned node": [vmi("db", "worker-c", evacuation="worker-c", annotations=SRC),
                          *failing_evacuation("db", "worker-c", 3)],
        "autoscaler taint": [vmi("db", "worker-d", evacuation="worker-d", annotations=SRC),
                             *failing_evacuation("db", "worker-d", 3)],
        "node unknown": [vmi("db", "worker-x", evacuation="worker-x", annotations=SRC),
                         *failing_evacuation("db", "worker-x", 3)],
        "system-critical VMIM queued": [vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
                                        *failing_evacuation("db", "worker-a", 3),
                                        vmim("admin", "db", "Pending", 1, priority="system-critical")],
        "not marked, only a retry left (nothing to cancel)": [vmi("db", "worker-a", annotations=SRC),
                                                              *failing_evacuation("db", "worker-a", 3, running=True)],
        "waiting for a backup (blocked is not stuck)": [
            vmi("db", "worker-a", evacuation="worker-a", annotations=SRC), *failing_evacuation("db", "worker-a", 3),
            vmim("db-b", "db", "Pending", 1, evacuation="worker-a", priority="system-maintenance",
                 conditions=[condition("migrationBlockedByBackup", "BackupInProgress", "Waiting for backup b to complete")])],
        "rejected by resource quota for 90 minutes": [
            vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
            vmim("db-q", "db", "Pending", 90, evacuation="worker-a", priority="system-maintenance",
                 conditions=[condition("migrationRejectedByResourceQuota")])],
    }
    for what, objects in cases.items():
        assert to_cancel(*objects) == [], what


def test_age_alone_makes_it_stuck_when_the_count_is_off():
    objects = [vmi("db", "worker-a", evacuation="worker-a", annotations=SRC), *failing_evacuation("db", "worker-a", 1,
                                                                                                  first=70)]
    assert to_cancel(*objects, settings=PolicySettings(evacuation_stale_after_failures=0)) == ["db"]
    assert to_cancel(*objects, settings=PolicySettings(evacuation_stale_after=2 * 3600)) == []
