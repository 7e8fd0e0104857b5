"""Cluster objects in the shapes KubeVirt and kube-apiserver write them, relative to a test clock.

Times are given as minutes before NOW so a table row reads like the situation
it describes ("migration ended 5 minutes ago").
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from app.cluster.store import ClusterStore
from app.domain.records import (
    kubevirt_from_object,
    migration_from_object,
    node_from_object,
    pod_from_object,
    vmi_from_object,
)
from app.domain.usage import UsageSnapshot

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NOW_DT = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)
NOW = NOW_DT.timestamp()
NS = "vms"
MIN = 60.0
HOUR = 3600.0


def ts(minutes_ago: float | None) -> str | None:
    if minutes_ago is None:
        return None
    return (NOW_DT - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, cordoned: bool = False, taints: tuple[str, ...] = ()) -> dict:
    spec: dict = {"unschedulable": True} if cordoned else {}
    if taints:
        spec["taints"] = [{"key": k, "effect": "NoSchedule"} for k in taints]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}


def mstate(uid: str, src: str, dst: str, start: float | None, end: float | None = None, failed: bool = False, raw_start=None) -> dict:
    s: dict = {"migrationUid": uid, "sourceNode": src, "targetNode": dst}
    if raw_start is not None:
        s["startTimestamp"] = raw_start
    elif start is not None:
        s["startTimestamp"] = ts(start)
    if end is not None:
        s.update(endTimestamp=ts(end), completed=not failed, failed=failed)
    return s


def vmi(name: str, node_name: str, created: float = 10_000, migration: dict | None = None, evacuation: str | None = None,
        annotations: dict | None = None, strategy: str | None = None, migratable: tuple[str, str, str] | None = None,
        uid: str | None = None) -> dict:
    """``strategy``: spec.evictionStrategy; ``migratable``: the LiveMigratable condition's (status, reason, message)."""
    status: dict = {"phase": "Running", "nodeName": node_name}
    if migration is not None:
        status["migrationState"] = migration
    if evacuation:
        status["evacuationNodeName"] = evacuation
    if migratable is not None:
        st, reason, message = migratable
        status["conditions"] = [{"type": "LiveMigratable", "status": st, "lastProbeTime": None,
                                 "lastTransitionTime": None, **({"reason": reason} if reason else {}),
                                 **({"message": message} if message else {})}]
    return {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}", "creationTimestamp": ts(created),
                     **({"annotations": annotations} if annotations else {})},
        "spec": {"evictionStrategy": strategy} if strategy else {},
        "status": status,
    }


def kubevirt_cr(strategy: str | None = None, outbound: int | None = None, per_cluster: int | None = None,
                name: str = "kubevirt", namespace: str = "kubevirt") -> dict:
    """The KubeVirt CR with what the guard reads of spec.configuration (unset where None)."""
    migrations = {k: v for k, v in (("parallelOutboundMigrationsPerNode", outbound),
                                    ("parallelMigrationsPerCluster", per_cluster)) if v is not None}
    config: dict = {"migrations": migrations} if migrations else {}
    if strategy is not None:
        config["evictionStrategy"] = strategy
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": name, "namespace": namespace},
            "spec": {"configuration": config} if config else {}}


def vmim(name: str, vmi_name: str, phase: str, created: float, state: dict | None = None, evacuation: str | None = None,
         uid: str | None = None, priority: str | None = None, conditions: list[dict] | None = None,
         send_to: bool = False, receive: bool = False) -> dict:
    """``send_to``/``receive``: one side of a decentralized migration (KubeVirt 1.9's spec.sendTo / spec.receive)."""
    meta: dict = {"name": name, "namespace": NS, "uid": uid or (state or {}).get("migrationUid") or f"uid-{name}",
                  "creationTimestamp": ts(created)}
    if evacuation:
        meta["annotations"] = {"kubevirt.io/evacuationMigration": evacuation}
    status: dict = {"phase": phase} if phase else {}
    if state is not None:
        status["migrationState"] = state
    if conditions:
        status["conditions"] = conditions
    spec: dict = {"vmiName": vmi_name, **({"priority": priority} if priority else {})}
    if send_to:
        spec["sendTo"] = {"migrationID": f"mig-{name}", "connectURL": "https://sync.other-cluster.example:9185"}
    if receive:
        spec["receive"] = {"migrationID": f"mig-{name}"}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration", "metadata": meta,
            "spec": spec, "status": status}


def failing_evacuation(vmi_name: str, node_name: str, attempts: int, first: float = 15, every: float = 4,
                       priority: str | None = "system-maintenance", running: bool = False) -> list[dict]:
    """The VMIMs of an evacuation from ``node_name`` whose attempts all failed: the first
    created ``first`` minutes ago, one every ``every`` minutes; ``running`` adds a queued retry."""
    out = []
    for i in range(attempts):
        created = first - i * every
        state = mstate(f"{vmi_name}-e{i}", node_name, "worker-b", created - 0.5, created - 3, failed=True)
        out.append(vmim(f"{vmi_name}-e{i}", vmi_name, "Failed", created, state, evacuation=node_name, priority=priority))
    if running:
        out.append(vmim(f"{vmi_name}-e{attempts}", vmi_name, "Pending", first - attempts * every, evacuation=node_name,
                        priority=priority))
    return out


