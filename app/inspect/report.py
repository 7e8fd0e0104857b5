"""``report``: every VM's state, which is the decision ``decide`` makes for a descheduler
eviction of its launcher pod at the same instant, with the numbers behind it."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from app.policy.cause import cause_of
from app.cluster.store import ClusterStore
from app.domain.usage import UsageSnapshot
from app.domain.records import FINAL_PHASES, LauncherPod, VMIRecord
from app.inspect.cluster import cluster_warnings, descheduler_fields, kubevirt_fields
from app.domain.evictionrequests import EvictionRequestRecord, requests_for_pod
from app.inspect.explain import eviction_request_fields, node_rest_fields, requester_request
from app.inspect.fields import NO_POD_STATE, decision_fields, duration_text, emit, seconds, state_of, table, timestamp
from app.inspect.vm import launcher_pods, per_vm, short_notes, vm_cooldown
from app.policy import decide
from app.policy.cooldown import relevant_migrations
from app.policy.decide import awaits_external_controller, not_migratable, source_cooldown, target_cooldown
from app.policy.model import PolicySettings, Reason
from app.startup import clock, load_eviction_requests, load_store, policy_settings, steering_once
from app.timefmt import format_duration

HISTORY_PER_VMI = 5  # what KubeVirt keeps: the 5 most recent finalized VMIMs per VMI
MAX_NAMED = 5


def report(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    settings = policy_settings(args)
    now = clock(args)()
    store = load_store(args)
    st = steering_once(args)
    emit(report_model(store, now, settings, load_eviction_requests(args), steering=st.fields(), usage=st.usage()),
         getattr(args, "output", "text"), report_text, out)
    return 0


def report_model(store: ClusterStore, now: float, settings: PolicySettings,
                 eviction_requests: list[EvictionRequestRecord] | None = None, steering: dict | None = None,
                 usage: UsageSnapshot | None = None) -> dict[str, Any]:
    """``eviction_requests``: Kubernetes' EvictionRequests of the cluster (None: not served, or a snapshot);
    ``steering``: its state (``Steering.fields``), and ``usage`` what the rows' decisions steer by (None: none)."""
    pods = launcher_pods(store)
    vmis = sorted(store.vmis(), key=lambda v: v.key)
    rows = [vmi_row(store, v, pods.get(v.key), now, settings, usage) for v in vmis]
    pending = pending_requests(vmis, pods, eviction_requests, now) if eviction_requests is not None else None
    for row in rows:
        if pending and any(p["namespace"] == row["namespace"] and p["vmi"] == row["name"] for p in pending):
            row["notes"].append("eviction-requested")
    model: dict[str, Any] = {
        "cluster": {"now": timestamp(now), "vmis": len(rows), "nodes": len(store.nodes()),
                    "migrationHistoryWindow": seconds(settings.migration_history_window),
                    "pendingEvacuationsPerNode": settings.pending_evacuations_per_node,
                    "kubevirt": kubevirt_fields(store), "descheduler": descheduler_fields(store),
                    "steering": steering},
        "warnings": [],
        "vmis": rows,
        "nodeCooldowns": node_cooldowns(store, now, settings),
        "migrations": [dict(namespace=v.namespace, vmi=v.name, **m) for v in vmis for m in migration_history(store, v)],
        # Kubernetes' pending EvictionRequests for the VMs' launcher pods; None when the cluster serves none
        "evictionRequests": pending,
    }
    podless = [f"{r['namespace']}/{r['name']}" for r in rows if r["state"] == NO_POD_STATE]
    if podless:
        model["warnings"].append(warning(
            "no_launcher_pod", f"{len(podless)} VMI(s) without a running launcher pod in the cluster state "
            f"({', '.join(podless[:MAX_NAMED])}{', ...' if len(podless) > MAX_NAMED else ''}): nothing to evict"))
    pinned = [f"{r['namespace']}/{r['name']}" for r in rows if r["pinned"]]
    model["warnings"] += cluster_warnings(store, now, settings, pinned)
    return model


