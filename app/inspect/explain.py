"""``explain``: the decision for one pod, with everything it was made from."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from app.cluster.store import ClusterStore
from app.domain.evictionrequests import EvictionRequestRecord, requests_for_pod
from app.domain.usage import UsageSnapshot
from app.inspect.cluster import kubevirt_fields
from app.inspect.fields import decision_fields, duration_text, emit, seconds, timestamp
from app.inspect.vm import cooldown_fields, long_notes, per_vm, vm_cooldown
from app.policy import decide
from app.policy.cause import cause_of
from app.policy.cooldown import finished_migrations, relevant_migrations
from app.policy.decide import (
    awaits_external_controller,
    blocked_text,
    blocking_migration,
    describe_in_flight,
    fix_for,
    held_node,
    leavers,
    not_migratable,
    source_cooldown,
    steering_ranking,
    stuck_evacuation,
    target_cooldown,
)
from app.policy.model import DESCHEDULER_REQUESTER, EvictionAttempt, PolicySettings
from app.policy.nodecool import NodeCooldown
from app.startup import UsageError, clock, load_eviction_requests, load_store, policy_settings, steering_once
from app.timefmt import format_duration, format_timestamp

EXIT_ALLOWED, EXIT_DENIED = 0, 1  # 2: usage or input error (app.cli)


def requester_request(namespace: str, pod: str, requester: str) -> EvictionAttempt:
    if requester == "descheduler":
        return EvictionAttempt("CREATE", "pods", "eviction", namespace, pod, requested_by=DESCHEDULER_REQUESTER)
    if requester.startswith("user:") and len(requester) > 5:
        return EvictionAttempt("CREATE", "pods", "eviction", namespace, pod, username=requester[5:])
    raise UsageError(f"--requester: expected 'descheduler' or 'user:NAME', got {requester!r}")


def explain(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Exit status: 0 allowed, 1 denied (2, a usage or input error, comes from the caller)."""
    out = out or sys.stdout  # looked up at call time: a default bound at import would pin a replaced stdout
    settings = policy_settings(args)
    req = requester_request(args.namespace, args.pod, args.requester)
    now = clock(args)()
    store = load_store(args)
    if store.pod(req.namespace, req.name) is None:
        where = f"in {args.snapshot}" if args.snapshot else "among the cluster's virt-launcher pods"
        raise UsageError(f"pod {req.namespace}/{req.name} not found {where}")
    requests = load_eviction_requests(args)
    st = steering_once(args)
    model = explanation(req, store, now, settings, st.usage(), requests)
    model["steeringState"] = st.fields()  # on, or why not (docs/steering.md)
    emit(model, getattr(args, "output", "text"), explanation_text, out)
    return EXIT_ALLOWED if model["allowed"] else EXIT_DENIED


