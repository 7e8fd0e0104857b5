"""ClusterStore keeps namespaced kinds per namespace (memory); its public behaviour must not notice."""

from __future__ import annotations

from app.cluster.store import ClusterStore
from app.domain.kinds import KUBEVIRT, NODE, POD, VMI, VMIM
from app.domain.records import (
    KubeVirtRecord,
    MigrationState,
    NodeRecord,
    VMIRecord,
    migration_from_object,
    pod_from_object,
)
from tests.fakeapi import objects as o


def _vmi(ns: str, name: str, node: str = "n1", evac: str = "", in_flight: bool = False) -> VMIRecord:
    state = MigrationState(True, 1.0, False, None, "m", node, "n2", False) if in_flight else None
    return VMIRecord(ns, name, f"uid-{name}", 0.0, node, evac, state)


def _vmim(ns: str, name: str, vmi: str, phase: str = "Succeeded", uid: str | None = None):
    return migration_from_object(o.vmim(ns, name, vmi, phase=phase, uid=uid or f"uid-{name}", start=10.0, end=20.0))


def test_upsert_query_delete_each_kind():
    s = ClusterStore()
    s.upsert(_vmi("a", "v1"))
    s.upsert(pod_from_object(o.launcher_pod("a", "v1", "n1", name="p1")))
    s.upsert(NodeRecord("n1", False))
    s.upsert(_vmim("a", "m1", "v1", phase="Running"))
    s.upsert(KubeVirtRecord("kubevirt", "kubevirt", parallel_outbound_per_node=1))
    assert s.vmi("a", "v1").name == "v1" and s.pod("a", "p1").vmi_name == "v1" and s.node("n1")
    assert s.kubevirt().effective_outbound_per_node == 1 and s.kubevirt().effective_per_cluster == 5
    assert [m.name for m in s.migrations("a", "v1")] == ["m1"] and s.unfinished_migration("uid-m1").name == "m1"
    assert s.counts() == {VMI: 1, VMIM: 1, POD: 1, NODE: 1, KUBEVIRT: 1}
    assert s.vmi("b", "v1") is None and s.pod("a", "nope") is None and s.migrations("b", "v1") == ()
    s.delete(POD, ("a", "p1"))
    s.delete(VMIM, ("a", "m1"))
    s.delete(VMI, ("a", "v1"))
    s.delete(NODE, "n1")
    s.delete(KUBEVIRT, ("kubevirt", "kubevirt"))
    s.delete(POD, ("a", "never-there"))
    assert s.counts() == {VMI: 0, VMIM: 0, POD: 0, NODE: 0, KUBEVIRT: 0} and s.kubevirt() is None
    assert s.unfinished_migration("uid-m1") is None and s.vmis() == [] and s.pods() == []


def test_a_vmim_that_changes_vmi_moves_between_indexes():
    s = ClusterStore()
    s.upsert(_vmim("a", "m1", "v1"))
    s.upsert(_vmim("a", "m1", "v2"))
    assert s.migrations("a", "v1") == () and [m.name for m in s.migrations("a", "v2")] == ["m1"]
    s.upsert(_vmim("a", "m1", "v2", phase="Running"))
    assert [m.phase for m in s.migrations("a", "v2")] == ["Running"]


def test_replace_drops_what_is_gone_and_rebuilds_indexes():
    s = ClusterStore()
    s.upsert(_vmi("a", "v1"))
    s.upsert(_vmi("b", "v2", evac="n1"))
    s.upsert(_vmim("a", "old", "v1", phase="Running"))
    s.replace(VMI, [_vmi("a", "v1", in_flight=True)])
    s.replace(VMIM, [_vmim("a", "new", "v1", phase="Running")])
    assert s.vmi("b", "v2") is None and [v.name for v in s.vmis()] == ["v1"]
    assert [m.name for m in s.migrations("a", "v1")] == ["new"] and s.unfinished_migration("uid-old") is None
    assert s.unfinished_migration("uid-new").name == "new"
    assert [v.name for v in s.leaving_candidates("n1")] == ["v1"]


def test_leaving_index_follows_updates_and_deletes():
    s = ClusterStore()
    s.upsert(_vmi("a", "v1", evac="n1"))
    s.upsert(_vmi("a", "v2"))
    s.upsert(_vmim("a", "m2", "v2", phase="Scheduling"))
    assert sorted(v.name for v in s.leaving_candidates("n1")) == ["v1", "v2"]
    s.upsert(_vmim("a", "m2", "v2", phase="Succeeded"))
    s.delete(VMI, ("a", "v1"))
    assert s.leaving_candidates("n1") == []
