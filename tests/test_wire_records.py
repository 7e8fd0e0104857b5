"""The watch's typed fast path (app/domain/wire.py) builds exactly the records the lenient dict path builds."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cluster.informer import SPECS
from app.domain import wire
from app.domain.kinds import POD, VMI, VMIM
from app.domain.records import (
    RecordError,
    migration_from_object,
    migration_from_wire,
    pod_from_object,
    pod_from_wire,
    vmi_from_object,
    vmi_from_wire,
)
from tests.fakeapi import objects as o

FIXTURES = Path(__file__).parent / "fixtures"
BY_KIND = {
    "VirtualMachineInstance": (wire.VMI, vmi_from_wire, vmi_from_object),
    "VirtualMachineInstanceMigration": (wire.VMIM, migration_from_wire, migration_from_object),
    "Pod": (wire.Pod, pod_from_wire, pod_from_object),
}


def _objects(value):
    if isinstance(value, dict):
        if isinstance(value.get("kind"), str) and value["kind"] in BY_KIND and isinstance(value.get("metadata"), dict):
            yield value
        for v in value.values():
            yield from _objects(v)
    elif isinstance(value, list):
        for v in value:
            yield from _objects(v)


def real_objects() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(FIXTURES.rglob("*.json")):
        for obj in _objects(json.loads(path.read_text())):
            found.append((f"{path.relative_to(FIXTURES)}:{obj['metadata'].get('name')}", obj))
    return found


REAL = real_objects()


def test_the_fixtures_hold_objects_of_every_typed_kind() -> None:
    kinds = {obj["kind"] for _, obj in REAL}
    assert kinds == set(BY_KIND), kinds


@pytest.mark.parametrize("where,obj", REAL, ids=[w for w, _ in REAL])
def test_real_objects_take_the_fast_path_and_give_the_same_record(where: str, obj: dict) -> None:
    shape, from_wire, from_object = BY_KIND[obj["kind"]]
    raw = orjson.dumps(obj)
    typed = msgspec.json.decode(raw, type=shape)  # a real object must fit the types: no fallback
    fast, careful = from_wire(typed), from_object(orjson.loads(raw))
    assert fast == careful, f"{where}:\n fast    {fast}\n careful {careful}"


def _odd_values():
    return st.one_of(st.none(), st.integers(-3, 3), st.booleans(), st.text(max_size=4), st.just(""),
                     st.just({}), st.just([]), st.just({"x": 1}), st.just("2026-01-01T00:00:00Z"),
                     st.just([{"type": "LiveMigratable", "status": "True"}]))


# where a field sits in the objects, and which of them the guard reads (the rest must not matter)
PATHS = [
    ("metadata", "name"), ("metadata", "namespace"), ("metadata", "uid"), ("metadata", "resourceVersion"),
    ("metadata", "creationTimestamp"), ("metadata", "annotations"), ("metadata", "labels"),
    ("metadata", "annotations", "descheduler.alpha.kubernetes.io/prefer-no-eviction"),
    ("metadata", "annotations", "kubevirt-eviction-guard.io/exempt"),
    ("metadata", "annotations", "kubevirt-eviction-guard.io/migration-cooldown"),
    ("metadata", "annotations", "kubevirt-eviction-guard.io/migration-history"),
    ("metadata", "annotations", "kubevirt.io/eviction-source"),
    ("metadata", "annotations", "kubevirt.io/evacuationMigration"),
    ("metadata", "annotations", "kubevirt.io/workloadUpdateMigration"),
    ("metadata", "annotations", "kubevirt.io/domain"),
    ("metadata", "annotations", "descheduler.alpha.kubernetes.io/eviction-in-progress"),
    ("metadata", "labels", "kubevirt.io"), ("metadata", "labels", "kubevirt.io/migrationJobUID"),
    ("spec",), ("spec", "evictionStrategy"), ("spec", "vmiName"), ("spec", "priority"), ("spec", "sendTo"),
    ("spec", "receive"), ("spec", "nodeName"), ("spec", "nodeSelector"),
    ("spec", "nodeSelector", "kubernetes.io/hostname"),
    ("spec", "affinity"), ("status",), ("status", "phase"), ("status", "nodeName"), ("status", "evacuationNodeName"),
    ("status", "conditions"), ("status", "migrationState"), ("status", "migrationState", "startTimestamp"),
    ("status", "migrationState", "endTimestamp"), ("status", "migrationState", "failed"),
    ("status", "migrationState", "sourceState"), ("status", "migrationState", "migrationUid"),
    ("status", "phaseTransitionTimestamps"),
]


def _set(obj: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        nxt = obj.get(key)
        if not isinstance(nxt, dict):
            return  # the parent itself was replaced by something else: nothing to set
        obj = nxt
    if value is _DROP:
        obj.pop(path[-1], None)
    else:
        obj[path[-1]] = copy.deepcopy(value)


_DROP = object()
SAMPLES = [obj for _, obj in REAL] + [
    o.vmi("ns", "vm-a", node="n1", migration=o.migration_state(1.79e9, None, "n1", "n2", "u1"), created=1.79e9),
    o.vmim("ns", "m", "vm-a", phase="Failed", start=1.79e9, end=1.79e9 + 5, source_node="n1", created=1.79e9),
    o.launcher_pod("ns", "vm-a", "n1", ready=True),
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(SAMPLES),
       changes=st.lists(st.tuples(st.sampled_from(PATHS), st.one_of(st.just(_DROP), _odd_values())), max_size=4))
def test_odd_objects_give_the_same_record_or_take_the_careful_path(base: dict, changes) -> None:
    obj = copy.deepcopy(base)
    for path, value in changes:
        _set(obj, path, value)
    shape, from_wire, from_object = BY_KIND[base["kind"]]
    raw = orjson.dumps(obj)
    try:
        careful = from_object(orjson.loads(raw))
    except RecordError:
        careful = None
    try:
        fast = from_wire(msgspec.json.decode(raw, type=shape))
    except wire.NotTheShape:
        return  # the informer reads these bytes the careful way (tested below)
    except RecordError:
        fast = None
    assert fast == careful, f"{obj}:\n fast    {fast}\n careful {careful}"


class _Recorder:
    def __init__(self) -> None:
        self.upserts: list = []
        self.deletes: list = []

    def upsert(self, record) -> None:
        self.upserts.append(record)

    def delete(self, kind, key) -> None:
        self.deletes.append((kind, key))


def _informer(kind: str):
    from app.cluster.informer import Informer
    from app.cluster.health import KindStatus

    return Informer(SPECS[kind], api=None, store=_Recorder(), status=KindStatus(kind))


@pytest.mark.parametrize("kind,good,bad", [
    (VMI, o.vmi("ns", "a", node="n1", created=1.79e9), o.vmi("ns", "b", node="n1")),
    (VMIM, o.vmim("ns", "a", "vm", start=1.79e9, end=1.79e9 + 1, source_node="n1"), o.vmim("ns", "b", "vm")),
    (POD, o.launcher_pod("ns", "vm-a", "n1"), o.launcher_pod("ns", "vm-b", "n2")),
])
def test_a_page_with_a_misfit_object_is_read_whole_the_careful_way(kind: str, good: dict, bad: dict) -> None:
    bad["status"]["phase"] = 5  # not a string: the typed decode refuses the page
    nameless = copy.deepcopy(good)
    del nameless["metadata"]["name"]
    page = orjson.dumps({"metadata": {"resourceVersion": "42", "continue": "tok"}, "items": [good, bad, nameless]})
    records: list = []
    rv, token, skipped = _informer(kind)._page(page, records)
    parse = SPECS[kind].parse
    assert (rv, token, skipped) == ("42", "tok", 1), (rv, token, skipped)
    assert records == [parse(good), parse(bad)], records


@pytest.mark.parametrize("kind,obj", [
    (VMI, o.vmi("ns", "a", node="n1", created=1.79e9)),
    (VMIM, o.vmim("ns", "a", "vm", start=1.79e9, source_node="n1", phase="Running")),
    (POD, o.launcher_pod("ns", "vm-a", "n1")),
])
def test_watch_events_give_the_same_records_both_ways_and_move_the_version(kind: str, obj: dict) -> None:
    inf = _informer(kind)
    obj["metadata"]["resourceVersion"] = "7"
    inf._event(orjson.dumps({"type": "MODIFIED", "object": obj}))
    misfit = copy.deepcopy(obj)
    misfit["metadata"]["resourceVersion"] = "8"
    misfit["status"]["phase"] = ["not", "a", "string"]
    inf._event(orjson.dumps({"type": "ADDED", "object": misfit}))
    nameless = copy.deepcopy(obj)
    nameless["metadata"] = {"resourceVersion": "9"}
    inf._event(orjson.dumps({"type": "MODIFIED", "object": nameless}))
    parse = SPECS[kind].parse
    assert inf.store.upserts == [parse(obj), parse(misfit)], inf.store.upserts
    assert inf.resource_version == "9", inf.resource_version
    inf._event(orjson.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "10"}}}))
    assert inf.resource_version == "10", inf.resource_version
    obj["metadata"]["resourceVersion"] = "11"
    inf._event(orjson.dumps({"type": "DELETED", "object": obj}))
    assert (inf.store.deletes, inf.resource_version) == ([(kind, parse(obj).key)], "11"), inf.store.deletes


def test_every_annotation_the_guard_writes_is_read_the_same_both_ways() -> None:
    """The guard's own annotations (the cause it records on an evacuation VMIM, its history on a VMI) are read by
    the typed path as by the careful one: a field missing from a wire type would drop them silently."""
    vmim = next(obj for _, obj in REAL if obj["kind"] == "VirtualMachineInstanceMigration")
    marked = {**vmim, "metadata": {**vmim["metadata"], "annotations": {
        **(vmim["metadata"].get("annotations") or {}), "kubevirt-eviction-guard.io/cause": "descheduler"}}}
    raw = orjson.dumps(marked)
    fast = migration_from_wire(msgspec.json.decode(raw, type=wire.VMIM))
    assert fast.recorded_cause == "descheduler" and fast == migration_from_object(orjson.loads(raw)), fast