def explanation(req: EvictionAttempt, store: ClusterStore, now: float, settings: PolicySettings,
                usage: UsageSnapshot | None = None,
                eviction_requests: list[EvictionRequestRecord] | None = None) -> dict[str, Any]:
    """The decision (``allowed``, ``code``, ``reason``, ``message``) and the inputs it was made from.
    ``eviction_requests``: Kubernetes' EvictionRequests of the cluster (None: not served, or a snapshot)."""
    d = decide(req, store, now, settings, usage=usage)
    model: dict[str, Any] = decision_fields(d)
    model["retryIn"] = seconds(d.remaining)  # seconds until a cooldown denial lifts (`node_cooldown`, `target_node_cooldown` and `cooldown`); else None
    model["request"] = {"namespace": req.namespace, "pod": req.name,
                        "requester": "descheduler" if req.requested_by else f"user:{req.username}",
                        "requestedBy": req.requested_by or None, "username": req.username or None}
    model["now"] = timestamp(now)
    model.update(pod=None, node=None, vmi=None, evictionRequests=None)
    pod = store.pod(req.namespace, req.name)
    if pod is None:
        return model
    if eviction_requests is not None:
        model["evictionRequests"] = [eviction_request_fields(r, now) for r in
                                     requests_for_pod(eviction_requests, pod.namespace, pod.name, pod.uid)]
    node = store.node(pod.node)
    model["pod"] = {"node": pod.node or None, "phase": pod.phase or None, "launcher": pod.is_launcher,
                    "vmi": pod.vmi_name or None, "evictionInProgress": pod.eviction_in_progress,
                    "preferNoEviction": pod.prefer_no_eviction, "pinnedTo": pod.pinned_to or None}
    model["kubevirt"] = kubevirt_fields(store)
    model["node"] = {"name": pod.node or None, "known": node is not None,
                     "draining": (node.drain or None) if node else None}
    vmi = store.vmi(pod.namespace, pod.vmi_name)
    if vmi is None:
        return model
    migs = relevant_migrations(vmi, store.migrations(vmi.namespace, vmi.name))
    blocked = blocking_migration(migs)
    evacuation = None
    if vmi.evacuation_node:
        stuck = stuck_evacuation(vmi, migs, store.node(vmi.evacuation_node), now, settings)
        evacuation = {"from": vmi.evacuation_node, "source": vmi.eviction_source or None,
                      "external": awaits_external_controller(vmi, migs, store.kubevirt()),
                      "stuck": stuck is not None, "why": stuck.why if stuck else None,
                      "waiting": blocked_text(blocked) if blocked is not None else None,
                      "staleAfterFailures": settings.evacuation_stale_after_failures,
                      "staleAfter": seconds(settings.evacuation_stale_after)}
    model["vmi"] = {"namespace": vmi.namespace, "name": vmi.name, "node": vmi.node or None,
                    "evacuationNodeName": vmi.evacuation_node or None,
                    "inFlight": describe_in_flight(vmi, migs, now) or None, "evacuation": evacuation,
                    "liveMigratable": vmi.migratable or None, "liveMigratableReason": vmi.migratable_reason or None,
                    "evictionStrategy": vmi.eviction_strategy or None,
                    "notMigratable": not_migratable(vmi, store.kubevirt()),
                    "blocked": ({"migration": blocked.name, "condition": blocked.blocked,
                                 "reason": blocked.blocked_reason or None} if blocked is not None else None),
                    "perVm": per_vm(vmi, pod, settings)}
    finished = sorted(finished_migrations(vmi, migs), key=lambda f: f.end)
    # who moved it: the VMIM while KubeVirt keeps it, else the guard's history annotation
    causes = {h.uid: h.cause for h in vmi.history if h.uid and h.cause} | {m.uid: cause_of(m) for m in migs if m.uid}
    model["finishedMigrations"] = [
        {"uid": f.uid or None, "start": timestamp(f.start), "end": timestamp(f.end), "ago": seconds(now - f.end),
         "duration": seconds(f.end - f.start) if f.start is not None else None,
         "cause": causes.get(f.uid) or "unknown"} for f in finished]
    model["cooldown"] = cooldown_fields(vm_cooldown(store, vmi, now, settings), settings)
    held = held_node(node, store, now, settings) if node is not None else None
    model["leaving"] = {"node": pod.node or None, "vmis": leaving_others(store, vmi, pod.node, now, settings),
                        "budget": settings.pending_evacuations_per_node,
                        "staleAfter": seconds(settings.evacuation_stale_after),
                        # the node held by leavers for longer than staleAfter: shown, with the fix
                        "heldFor": seconds(held.held_for) if held is not None else None,
                        "fix": [f"{x.ref}: {fix_for(x)}" for x in held.holders] if held is not None else []}
    model["nodeCooldown"] = node_rest_fields(source_cooldown(pod.node, store, now, settings), settings.node_cooldown)
    model["targetNodeCooldown"] = node_rest_fields(target_cooldown(pod.node, store, now, settings),
                                                   settings.target_node_cooldown)
    model["steering"] = steering_fields(pod.node, vmi, store, now, settings, usage) if usage is not None else None
    return model


