"""KubeVirt 1.9's objects (tests/fixtures/kubevirt-1.9) as the guard reads them, and the decisions they lead to."""

from __future__ import annotations

import json

import pytest

from app.cluster.snapshot import load_snapshot
from app.domain.descheduler import NODE_LIMIT_FROM_PROFILE, descheduler_from_object, node_limit_mismatch
from app.domain.records import (
    RECEIVE,
    SEND_TO,
    kubevirt_from_object,
    migration_from_object,
    pinned_node,
    pod_from_object,
    vmi_from_object,
)
from app.policy import EvictionAttempt, PolicySettings, decide
from app.policy.decide import not_migratable, stuck_evacuation
from app.timefmt import parse_timestamp
from tests.builders import FIXTURES, node, pod

K19 = FIXTURES / "kubevirt-1.9"
NOW = parse_timestamp("2026-11-21T12:00:00Z")


def load(name: str) -> dict:
    return json.loads((K19 / name).read_text())


def test_decentralized_vmims_name_their_side():
    assert migration_from_object(load("vmim-decentralized-source.json")).decentralized == SEND_TO
    target = migration_from_object(load("vmim-decentralized-target.json"))
    assert target.decentralized == RECEIVE and target.arriving and not target.finished
    both = load("vmim-decentralized-source.json")
    both["spec"]["receive"] = {"migrationID": "x"}
    assert migration_from_object(both).decentralized == ""  # KubeVirt's IsDecentralized: exactly one side


def test_the_arrived_vmi_knows_it_arrived():
    rec = vmi_from_object(load("vmi-decentralized-arrived.json"))
    assert rec.migration.source_vmi_uid == "c7d1e9a2-5b4f-4e3a-8c6d-3f2a1b0e9d84" != rec.uid


@pytest.mark.parametrize("name, kind, reason", [
    ("vmim-blocked-by-backup.json", "migrationBlockedByBackup",
     "BackupInProgress: Waiting for backup rhel9-db-02-nightly to complete"),
    ("vmim-rejected-by-resource-quota.json", "migrationRejectedByResourceQuota", ""),
    ("vmim-blocked-by-utility-volumes.json", "migrationBlockedByUtilityVolumes",
     "UtilityVolumesPresent: Migration is waiting for utility volumes to detach. Will timeout in 179 seconds."),
    ("vmim-decentralized-blocked.json", "decentralizedMigrationBlocked",
     "DecentralizedNotLiveMigratable: waiting for incoming synchronization, unable to proceed"),
])
def test_blocking_conditions(name, kind, reason):
    m = migration_from_object(load(name))
    assert (m.blocked, m.blocked_reason) == (kind, reason)


def test_a_backup_blocked_evacuation_is_waiting_never_stuck(tmp_path):
    """Three failed attempts before it, and 40 minutes of waiting: still not stuck, and never cancelled."""
    vmim = load("vmim-blocked-by-backup.json")
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "rhel9-db-02", "namespace": "vms", "uid": "u-db02", "creationTimestamp": "2026-11-01T00:00:00Z",
                        "annotations": {"kubevirt.io/eviction-source": "descheduler"}},
           "status": {"phase": "Running", "nodeName": "worker-b", "evacuationNodeName": "worker-b"}}
    failed = []
    for i in range(3):
        f = json.loads(json.dumps(vmim))
        f["metadata"].update(name=f"kubevirt-evacuation-f{i}", uid=f"u-f{i}", creationTimestamp=f"2026-11-21T11:0{i}:00Z")
        f["status"] = {"phase": "Failed", "migrationState": {"migrationUid": f"u-f{i}", "sourceNode": "worker-b",
                       "startTimestamp": f"2026-11-21T11:0{i}:10Z", "endTimestamp": f"2026-11-21T11:0{i}:50Z",
                       "failed": True}}
        failed.append(f)
    snap = tmp_path / "s.json"
    snap.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        node("worker-a"), node("worker-b"), vmi, vmim, *failed, pod("rhel9-db-02", "worker-b")]}))
    store, _ = load_snapshot(snap)
    rec = store.vmi("vms", "rhel9-db-02")
    assert stuck_evacuation(rec, store.migrations("vms", "rhel9-db-02"), store.node("worker-b"), NOW,
                            PolicySettings()) is None
    req = EvictionAttempt("CREATE", "pods", "eviction", "vms", "virt-launcher-rhel9-db-02-abcde",
                          requested_by="sigs.k8s.io/descheduler")
    d = decide(req, store, NOW, PolicySettings())
    assert d.reason == "migration_in_progress" and "waiting: migrationBlockedByBackup" in d.message
    assert "Waiting for backup rhel9-db-02-nightly to complete" in d.message