def pending_requests(vmis: list[VMIRecord], pods: dict, requests: list[EvictionRequestRecord],
                     now: float) -> list[dict[str, Any]]:
    """The pending EvictionRequests whose target is a VM's launcher pod, by VM, oldest first."""
    out = []
    for v in vmis:
        pod = pods.get(v.key)
        if pod is None:
            continue
        out += [{"namespace": v.namespace, "vmi": v.name, "pod": pod.name, **eviction_request_fields(r, now)}
                for r in requests_for_pod(requests, pod.namespace, pod.name, pod.uid) if r.pending]
    return out


def warning(reason: str, message: str) -> dict[str, str]:
    return {"reason": reason, "message": message}


def vmi_row(store: ClusterStore, vmi: VMIRecord, pod: LauncherPod | None, now: float,
            settings: PolicySettings, usage: UsageSnapshot | None = None) -> dict[str, Any]:
    """One VM: the decision for a descheduler eviction of its launcher pod, and its cooldown numbers."""
    st = vm_cooldown(store, vmi, now, settings)
    row: dict[str, Any] = {"namespace": vmi.namespace, "name": vmi.name, "node": vmi.node or None,
                           "pod": pod.name if pod else None}
    if pod is None:
        row.update(state=NO_POD_STATE, allowed=None, code=None, reason=None, message=None)
    else:
        d = decide(requester_request(pod.namespace, pod.name, "descheduler"), store, now, settings, usage=usage)
        row.update(state=state_of(d), **decision_fields(d))
    unmovable = not_migratable(vmi, store.kubevirt())
    notes = short_notes(per_vm(vmi, pod, settings))
    if pod is not None and pod.pinned_to:
        notes.append(f"pinned={pod.pinned_to}")
    if unmovable is not None:
        notes.append("not-migratable")
    external = awaits_external_controller(vmi, relevant_migrations(vmi, store.migrations(vmi.namespace, vmi.name)),
                                          store.kubevirt())
    if external:  # marked, evictionStrategy External: waits for its controller; not counted by node_busy
        notes.append("external-evacuation")
    row.update(
        migrations=st.count if st else 0,
        lastEnd=timestamp(st.last_end) if st else None,
        cooldown=seconds(st.cooldown) if st else None,
        # the VM's own cooldown (`cooldown`), left: None when none is running
        remaining=seconds(st.remaining) if st and st.active else None,
        # the one node its launcher pod may run on (the descheduler skips it); None when not pinned
        pinned=(pod.pinned_to or None) if pod else None,
        # why a descheduler eviction would shut it down instead of moving it (`not_migratable`); None when it would move
        notMigratable=unmovable,
        # marked with evictionStrategy External and nothing migrating it: its external controller's to replace
        externalEvacuation=vmi.evacuation_node if external else None,
        notes=notes,
    )
    return row


def node_cooldowns(store: ClusterStore, now: float, settings: PolicySettings) -> dict[str, Any]:
    """Node cooldowns per node: which nodes the descheduler may not evict from right now, and for how long."""
    enabled = settings.node_cooldown > 0 or settings.target_node_cooldown > 0
    nodes = []
    if enabled:
        for node in sorted(n.name for n in store.nodes()):
            for rule, reason, rest, floor in (
                    ("8b", Reason.NODE_COOLDOWN, source_cooldown(node, store, now, settings), settings.node_cooldown),
                    ("8c", Reason.TARGET_NODE_COOLDOWN, target_cooldown(node, store, now, settings),
                     settings.target_node_cooldown)):
                fields = node_rest_fields(rest, floor)
                if fields["active"]:
                    nodes.append({"node": node, "rule": rule, "reason": reason, **fields})
    return {"enabled": enabled, "nodes": nodes}