def eviction_request_fields(r: EvictionRequestRecord, now: float) -> dict[str, Any]:
    """One of Kubernetes' EvictionRequests (lifecycle.k8s.io/v1alpha1) for the pod, as report and explain show it."""
    return {"name": r.name, "requester": r.requester or None, "intent": r.intent or None, "pending": r.pending,
            "ended": r.ended or None, "created": timestamp(r.created),
            "age": seconds(now - r.created) if r.created is not None else None}


def eviction_requests_text(requests: list[dict[str, Any]] | None) -> list[str]:
    """Nothing when the cluster serves no EvictionRequests or none targets the pod."""
    if not requests:
        return []
    pending = [r for r in requests if r["pending"]]
    lines = [f"eviction requests (lifecycle.k8s.io/v1alpha1): {len(pending)} pending of {len(requests)}"]
    for r in requests:
        state = "pending" if r["pending"] else (r["ended"] or f"intent {r['intent'] or '-'}")
        lines.append(f"  {r['name']}: requester {r['requester'] or '-'}, {state}, created {r['created'] or '-'}"
                     + (f" ({duration_text(r['age'], '?')} ago)" if r["age"] is not None else ""))
    return lines


def leaving_others(store: ClusterStore, vmi, node: str, now: float, settings: PolicySettings) -> list[dict[str, Any]]:
    """The other VMs `node_busy` counts on the node, oldest departure first, with their state (stuck, waiting)."""
    return [{"namespace": x.namespace, "name": x.name, "leavingFor": seconds(x.age), "state": x.state or None}
            for x in leavers(node, store, now, settings) if (x.namespace, x.name) != vmi.key]


def node_rest_fields(rest: NodeCooldown | None, floor: float) -> dict[str, Any]:
    """Node cooldowns for one node: ``enabled`` false when the setting is 0; ``lastMove`` None when no move counts."""
    if floor <= 0:
        return {"enabled": False, "active": False, "lastMove": None}
    if rest is None:
        return {"enabled": True, "active": False, "lastMove": None}
    m = rest.last
    return {"enabled": True, "active": rest.active,
            "lastMove": {"namespace": m.namespace, "vmi": m.vmi_name, "from": m.source_node or None,
                         "to": m.target_node or None, "end": timestamp(m.end)},
            "count": rest.count, "cooldown": seconds(rest.cooldown), "remaining": seconds(max(rest.remaining, 0))}


def steering_fields(node: str, vmi, store: ClusterStore, now: float, settings: PolicySettings,
                    usage: UsageSnapshot) -> dict[str, Any]:
    """Steering's ranking: every VM on the node the descheduler could still move, best move first."""
    out: dict[str, Any] = {"node": node, "dataAge": seconds(usage.age(now)), "maxAge": seconds(usage.max_age),
                           "error": usage.error or None, "usable": usage.usable(now), "ranking": None}
    if not out["usable"]:
        return out
    ranking = steering_ranking(node, vmi, store, now, settings, usage)
    if ranking is None:
        return out
    out["ranking"] = {
        "node": node, "hotScore": round(ranking.hot_score, 3), "measuredScore": ranking.measured_score,
        "target": ranking.target, "targetScore": round(ranking.target_score, 3),
        "minGain": settings.steering_min_gain, "margin": settings.steering_margin,
        "candidates": [{"rank": i, "namespace": c.key[0], "name": c.key[1], "cpuCores": c.cpu_cores,
                        "memoryBytes": c.memory_bytes, "gain": round(c.gain, 3), "hotAfter": round(c.hot_after, 3),
                        "targetAfter": round(c.target_after, 3), "thisEviction": c.key == vmi.key}
                       for i, c in enumerate(ranking.candidates, 1)],
    }
    return out


