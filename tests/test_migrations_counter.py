"""migrations_total{cause,outcome}: each VMIM counted once, when this process sees it finish."""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s

from app.cluster.informer import ClusterWatch
from app.cluster.migrations import MigrationCounter
from app.policy.cause import cause_of, describe_cause
from app.cluster.store import ClusterStore
from app.domain.records import migration_from_object
from app.metrics import Metrics
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

NS = "vms"
NOW = time.time()
METRIC = "kubevirt_eviction_guard_migrations_total"


def rec(name: str, phase: str, uid: str | None = None, **kw):
    return migration_from_object(o.vmim(NS, name, "db", phase=phase, uid=uid or f"uid-{name}", created=NOW - 100,
                                        start=NOW - 90 if phase != "Pending" else None,
                                        end=NOW - 10 if phase in ("Succeeded", "Failed") else None,
                                        source_node="node-a", target_node="node-b", **kw))


def count(metrics: Metrics, cause: str, outcome: str) -> float:
    return metrics.registry.get_sample_value(METRIC, {"cause": cause, "outcome": outcome}) or 0.0


@pytest.mark.parametrize(("kw", "cause"), [
    ({"priority": "system-maintenance", "evacuation_node": "node-a"}, "descheduler"),
    ({"priority": "system-critical", "evacuation_node": "node-a"}, "evacuation"),
    ({"priority": "user-triggered"}, "user"),
    ({"priority": "system-maintenance", "workload_update": True}, "workload-update"),
    ({"evacuation_node": "node-a"}, "evacuation"),  # no priority and no cause recorded by the guard
    ({"evacuation_node": "node-a", "cause": "descheduler"}, "descheduler"),  # recorded by the guard
    ({"evacuation_node": "node-a", "cause": "evacuation"}, "evacuation"),
    ({"evacuation_node": "node-a", "cause": "user"}, "evacuation"),  # only the two values the guard writes count
    ({"priority": "system-critical", "evacuation_node": "node-a", "cause": "descheduler"}, "evacuation"),
    ({}, "user"),  # created through the API: virtctl migrate, no priority before KubeVirt 1.9
    ({"cause": "descheduler"}, "user"),  # the guard's record counts on evacuations only
    ({"priority": "something-new"}, "unknown"),
])
def test_cause_from_priority_and_annotations(kw, cause):
    r = rec("m", "Succeeded", **kw)
    assert cause_of(r) == cause
    assert describe_cause(r).startswith(cause)
    if "priority" in kw:
        assert kw["priority"] in describe_cause(r)


def test_records_keep_priority_target_and_workload_update():
    r = rec("m", "Failed", priority="user-triggered", workload_update=True)
    assert (r.priority, r.target_node, r.source_node, bool(r.workload_update)) == ("user-triggered", "node-b", "node-a", True)


def test_store_counts_transitions_it_sees_not_what_it_finds():
    metrics = Metrics()
    store = ClusterStore()
    store.on_migration_finished = MigrationCounter(metrics)
    store.replace("vmim", [rec("old", "Succeeded", priority="system-maintenance"), rec("m1", "Running"),
                           rec("m2", "Pending"), rec("m3", "Scheduling")])
    assert count(metrics, "descheduler", "succeeded") == 0, "finished before we looked: not counted at start-up"
    store.upsert(rec("m1", "Running", priority="system-maintenance"))
    store.upsert(rec("m1", "Succeeded", priority="system-maintenance"))
    store.upsert(rec("m1", "Succeeded", priority="system-maintenance"))  # a repeat (resync): not again
    assert count(metrics, "descheduler", "succeeded") == 1
    # a relist after a broken watch: m2 finished meanwhile (counted), m1 and old are unchanged (not again)
    store.replace("vmim", [rec("old", "Succeeded", priority="system-maintenance"),
                           rec("m1", "Succeeded", priority="system-maintenance"),
                           rec("m2", "Failed", priority="system-critical"), rec("m3", "Scheduling")])
    assert count(metrics, "evacuation", "failed") == 1 and count(metrics, "descheduler", "succeeded") == 1
    # deleted and re-added with the same name but a new uid, already final: a different migration, never seen running
    store.delete("vmim", (NS, "m3"))
    store.upsert(rec("m3", "Succeeded", uid="uid-m3-again"))
    assert count(metrics, "unknown", "succeeded") == 0


def test_counter_counts_each_uid_once():
    metrics = Metrics()
    counter = MigrationCounter(metrics)
    r = rec("m", "Succeeded", priority="user-triggered")
    counter(r)
    counter(r)
    assert count(metrics, "user", "succeeded") == 1


@pytest.mark.timeout(60)
def test_live_watch_counts_once_across_a_relist_and_a_restart():
    with FakeApiServer(bookmark_interval=0.3) as api:
        api.put(o.vmi(NS, "db", node="node-a", uid="uid-db", created=NOW - 86400))
        api.put(o.vmim(NS, "done", "db", phase="Succeeded", uid="uid-done", created=NOW - 900, start=NOW - 800,
                       end=NOW - 700, source_node="node-b", target_node="node-a", priority="system-maintenance"))
        api.put(o.vmim(NS, "m1", "db", phase="Running", uid="uid-m1", created=NOW - 60, start=NOW - 50,
                       source_node="node-a", target_node="node-b", priority="system-maintenance"))
        kube = k8s.ApiClient(api.configuration())
        metrics = Metrics()
        watch = ClusterWatch(kube, metrics=metrics, stale_after=30).start()
        try:
            assert watch.wait_synced(10)
            assert count(metrics, "descheduler", "succeeded") == 0
            api.put(o.vmim(NS, "m1", "db", phase="Succeeded", uid="uid-m1", created=NOW - 60, start=NOW - 50,
                           end=NOW - 1, source_node="node-a", target_node="node-b", priority="system-maintenance"))
            deadline = time.monotonic() + 5
            while count(metrics, "descheduler", "succeeded") < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert count(metrics, "descheduler", "succeeded") == 1
            lists = len(api.requests_for("vmim", watch=False))
            api.compact(expire_watches=True)  # 410: the informer relists; nothing new finished
            while len(api.requests_for("vmim", watch=False)) == lists and time.monotonic() < deadline + 5:
                time.sleep(0.02)
            time.sleep(0.3)
            assert count(metrics, "descheduler", "succeeded") == 1, "a relist does not count again"
        finally:
            watch.stop()
        restarted = Metrics()  # a new process: finds both final, counts nothing
        again = ClusterWatch(kube, metrics=restarted, stale_after=30).start()
        try:
            assert again.wait_synced(10)
            assert count(restarted, "descheduler", "succeeded") == 0
        finally:
            again.stop()
            kube.close()