def test_not_live_migratable_vmi():
    rec = vmi_from_object(load("vmi-not-live-migratable.json"))
    assert (rec.eviction_strategy, rec.migratable) == ("LiveMigrateIfPossible", "False")
    assert rec.migratable_reason.startswith("DisksNotLiveMigratable: cannot migrate VMI: PVC rhel9-legacy-03-root")
    assert "DisksNotLiveMigratable" in not_migratable(rec, None)


def test_kubevirt_cr_and_kubedescheduler_as_openshift_installs_them():
    kv = kubevirt_from_object(load("kubevirt-cr-hco.json"))
    assert (kv.effective_outbound_per_node, kv.effective_per_cluster, kv.effective_eviction_strategy) == (1, 5,
                                                                                                          "LiveMigrate")
    d = descheduler_from_object(load("kubedescheduler-kubevirt-profile.json"))
    assert (d.eviction_limit_node, d.eviction_limit_node_from, d.eviction_limit_total) == (2, NODE_LIMIT_FROM_PROFILE, 5)
    assert node_limit_mismatch(d, kv.effective_outbound_per_node) is True  # 2 may leave, KubeVirt moves 1


def test_pinned_launcher_pod():
    p = pod_from_object(load("pod-virt-launcher-pinned.json"))
    assert p.pinned_to == "worker-c"
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["worker-c"]}]}
    assert pinned_node({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term, {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                       "values": ["worker-c"]}]}]}}}}) == "worker-c"
    two = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a", "b"]}]}
    assert pinned_node({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [two]}}}}) == ""  # two nodes allowed: not pinned
    other = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["worker-d"]}]}
    assert pinned_node({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term, other]}}}}) == ""  # either of two nodes
    assert pinned_node({"nodeSelector": {"kubevirt.io/schedulable": "true"}}) == ""


def test_snapshot_reads_the_kubevirt_cr_and_the_kubedescheduler(tmp_path):
    snap = tmp_path / "s.json"
    snap.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        load("kubevirt-cr-hco.json"), load("kubedescheduler-kubevirt-profile.json")]}))
    store, stats = load_snapshot(snap)
    assert store.kubevirt().effective_outbound_per_node == 1 and store.descheduler().eviction_limit_node == 2
    assert (stats.loaded["kubevirt"], stats.loaded["kubedescheduler"]) == (1, 1)


