"""Projection of real objects into records, and the snapshot loader."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from app.cluster.snapshot import SnapshotError, load_snapshot
from app.cluster.store import ClusterStore
from app.domain.records import RecordError, migration_from_object, node_from_object, pod_from_object, vmi_from_object
from tests.builders import FIXTURES, node, pod, vmi, vmim

OBJ = FIXTURES / "objects"


def load(name: str) -> dict:
    return json.loads((OBJ / name).read_text())


def test_vmi_in_flight_fixture() -> None:
    r = vmi_from_object(load("vmi-migration-in-flight-evacuation.json"))
    assert (r.namespace, r.name, r.node, r.evacuation_node) == ("vms", "win2022-app-03", "worker-c", "worker-c")
    assert r.migration is not None and r.migration.in_flight and r.migration.source_node == "worker-c"
    assert r.migration.uid == "51c0a7e2-88d3-4e0f-a9b4-2d6e3c1f7a55"


def test_vmi_after_migration_fixture() -> None:
    r = vmi_from_object(load("vmi-running-after-migration.json"))
    assert r.migration is not None and r.migration.ended and not r.migration.in_flight and r.migration.end is not None


def test_vmims_fixtures() -> None:
    failed = migration_from_object(load("vmim-failed-evacuation.json"))
    assert failed.finished and failed.phase == "Failed" and failed.evacuation_node == "worker-a" and failed.vmi_name == "rhel9-db-01"
    assert failed.end is not None and failed.start is not None and failed.end - failed.start == 155
    assert migration_from_object(load("vmim-succeeded.json")).finished
    pending = migration_from_object(load("vmim-pending.json"))
    assert not pending.finished


def test_pod_fixtures() -> None:
    p = pod_from_object(load("pod-virt-launcher.json"))
    assert p.is_launcher and p.vmi_name and p.node and not p.eviction_in_progress and p.has_annotations
    target = pod_from_object(load("pod-virt-launcher-migration-target.json"))
    assert target.migration_job_uid == "51c0a7e2-88d3-4e0f-a9b4-2d6e3c1f7a55"
    assert pod_from_object(load("pod-virt-launcher-evacuating-source.json")).eviction_in_progress
    assert pod_from_object(load("pod-virt-launcher-migration-source-completed.json")).phase == "Succeeded"
    assert node_from_object(load("node-cordoned.json")).drain == "cordoned"


def test_kubevirt_apitesting_vmi_projects_small() -> None:
    raw = json.loads((FIXTURES / "kubevirt-apitesting" / "kubevirt.io.v1.VirtualMachineInstance.json").read_text())
    r = vmi_from_object(raw)
    assert r.name and r.migration is not None
    size = sys.getsizeof(r) + sys.getsizeof(r.migration)
    assert size < 1024


@pytest.mark.parametrize("bad", [None, [], "x", {"metadata": {}}, {"metadata": {"name": 3}}, {"metadata": "x"}])
def test_unidentifiable_objects_raise(bad) -> None:
    for parse in (vmi_from_object, migration_from_object, pod_from_object, node_from_object):
        with pytest.raises(RecordError):
            parse(bad)


def test_wrong_types_inside_become_empty() -> None:
    r = vmi_from_object({"metadata": {"name": "x", "namespace": 5, "creationTimestamp": 12}, "status": {"nodeName": ["a"], "migrationState": "no"}})
    assert (r.namespace, r.node, r.created, r.migration) == ("", "", None, None)


ITEMS = [node("worker-a"), vmi("db", "worker-a"), vmim("m1", "db", "Succeeded", 10), pod("db", "worker-a"),
         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "vms"}}]


PNE = "descheduler.alpha.kubernetes.io/prefer-no-eviction"


@pytest.mark.parametrize("annotations, prefer", [({PNE: ""}, True), ({PNE: "false"}, True), ({}, False), ({"other": "x"}, False)])
def test_prefer_no_eviction_is_the_key_present(annotations, prefer) -> None:
    # the descheduler's HaveNoEvictionAnnotation: `_, found := annotations[key]`
    assert vmi_from_object(vmi("db", "a", annotations=annotations)).prefer_no_eviction is prefer
    assert pod_from_object(pod("db", "a", annotations=annotations)).prefer_no_eviction is prefer


@pytest.mark.parametrize("annotations, exempt, exempt_ignored, cooldown, cooldown_ignored", [
    ({"kubevirt-eviction-guard.io/exempt": "true"}, True, "", None, ""),
    ({"kubevirt-eviction-guard.io/exempt": " TRUE "}, True, "", None, ""),
    ({"kubevirt-eviction-guard.io/exempt": "false"}, False, "", None, ""),
    ({"kubevirt-eviction-guard.io/exempt": "yes"}, False, "yes", None, ""),
    ({"kubevirt-eviction-guard.io/migration-cooldown": "1h30m"}, False, "", 5400, ""),
    ({"kubevirt-eviction-guard.io/migration-cooldown": "0"}, False, "", 0, ""),
    ({"kubevirt-eviction-guard.io/migration-cooldown": "90"}, False, "", None, "90"),
    ({"kubevirt-eviction-guard.io/migration-cooldown": "-5m"}, False, "", None, "-5m"),
    ({"kubevirt-eviction-guard.io/migration-cooldown": ""}, False, "", None, '""'),
    ({"kubevirt-eviction-guard.io/exempt": True, "kubevirt-eviction-guard.io/migration-cooldown": [[1]]}, False, "<bool>", None,
     "<list>"),  # annotations are strings; a snapshot file may say anything
])
def test_guard_overrides_are_parsed_and_bad_ones_kept_to_show(annotations, exempt, exempt_ignored, cooldown, cooldown_ignored):
    o = vmi_from_object(vmi("db", "a", annotations=annotations)).overrides
    assert o is not None
    assert (o.exempt, o.exempt_ignored, o.cooldown, o.cooldown_ignored) == (exempt, exempt_ignored, cooldown, cooldown_ignored)


def test_no_guard_annotations_no_overrides_object() -> None:
    assert vmi_from_object(vmi("db", "a", annotations={PNE: ""})).overrides is None
    assert vmi_from_object(vmi("db", "a")).overrides is None


@pytest.mark.parametrize("fmt", ["json-list", "yaml-list", "yaml-stream", "vmi-list-json"])
def test_snapshot_formats(tmp_path, fmt) -> None:
    f = tmp_path / "snap"
    lst = {"apiVersion": "v1", "kind": "List", "items": ITEMS}
    if fmt == "json-list":
        f.write_text(json.dumps(lst))
    elif fmt == "yaml-list":
        f.write_text(yaml.safe_dump(lst))
    elif fmt == "yaml-stream":
        f.write_text(yaml.safe_dump_all(ITEMS))
    else:
        f.write_text(json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceList", "items": [ITEMS[1]]}))
    store, stats = load_snapshot(f)
    assert store.vmi("vms", "db") is not None
    if fmt != "vmi-list-json":
        assert stats.loaded == {"vmi": 1, "vmim": 1, "pod": 1, "node": 1}
        assert stats.skipped_kinds == 1
        assert store.pod("vms", "virt-launcher-db-abcde") is not None and len(store.migrations("vms", "db")) == 1


def test_snapshot_skips_nameless_items(tmp_path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"kind": "List", "items": [{"kind": "Pod", "metadata": {}}, node("n1")]}))
    store, stats = load_snapshot(f)
    assert stats.skipped_malformed == 1 and store.node("n1") is not None


@pytest.mark.parametrize("content, problem", [
    ("kind: List\nitems: [\n", "not valid YAML or JSON at line"),
    ("- 1\n- 2\n", "item 1 is a int"),
    ("just a string\n", "is a str"),
    ("kind: List\nitems: 5\n", "'items' is not a list"),
    ("metadata: {name: x}\n", "has no 'kind'"),
    (b"\xff\xfe\x00bad", "not UTF-8"),
])
def test_malformed_snapshot_names_file_and_problem(tmp_path, content, problem) -> None:
    f = tmp_path / "broken.yaml"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SnapshotError) as e:
        load_snapshot(f)
    assert str(f) in str(e.value) and problem in str(e.value)


def test_missing_snapshot(tmp_path) -> None:
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot(tmp_path / "nope.yaml")


def test_demo_snapshot_loads() -> None:
    from pathlib import Path

    store, stats = load_snapshot(Path(__file__).resolve().parents[1] / "examples" / "demo-snapshot.yaml")
    assert stats.loaded["vmi"] >= 8 and stats.loaded["node"] == 4


def test_store_indexes_follow_updates() -> None:
    s = ClusterStore()
    s.upsert(vmi_from_object(vmi("web", "worker-a", evacuation="worker-a")))
    assert [v.name for v in s.leaving_candidates("worker-a")] == ["web"]
    s.upsert(vmi_from_object(vmi("web", "worker-b")))
    assert s.leaving_candidates("worker-a") == []
    s.upsert(migration_from_object(vmim("m1", "web", "Running", 1)))
    assert [v.name for v in s.leaving_candidates("worker-b")] == ["web"]
    assert s.unfinished_migration("uid-m1") is not None
    s.upsert(migration_from_object(vmim("m1", "web", "Succeeded", 1)))
    assert s.leaving_candidates("worker-b") == [] and len(s.migrations("vms", "web")) == 1
    assert s.unfinished_migration("uid-m1") is None  # finished: no longer a target's migration
    s.upsert(migration_from_object(vmim("m2", "web", "Pending", 1)))
    s.delete("vmim", ("vms", "m2"))
    s.delete("vmim", ("vms", "m1"))
    assert s.migrations("vms", "web") == () and s.unfinished_migration("uid-m2") is None
    s.replace("vmi", [])
    assert s.vmi("vms", "web") is None and s.counts()["vmi"] == 0