# ---- the text view -------------------------------------------------------------


def explanation_text(m: dict[str, Any]) -> str:
    req = m["request"]
    by = req["requestedBy"] or f"user {req['username']}"
    lines = [f"eviction of pod {req['namespace']}/{req['pod']} by {by} at {m['now']}",
             f"decision: {'ALLOW' if m['allowed'] else 'DENY (429 TooManyRequests)'}  reason: {m['reason']}",
             f"message:  {m['message']}"]
    pod, node, vmi = m["pod"], m["node"], m["vmi"]
    if pod is None:
        return "\n".join(lines) + "\n"
    lines += ["", (f"pod:      node={pod['node'] or '-'} phase={pod['phase'] or '-'} launcher={pod['launcher']} "
                   f"vmi={pod['vmi'] or '-'} eviction-in-progress={pod['evictionInProgress']}"
                   f" prefer-no-eviction={pod['preferNoEviction']} pinned={pod['pinnedTo'] or 'no'}"),
              f"node:     {node['name'] or '-'} draining={(node['draining'] or 'no') if node['known'] else 'unknown'}"]
    lines += eviction_requests_text(m["evictionRequests"])
    if vmi is None:
        return "\n".join(lines) + "\n"
    lines.append(f"vmi:      node={vmi['node'] or '-'} evacuationNodeName={vmi['evacuationNodeName'] or '-'}"
                 f" in-flight={vmi['inFlight'] or 'none'}")
    kv = m["kubevirt"]
    strategy = vmi["evictionStrategy"] or (f"{kv['evictionStrategy']} (cluster default)" if kv["object"] else "unset")
    lines.append(f"migrate:  LiveMigratable={vmi['liveMigratable'] or 'unknown'}"
                 + (f" ({vmi['liveMigratableReason']})" if vmi["liveMigratableReason"] else "")
                 + f" evictionStrategy={strategy}"
                 + (f"; NOT MIGRATABLE ({vmi['notMigratable']}): a descheduler eviction would shut it down"
                    if vmi["notMigratable"] else ""))
    if kv["object"] is not None:
        lines.append(f"kubevirt: {kv['object']} parallelOutboundMigrationsPerNode={kv['parallelOutboundMigrationsPerNode']}"
                     f" parallelMigrationsPerCluster={kv['parallelMigrationsPerCluster']}"
                     f" evictionStrategy={kv['evictionStrategy']}")
    ev = vmi["evacuation"]
    if ev is not None:
        lines.append(f"evacuation: from {ev['from']} source={ev['source'] or '-'} "
                     + ("EXTERNAL (evictionStrategy External: its external controller replaces the VM; KubeVirt "
                        "migrates nothing, node_busy does not count it) " if ev["external"] else "")
                     + (f"WAITING ({ev['waiting']}: blocked is not stuck, never cancelled)" if ev["waiting"]
                        else f"STUCK ({ev['why']})" if ev["stuck"] else "not stuck")
                     + f" (stuck after {ev['staleAfterFailures'] or 'no count of'} failed attempts"
                     f" or {format_duration(ev['staleAfter'])}; descheduler-caused, node not drained)")
    lines.append(f"per-VM:   {long_notes(vmi['perVm'])}")
    lines.append(f"finished migrations ({len(m['finishedMigrations'])}):")
    for f in m["finishedMigrations"]:
        lines.append(f"  ended {f['end']} ({format_duration(f['ago'])} ago), took "
                     f"{duration_text(f['duration'], 'unknown')}, cause {f['cause']}, uid {f['uid'] or '-'}")
    c = m["cooldown"]
    if c is not None:
        floor = "migrationCooldown" if c["floorFrom"] == "migrationCooldown" else f"{c['floorFrom']} (this VM)"
        cap_note = " (raised to this VM's cooldown)" if c["capRaised"] else ""
        lines.append(
            f"cooldown: base {format_duration(c['base'])} = max({floor} {format_duration(c['floor'])},"
            f" last duration {duration_text(c['lastDuration'], 'unknown')});"
            f" x2^({max(c['count'], 1)}-1) for {c['count']} in {format_duration(c['window'])};"
            f" cap {format_duration(c['cap']) if c['cap'] else 'none'}{cap_note}"
            f" -> {format_duration(c['cooldown'])}, remaining {format_duration(c['remaining'])}")
    lv = m["leaving"]
    names = [f"{o['namespace']}/{o['name']} (leaving for {duration_text(o['leavingFor'], 'unknown')}"
             + (f", {o['state']}" if o["state"] else "") + ")" for o in lv["vmis"]]
    lines.append(f"leaving {lv['node'] or '-'}: {', '.join(names) if names else 'none'}"
                 f" (budget {lv['budget']}; each counts until its departure ends)")
    if lv["heldFor"] is not None:
        lines.append(f"held:     node {lv['node']} held for {format_duration(lv['heldFor'])}, longer than "
                     f"evacuationStaleAfter {format_duration(lv['staleAfter'])}; fix: {'; '.join(lv['fix'])}")
    lines.append(f"node cooldown (8b):        {node_rest_text(m['nodeCooldown'])}")
    lines.append(f"target-node cooldown (8c): {node_rest_text(m['targetNodeCooldown'])}")
    if m["steering"] is not None:
        lines += steering_text(m["steering"])
    elif m.get("steeringState"):
        st = m["steeringState"]
        lines.append(f"steering: off: {st['state'].replace('_', ' ')}: {st['why']}")
    return "\n".join(lines) + "\n"