def pod(vmi_name: str, node_name: str, name: str | None = None, phase: str | None = "Running", job: str | None = None,
        launcher: bool = True, domain: bool = True, annotations: dict | None = None, ready: bool | None = None,
        node_selector: dict | None = None, affinity: dict | None = None) -> dict:
    """``phase`` None: no status.phase at all (a pod the kubelet has not reported on yet)."""
    ready = phase == "Running" if ready is None else ready
    labels = {"kubevirt.io": "virt-launcher"} if launcher else {"app": "web"}
    if job:
        labels["kubevirt.io/migrationJobUID"] = job
    annotations = {**({"kubevirt.io/domain": vmi_name} if domain else {}), **(annotations or {})}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name or f"virt-launcher-{vmi_name}-abcde", "namespace": NS, "resourceVersion": "7",
                     "labels": labels, "annotations": annotations},
        "spec": {"nodeName": node_name, **({"nodeSelector": node_selector} if node_selector else {}),
                 **({"affinity": affinity} if affinity else {})},
        "status": {**({"phase": phase} if phase is not None else {}),
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


PARSE = {"Node": node_from_object, "VirtualMachineInstance": vmi_from_object,
         "VirtualMachineInstanceMigration": migration_from_object, "Pod": pod_from_object, "KubeVirt": kubevirt_from_object}


def condition(kind: str, reason: str = "", message: str = "", status: str = "True") -> dict:
    """A VMIM condition as virt-controller writes it (e.g. migrationBlockedByBackup)."""
    return {"type": kind, "status": status, "lastProbeTime": ts(1), "lastTransitionTime": None,
            **({"reason": reason} if reason else {}), **({"message": message} if message else {})}


def store_of(*objects: dict) -> ClusterStore:
    store = ClusterStore()
    for obj in objects:
        store.upsert(PARSE[obj["kind"]](obj))
    return store


GIB = float(1 << 30)


def usage_snapshot(age: float = 30, hot: str = "worker-a", max_age: float = 90) -> UsageSnapshot:
    """Prometheus usage as rule 10 reads it: ``hot`` at 75% CPU (with some CPU pressure) and 55% memory,
    worker-b at 45% / 45%, cordoned worker-c idle (never a target); 64 cores and 256 GiB each.
    VMs on ``hot``: db (2 cores, 8 GiB), web (6 cores, 8 GiB), big (12 cores, 16 GiB);
    predicted gains 11, 30 and 36 points (tests/test_steering.py checks them)."""
    from types import MappingProxyType

    from app.domain.usage import NodeUsage, VMUsage

    cap = {"cpu_cores": 64.0, "memory_bytes": 256 * GIB}
    nodes = {
        hot: NodeUsage(cpu=0.75, memory=0.55, cpu_pressure=0.05, score=0.48, **cap),
        "worker-b": NodeUsage(cpu=0.45, memory=0.45, score=0.0, **cap),
    }
    if hot != "worker-c":
        nodes["worker-c"] = NodeUsage(cpu=0.45, memory=0.45, score=0.0, **cap)
    avg = (0.6, 0.5, 0.025, 0.0)  # the workers' averages: hot and worker-b
    vms = {(NS, "db"): VMUsage(hot, 2.0, 8 * GIB), (NS, "web"): VMUsage(hot, 6.0, 8 * GIB),
           (NS, "big"): VMUsage(hot, 12.0, 16 * GIB)}
    return UsageSnapshot(taken_at=NOW - age, max_age=max_age, nodes=MappingProxyType(nodes), vms=MappingProxyType(vms),
                         averages=avg)


def history_annotation(*entries: tuple[str, float | None, float]) -> dict:
    """The guard's migration-history annotation for (uid, start, end) in minutes before NOW."""
    import json

    from app.domain.history import HISTORY_ANNOTATION

    return {HISTORY_ANNOTATION: json.dumps([{"uid": u, "start": ts(s), "end": ts(e), "outcome": "Succeeded"}
                                            for u, s, e in entries])}


def six_short_migrations(name: str = "db", node_name: str = "worker-a") -> list[dict]:
    """The issue's case: six 10-minute migrations in 48 h (one an hour, the last ended 1 minute
    ago), KubeVirt has garbage-collected the oldest VMIM, the guard's annotation has all six."""
    runs = [(f"m{i}", 11 + 60 * i, 1 + 60 * i) for i in range(6)]  # m0 newest
    nodes = ("worker-b", node_name)
    v = vmi(name, node_name, migration=mstate("m0", nodes[0], nodes[1], 11, 1), annotations=history_annotation(*runs))
    kept = [vmim(u, name, "Succeeded", s + 1, mstate(u, nodes[i % 2], nodes[(i + 1) % 2], s, e))
            for i, (u, s, e) in enumerate(runs[:5])]
    return [v, *kept]