def migration_history(store: ClusterStore, vmi: VMIRecord, limit: int = HISTORY_PER_VMI) -> list[dict[str, Any]]:
    """The VMI's last migrations, newest first: VMIMs, plus its ``migrationState`` when that
    migration's VMIM is gone (``migration`` None)."""
    entries = []
    latest = vmi.migration
    vmims = store.migrations(vmi.namespace, vmi.name)
    for m in vmims:
        state = latest if latest is not None and latest.uid and latest.uid == m.uid else None
        annotations = [f"evacuationMigration={m.evacuation_node}" if m.evacuation_node else "",
                       f"workloadUpdateMigration={m.workload_update}" if m.workload_update else ""]
        when = m.end if m.finished else None
        entries.append((when if when is not None else m.start or m.created or 0.0, {
            "ended": timestamp(when), "cause": cause_of(m), "priority": m.priority or None,
            "annotations": [a for a in annotations if a],
            "source": m.source_node or (state.source_node if state else "") or None,
            "target": m.target_node or (state.target_node if state else "") or None,
            "outcome": m.phase if m.phase in FINAL_PHASES else f"in flight ({m.phase or 'queued'})",
            "migration": m.name}))
    recorded = {h.uid: h for h in vmi.history if h.uid}  # the guard's history annotation: causes outlive VMIMs
    shown = {m.uid for m in vmims if m.uid}
    if latest is not None and latest.started and not any(m.uid == latest.uid for m in vmims if latest.uid):
        when = latest.end if latest.ended else None
        shown.add(latest.uid)
        entries.append((when if when is not None else latest.start or 0.0, {
            "ended": timestamp(when), "cause": _recorded_cause(recorded.get(latest.uid)), "priority": None,
            "annotations": [],
            "source": latest.source_node or None, "target": latest.target_node or None,
            "outcome": "in flight" if latest.in_flight else ("Failed" if latest.failed else "Succeeded"),
            "migration": None}))
    for h in vmi.history:
        if h.uid and h.uid not in shown:
            entries.append((h.end, {
                "ended": timestamp(h.end), "cause": _recorded_cause(h), "priority": None, "annotations": [],
                "source": None, "target": None, "outcome": h.outcome or "finished", "migration": None}))
    entries.sort(key=lambda e: e[0], reverse=True)
    return [row for _, row in entries[:limit]]


def _recorded_cause(entry) -> str:
    return (entry.cause if entry is not None else "") or "unknown"


# ---- the text view -------------------------------------------------------------

VMI_HEADER = ["NAMESPACE", "VMI", "NODE", "MIGRATIONS", "LAST-END", "COOLDOWN", "REMAINING", "STATE", "REASON", "NOTES"]


def report_text(m: dict[str, Any]) -> str:
    rows = [[r["namespace"], r["name"], r["node"] or "-", str(r["migrations"]), r["lastEnd"] or "-",
             duration_text(r["cooldown"]), duration_text(r["remaining"]), r["state"], r["reason"] or "-",
             ",".join(r["notes"])] for r in m["vmis"]]
    c = m["cluster"]
    text = table(VMI_HEADER, rows)
    text += "".join(f"warning: {w['message']}\n" for w in m["warnings"])
    text += cluster_text(c)
    text += (f"\n{c['vmis']} VMIs as of {c['now']}; STATE and REASON: the guard's decision for a descheduler "
             f"eviction of the VM's launcher pod (the reasoning: explain -n NAMESPACE --pod POD); migrations "
             f"counted in the last {format_duration(c['migrationHistoryWindow'])}\n")
    return (text + node_cooldowns_text(m["nodeCooldowns"]) + history_text(m["migrations"])
            + eviction_requests_text(m.get("evictionRequests")))


def eviction_requests_text(pending: list[dict[str, Any]] | None) -> str:
    """Nothing when the cluster serves no EvictionRequests or none is pending for a launcher pod."""
    if not pending:
        return ""
    rows = [[f"{p['namespace']}/{p['vmi']}", p["pod"], p["name"], p["requester"] or "-", p["created"] or "-"]
            for p in pending]
    return ("\nPending EvictionRequests (lifecycle.k8s.io/v1alpha1) for launcher pods (the guard judges the "
            "pods/eviction call their last responder makes):\n"
            + table(["VMI", "POD", "EVICTIONREQUEST", "REQUESTER", "CREATED"], rows, "  "))


