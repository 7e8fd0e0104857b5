"""``report``'s migration history: why each VM moved, from VMIMs and the VMI's migrationState."""

from __future__ import annotations

from app.cluster.store import ClusterStore
from app.domain.records import migration_from_object, vmi_from_object
from app.inspect import migration_history
from app.inspect.report import history_row, history_text
from tests.fakeapi import objects as o

NS = "vms"
NOW = 1_800_000_000.0


def store_with(vmi: dict, *vmims: dict) -> ClusterStore:
    store = ClusterStore()
    store.replace("vmi", [vmi_from_object(vmi)])
    store.replace("vmim", [migration_from_object(m) for m in vmims])
    return store


def mig(name: str, ended_ago: float | None, phase: str = "Succeeded", **kw) -> dict:
    start = NOW - (ended_ago or 0) - 300
    return o.vmim(NS, name, "db", phase=phase, uid=f"uid-{name}", created=start - 10, start=start,
                  end=NOW - ended_ago if ended_ago is not None else None, **kw)


def test_each_migration_with_its_cause_annotations_route_and_outcome():
    store = store_with(
        o.vmi(NS, "db", node="node-c", uid="uid-db",
              migration=o.migration_state(start=NOW - 100, source_node="node-b", target_node="node-c", uid="uid-m4")),
        mig("m1", 40_000, priority="system-critical", evacuation_node="node-a", source_node="node-a", target_node="node-b"),
        mig("m2", 30_000, phase="Failed", priority="system-maintenance", evacuation_node="node-b",
            source_node="node-b", target_node="node-a"),
        mig("m3", 20_000, priority="user-triggered", source_node="node-b", target_node="node-c"),
        mig("m3b", 10_000, priority="system-maintenance", workload_update=True, source_node="node-c",
            target_node="node-b"),
        mig("m4", None, phase="Running", priority="system-maintenance", evacuation_node="node-b"),
    )
    rows = [history_row(h) for h in migration_history(store, store.vmi(NS, "db"))]
    # newest first: the running one, then by end time
    assert [r[-1] for r in rows] == ["m4", "m3b", "m3", "m2", "m1"]
    running, update, user, desched, drain = rows
    assert running[1:] == ["descheduler", "system-maintenance", "evacuationMigration=node-b", "node-b -> node-c",
                           "in flight (Running)", "m4"]  # route from the VMI's migrationState (same uid)
    assert running[0] == "-"
    assert update[1] == "workload-update" and update[3] == "workloadUpdateMigration=true"
    assert user[1:3] == ["user", "user-triggered"] and user[5] == "Succeeded"
    assert desched[1:6] == ["descheduler", "system-maintenance", "evacuationMigration=node-b", "node-b -> node-a",
                            "Failed"]
    assert drain[1:3] == ["evacuation", "system-critical"] and drain[0] == "2027-01-14T20:53:20Z"


def test_a_migration_whose_vmim_is_gone_comes_from_the_vmi():
    store = store_with(o.vmi(NS, "db", node="node-b", uid="uid-db", migration=o.migration_state(
        start=NOW - 900, end=NOW - 600, source_node="node-a", target_node="node-b", uid="uid-gc", failed=True)))
    [entry] = migration_history(store, store.vmi(NS, "db"))
    assert entry["migration"] is None and entry["priority"] is None and entry["annotations"] == []
    row = history_row(entry)
    assert row[1:6] == ["unknown", "-", "-", "node-a -> node-b", "Failed"] and "VMIM gone" in row[6]


def test_only_the_last_five_and_the_section_in_the_report():
    store = store_with(o.vmi(NS, "db", node="node-a", uid="uid-db"),
                       *[mig(f"m{i}", 1000 * i, priority="system-critical") for i in range(1, 8)])
    rows = migration_history(store, store.vmi(NS, "db"))
    assert [r["migration"] for r in rows] == ["m1", "m2", "m3", "m4", "m5"]
    text = history_text([dict(namespace=NS, vmi="db", **r) for r in rows])
    assert "system-maintenance = descheduler" in text
    lines = [line for line in text.splitlines() if line.startswith("  vms/db ")]
    assert len(lines) == 5 and all(" evacuation " in line for line in lines)
    assert history_text([]).rstrip().endswith("none")


def test_without_a_priority_the_cause_the_guard_recorded_and_a_users_vmim_are_told_apart():
    """KubeVirt 1.7/1.8 defaults: no spec.priority; the guard's cause annotation on evacuation VMIMs, none on a
    VMIM a user created (virtctl migrate)."""
    store = store_with(
        o.vmi(NS, "db", node="node-a", uid="uid-db"),
        mig("desched", 3000, evacuation_node="node-a", cause="descheduler", source_node="node-a", target_node="node-b"),
        mig("drain", 2000, evacuation_node="node-b", cause="evacuation", source_node="node-b", target_node="node-a"),
        mig("virtctl", 1000, source_node="node-a", target_node="node-b"),
        mig("unrecorded", 500, evacuation_node="node-b", source_node="node-b", target_node="node-a"),
    )
    rows = {r["migration"]: r["cause"] for r in migration_history(store, store.vmi(NS, "db"))}
    assert rows == {"desched": "descheduler", "drain": "evacuation", "virtctl": "user", "unrecorded": "evacuation"}


def test_causes_from_the_history_annotation_once_the_vmims_are_gone():
    from app.domain.history import HISTORY_ANNOTATION, HistoryEntry, encode_history

    value = encode_history([HistoryEntry("uid-old", NOW - 9000, NOW - 8000, "Succeeded", "descheduler"),
                            HistoryEntry("uid-gc", NOW - 900, NOW - 600, "Succeeded", "user")])
    vmi = o.vmi(NS, "db", node="node-b", uid="uid-db", migration=o.migration_state(
        start=NOW - 900, end=NOW - 600, source_node="node-a", target_node="node-b", uid="uid-gc"))
    vmi["metadata"]["annotations"][HISTORY_ANNOTATION] = value
    store = store_with(vmi)
    rows = migration_history(store, store.vmi(NS, "db"))
    assert [(r["cause"], r["source"]) for r in rows] == [("user", "node-a"), ("descheduler", None)], rows