# ---- report and explain on them ----------------------------------------------------------------


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    from app.cli import main

    code = main(["--log-level", "warning", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def openshift_snapshot(tmp_path) -> str:
    """OpenShift Virtualization's KubeVirt CR and KubeDescheduler, a pinned VM, a VM that cannot live-migrate,
    and a node held for 70 minutes by a descheduler-caused evacuation that keeps failing."""
    from tests.builders import failing_evacuation, vmi

    legacy = load("vmi-not-live-migratable.json")
    pinned = load("pod-virt-launcher-pinned.json")
    items = [
        node("worker-a"), node("worker-b"), node("worker-c"),
        load("kubevirt-cr-hco.json"), load("kubedescheduler-kubevirt-profile.json"),
        legacy, pod("rhel9-legacy-03", "worker-b", name="virt-launcher-rhel9-legacy-03-abcde"),
        vmi("rhel9-db-05", "worker-c"), pinned,
        vmi("stuck", "worker-a", evacuation="worker-a", annotations={"kubevirt.io/eviction-source": "descheduler"}),
        pod("stuck", "worker-a"), *failing_evacuation("stuck", "worker-a", 3, first=70),
        vmi("beside", "worker-a"), pod("beside", "worker-a"),
    ]
    path = tmp_path / "openshift.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


def test_report_json_shows_the_kubevirt_limits_the_mismatch_pinned_and_not_migratable_vms(capsys, tmp_path):
    snap = openshift_snapshot(tmp_path)
    code, out, err = cli(capsys, "report", "-o", "json", "--snapshot", snap, "--now", "2026-11-21T12:00:00Z")
    assert (code, err) == (0, "")
    m = json.loads(out)
    assert list(m)[:3] == ["cluster", "warnings", "vmis"]
    assert m["cluster"]["kubevirt"] == {
        "object": "openshift-cnv/kubevirt-kubevirt-hyperconverged", "parallelOutboundMigrationsPerNode": 1,
        "parallelMigrationsPerCluster": 5, "evictionStrategy": "LiveMigrate", "defaulted": []}
    ds = m["cluster"]["descheduler"]
    assert (ds["object"], ds["evictionLimitNode"], ds["evictionLimitTotal"]) == (
        "openshift-kube-descheduler-operator/cluster", 2, 5)
    assert "LowNodeUtilization's evictionLimits.node" in ds["evictionLimitNodeFrom"]
    reasons = {w["reason"]: w["message"] for w in m["warnings"]}
    assert set(reasons) == {"descheduler_node_limit_above_kubevirt", "node_held", "pinned"}
    assert "parallelOutboundMigrationsPerNode 1" in reasons["descheduler_node_limit_above_kubevirt"]
    assert 'node "worker-a" has been held for 1h10m0s' in reasons["node_held"]
    assert "virtctl evacuate-cancel vmi stuck -n vms" in reasons["node_held"]
    assert "vms/rhel9-db-05" in reasons["pinned"]
    rows = {r["name"]: r for r in m["vmis"]}
    assert (rows["rhel9-db-05"]["pinned"], "pinned=worker-c" in rows["rhel9-db-05"]["notes"]) == ("worker-c", True)
    legacy = rows["rhel9-legacy-03"]
    assert (legacy["state"], legacy["reason"]) == ("not-migratable", "not_migratable")
    assert legacy["notMigratable"].startswith("LiveMigratable False: DisksNotLiveMigratable")
    assert (rows["beside"]["state"], rows["stuck"]["state"]) == ("node-busy", "evacuation-stuck")
    code, text, _ = cli(capsys, "report", "--snapshot", snap, "--now", "2026-11-21T12:00:00Z")
    assert "KubeVirt openshift-cnv/kubevirt-kubevirt-hyperconverged: parallelOutboundMigrationsPerNode 1" in text
    assert "warning: the descheduler lets more VMs leave a node per cycle" in text


def test_explain_names_the_condition_the_held_node_and_its_fix(capsys, tmp_path):
    snap = openshift_snapshot(tmp_path)
    args = ("--snapshot", snap, "--now", "2026-11-21T12:00:00Z")
    code, out, _ = cli(capsys, "explain", "-n", "vms", "--pod", "virt-launcher-rhel9-legacy-03-abcde", *args)
    assert code == 1 and "reason: not_migratable" in out
    assert "migrate:  LiveMigratable=False (DisksNotLiveMigratable: cannot migrate VMI" in out
    assert "NOT MIGRATABLE" in out
    code, out, _ = cli(capsys, "explain", "-o", "json", "-n", "vms", "--pod", "virt-launcher-beside-abcde", *args)
    m = json.loads(out)
    assert (code, m["reason"]) == (1, "node_busy")
    assert m["leaving"]["vmis"][0]["state"].startswith("stuck: 3 failed attempts")
    assert m["leaving"]["heldFor"] == 4200 and "virtctl evacuate-cancel vmi stuck -n vms" in m["leaving"]["fix"][0]
    code, out, _ = cli(capsys, "explain", "-n", "vms", "--pod", "virt-launcher-rhel9-db-05-m2x8q", *args)
    assert "pinned=worker-c" in out