def cluster_text(c: dict[str, Any]) -> str:
    kv, ds = c["kubevirt"], c["descheduler"]
    kubevirt = ("KubeVirt CR unknown (not in the cluster state)" if kv["object"] is None else
                f"KubeVirt {kv['object']}: parallelOutboundMigrationsPerNode {kv['parallelOutboundMigrationsPerNode']}, "
                f"parallelMigrationsPerCluster {kv['parallelMigrationsPerCluster']}, evictionStrategy "
                f"{kv['evictionStrategy']}" + (f" (KubeVirt's defaults: {', '.join(kv['defaulted'])})"
                                               if kv["defaulted"] else ""))
    if ds["object"] is None:
        descheduler = "KubeDescheduler unknown"
    else:
        limit = "no per-node limit" if ds["evictionLimitNode"] is None else (
            f"node limit {ds['evictionLimitNode']} ({ds['evictionLimitNodeFrom']})")
        descheduler = f"KubeDescheduler {ds['object']}: {limit}, background evictions {ds['backgroundEvictions']}"
    return (f"\n{kubevirt}\n{descheduler}\n{steering_text(c.get('steering'))}"
            f"guard: pendingEvacuationsPerNode {c['pendingEvacuationsPerNode']}\n")


def steering_text(st: dict[str, Any] | None) -> str:
    """One line: steering on (with what), or off and why; nothing when not known."""
    if not st:
        return ""
    where = f" ({st['url']}, from {st['from']})" if st.get("url") else ""
    if st["state"] == "on":
        return f"steering: on{where}\n"
    return f"steering: off: {st['state'].replace('_', ' ')}: {st['why']}{where}\n"


def node_cooldowns_text(nc: dict[str, Any]) -> str:
    if not nc["enabled"]:
        return "\nNode cooldowns: off (nodeCooldown and targetNodeCooldown are 0)\n"
    text = "\nNode cooldowns: nodes the descheduler may not evict from now:\n"
    if not nc["nodes"]:
        return text + "  none\n"
    rows = [[n["node"], f"{n['rule']} {n['reason']}", f"{n['lastMove']['namespace']}/{n['lastMove']['vmi']}",
             f"{n['lastMove']['from']} -> {n['lastMove']['to']}", duration_text(n["cooldown"]),
             duration_text(n["remaining"])] for n in nc["nodes"]]
    return text + table(["NODE", "RULE", "LAST-MOVE", "SOURCE -> TARGET", "COOLDOWN", "REMAINING"], rows, "  ")


def history_row(h: dict[str, Any]) -> list[str]:
    return [h["ended"] or "-", h["cause"], h["priority"] or "-", ",".join(h["annotations"]) or "-",
            f"{h['source'] or '?'} -> {h['target'] or '?'}", h["outcome"],
            h["migration"] or "(VMIM gone; from the VMI's migrationState or the guard's history)"]


def history_text(migrations: list[dict[str, Any]], limit: int = HISTORY_PER_VMI) -> str:
    """Why each VM moved: its last migrations with their cause (``app.policy.cause``)."""
    text = (f"\nRecent migrations (newest first, up to {limit} per VMI; cause from the VMIM's spec.priority "
            "(system-maintenance = descheduler, system-critical = drain or evacuation, user-triggered = user), else "
            "the cause the guard recorded on the evacuation VMIM, else a VMIM created through the API = user):\n")
    if not migrations:
        return text + "  none\n"
    rows = [[f"{h['namespace']}/{h['vmi']}", *history_row(h)] for h in migrations]
    header = ["VMI", "ENDED", "CAUSE", "PRIORITY", "ANNOTATIONS", "SOURCE -> TARGET", "OUTCOME", "MIGRATION"]
    return text + table(header, rows, "  ")