def node_rest_text(r: dict[str, Any]) -> str:
    """One line on a node cooldown: off, none, over, or its numbers."""
    if not r["enabled"]:
        return "off"
    mv = r["lastMove"]
    if mv is None:
        return "no descheduler move counts (or churn-only and the node sent none)"
    state = f"remaining {format_duration(r['remaining'])}" if r["active"] else "over"
    return (f"last descheduler move {mv['namespace']}/{mv['vmi']} ({mv['from'] or '?'} -> {mv['to'] or '?'}) "
            f"ended {mv['end'] or format_timestamp(0)}; {r['count']} in the window; "
            f"cooldown {format_duration(r['cooldown'])}, {state}")


def steering_text(s: dict[str, Any]) -> list[str]:
    age = f"{format_duration(s['dataAge'])} old" if s["dataAge"] is not None else "missing"
    error = f"; last error: {s['error']}" if s["error"] else ""
    lines = ["", f"steering: Prometheus data {age} (limit {format_duration(s['maxAge'])}){error}"]
    if not s["usable"]:
        return lines
    r = s["ranking"]
    if r is None:
        return lines + [f"  no prediction: node {s['node']} or a target node lacks data"]
    measured = f"{r['measuredScore']:.0f}" if r["measuredScore"] is not None else "-"
    lines.append(f"  node {r['node']}: score {r['hotScore']:.1f} predicted from its inputs (recorded {measured});"
                 f" likely target {r['target']} (score {r['targetScore']:.1f})")
    lines.append(f"  min gain {r['minGain']:g} points, margin {r['margin']:g} points")
    lines.append("  RANK  VMI                                  CPU(cores)  MEMORY(GiB)  GAIN   HOT-AFTER  TARGET-AFTER")
    for c in r["candidates"]:
        me = "  <- this eviction" if c["thisEviction"] else ""
        name = f"{c['namespace']}/{c['name']}"
        lines.append(f"  {c['rank']:<4}  {name:<36} {c['cpuCores']:>10.2f}  {c['memoryBytes'] / 2**30:>11.1f}"
                     f"  {c['gain']:>5.1f}  {c['hotAfter']:>9.1f}  {c['targetAfter']:>12.1f}{me}")
    return lines
