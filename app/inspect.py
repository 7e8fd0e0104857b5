"""``explain`` and ``report``: the decisions and numbers, for humans at a terminal."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from app.cluster.migrations import cause_of
from app.cluster.store import ClusterStore
from app.domain.records import COOLDOWN_OVERRIDE, EXEMPT_OVERRIDE, FINAL_PHASES, VMIRecord
from app.domain.usage import UsageSnapshot
from app.policy import cooldown_state, decide
from app.policy.cooldown import finished_migrations, relevant_migrations
from app.policy.decide import (
    describe_in_flight,
    is_leaving,
    leaving_age,
    source_cooldown,
    steering_ranking,
    stuck_evacuation,
    target_cooldown,
)
from app.policy.model import DESCHEDULER_REQUESTER, EvictionRequest, PolicySettings
from app.policy.nodecool import NodeCooldown
from app.startup import UsageError, clock, load_store, policy_settings, prometheus_source
from app.timefmt import format_duration, format_timestamp


def requester_request(namespace: str, pod: str, requester: str) -> EvictionRequest:
    if requester == "descheduler":
        return EvictionRequest("CREATE", "pods", "eviction", namespace, pod, requested_by=DESCHEDULER_REQUESTER)
    if requester.startswith("user:") and len(requester) > 5:
        return EvictionRequest("CREATE", "pods", "eviction", namespace, pod, username=requester[5:])
    raise UsageError(f"--requester: expected 'descheduler' or 'user:NAME', got {requester!r}")


def explain(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up at call time: a default bound at import would pin a replaced stdout
    settings = policy_settings(args)
    now = clock(args)()
    store = load_store(args)
    req = requester_request(args.namespace, args.pod, args.requester)
    usage = None
    source = prometheus_source(args)
    if source is not None:  # one round of queries, here and now
        try:
            source.poll_once()
            usage = source.current()
        finally:
            source.stop()
    write_explanation(req, store, now, settings, out, usage)
    return 0


def write_explanation(req: EvictionRequest, store: ClusterStore, now: float, settings: PolicySettings, out: TextIO,
                      usage: UsageSnapshot | None = None) -> None:
    d = decide(req, store, now, settings, usage=usage)
    w = out.write
    w(f"eviction of pod {req.namespace}/{req.name} by {req.requested_by or 'user ' + req.username}"
      f" at {format_timestamp(now)}\n")
    w(f"decision: {'ALLOW' if d.allowed else 'DENY (429 TooManyRequests)'}  reason: {d.reason}\n")
    w(f"message:  {d.message}\n")
    pod = store.pod(req.namespace, req.name)
    if pod is None:
        return
    node = store.node(pod.node)
    w(f"\npod:      node={pod.node or '-'} phase={pod.phase or '-'} launcher={pod.is_launcher} "
      f"vmi={pod.vmi_name or '-'} eviction-in-progress={pod.eviction_in_progress}"
      f" prefer-no-eviction={pod.prefer_no_eviction}\n")
    w(f"node:     {pod.node or '-'} draining={(node.drain or 'no') if node else 'unknown'}\n")
    vmi = store.vmi(pod.namespace, pod.vmi_name)
    if vmi is None:
        return
    migs = relevant_migrations(vmi, store.migrations(vmi.namespace, vmi.name))
    w(f"vmi:      node={vmi.node or '-'} evacuationNodeName={vmi.evacuation_node or '-'}"
      f" in-flight={describe_in_flight(vmi, migs, now) or 'none'}\n")
    if vmi.evacuation_node:
        stuck = stuck_evacuation(vmi, migs, store.node(vmi.evacuation_node), now, settings)
        w(f"evacuation: from {vmi.evacuation_node} source={vmi.eviction_source or '-'} "
          + (f"STUCK ({stuck.why})" if stuck else "not stuck")
          + f" (stuck after {settings.evacuation_stale_after_failures or 'no count of'} failed attempts"
          f" or {format_duration(settings.evacuation_stale_after)}; descheduler-caused, node not drained)\n")
    w(f"per-VM:   {per_vm_choices(vmi, pod.prefer_no_eviction, settings)}\n")
    finished = sorted(finished_migrations(vmi, migs), key=lambda f: f.end)
    w(f"finished migrations ({len(finished)}):\n")
    for f in finished:
        dur = format_duration(f.end - f.start) if f.start is not None else "unknown"
        w(f"  ended {format_timestamp(f.end)} ({format_duration(now - f.end)} ago), took {dur}, uid {f.uid or '-'}\n")
    st = cooldown_state(vmi, migs, now, settings)
    if st is not None:
        floor = "migrationCooldown" if st.floor == settings.migration_cooldown else f"{COOLDOWN_OVERRIDE} (this VM)"
        cap_note = "" if st.cap == settings.max_migration_cooldown else " (raised to this VM's cooldown)"
        w(f"cooldown: base {format_duration(st.base)} = max({floor} {format_duration(st.floor)},"
          f" last duration {format_duration(st.last_duration) if st.last_duration is not None else 'unknown'});"
          f" x2^({max(st.count, 1)}-1) for {st.count} in {format_duration(settings.migration_history_window)};"
          f" cap {format_duration(st.cap) if st.cap else 'none'}{cap_note}"
          f" -> {format_duration(st.cooldown)}, remaining {format_duration(max(st.remaining, 0))}\n")
    leaving = []
    for other in store.leaving_candidates(pod.node):
        if other.key == vmi.key:
            continue
        om = relevant_migrations(other, store.migrations(other.namespace, other.name))
        if is_leaving(other, om, pod.node):
            age = leaving_age(other, om, pod.node, now)
            leaving.append(f"{other.namespace}/{other.name} (leaving for {format_duration(age) if age is not None else 'unknown'})")
    w(f"leaving {pod.node or '-'}: {', '.join(leaving) if leaving else 'none'}"
      f" (budget {settings.pending_evacuations_per_node}, stale after {format_duration(settings.evacuation_stale_after)})\n")
    w(f"node cooldown (8b):        {describe_node_rest(source_cooldown(pod.node, store, now, settings), settings.node_cooldown)}\n")
    w(f"target-node cooldown (8c): "
      f"{describe_node_rest(target_cooldown(pod.node, store, now, settings), settings.target_node_cooldown)}\n")
    if usage is not None:
        write_ranking(pod.node, vmi, store, now, settings, usage, w)


def describe_node_rest(rest: NodeCooldown | None, floor: float) -> str:
    """One line on a node cooldown: off, none, over, or its numbers."""
    if floor <= 0:
        return "off"
    if rest is None:
        return "no descheduler move counts (or churn-only and the node sent none)"
    m = rest.last
    route = f"{m.source_node or '?'} -> {m.target_node or '?'}"
    state = f"remaining {format_duration(rest.remaining)}" if rest.active else "over"
    return (f"last descheduler move {m.namespace}/{m.vmi_name} ({route}) ended {format_timestamp(m.end or 0)}; "
            f"{rest.count} in the window; cooldown {format_duration(rest.cooldown)}, {state}")


def write_node_cooldowns(store: ClusterStore, now: float, settings: PolicySettings, out: TextIO) -> None:
    """Rules 8b/8c per node: which nodes the descheduler may not evict from right now, and for how long."""
    if settings.node_cooldown <= 0 and settings.target_node_cooldown <= 0:
        out.write("\nNode cooldowns (rules 8b, 8c): off (nodeCooldown and targetNodeCooldown are 0)\n")
        return
    rows = []
    for node in sorted(n.name for n in store.nodes()):
        for rule, rest in (("8b node_cooldown", source_cooldown(node, store, now, settings)),
                           ("8c target_node_cooldown", target_cooldown(node, store, now, settings))):
            if rest is not None and rest.active:
                m = rest.last
                rows.append([f"  {node}", rule, f"{m.namespace}/{m.vmi_name}", f"{m.source_node} -> {m.target_node}",
                             format_duration(rest.cooldown), format_duration(rest.remaining)])
    out.write("\nNode cooldowns (rules 8b, 8c): nodes the descheduler may not evict from now:\n")
    if not rows:
        out.write("  none\n")
        return
    header = ["  NODE", "RULE", "LAST-MOVE", "SOURCE -> TARGET", "COOLDOWN", "REMAINING"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out.writelines("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n" for r in [header, *rows])


def write_ranking(node: str, vmi, store: ClusterStore, now: float, settings: PolicySettings, usage: UsageSnapshot, w) -> None:
    """Rule 10's ranking: every VM on the node the descheduler could still move, best move first."""
    age = usage.age(now)
    w(f"\nsteering: Prometheus data {format_duration(age) + ' old' if age is not None else 'missing'}"
      f" (limit {format_duration(usage.max_age)}){'; last error: ' + usage.error if usage.error else ''}\n")
    if not usage.usable(now):
        return
    ranking = steering_ranking(node, vmi, store, now, settings, usage)
    if ranking is None:
        w(f"  no prediction: node {node} or a target node lacks data\n")
        return
    measured = f"{ranking.measured_score:.0f}" if ranking.measured_score is not None else "-"
    w(f"  node {node}: score {ranking.hot_score:.1f} predicted from its inputs (recorded {measured});"
      f" likely target {ranking.target} (score {ranking.target_score:.1f})\n")
    w(f"  min gain {settings.steering_min_gain:g} points, margin {settings.steering_margin:g} points\n")
    w("  RANK  VMI                                  CPU(cores)  MEMORY(GiB)  GAIN   HOT-AFTER  TARGET-AFTER\n")
    for i, c in enumerate(ranking.candidates, 1):
        me = "  <- this eviction" if c.key == vmi.key else ""
        w(f"  {i:<4}  {c.name:<36} {c.cpu_cores:>10.2f}  {c.memory_bytes / 2**30:>11.1f}  {c.gain:>5.1f}"
          f"  {c.hot_after:>9.1f}  {c.target_after:>12.1f}{me}\n")


def per_vm_choices(vmi: VMIRecord, pod_prefers: bool, settings: PolicySettings) -> str:
    """The VM's own choices, from annotations: prefer-no-eviction and the guard's overrides."""
    where = [w for w, on in (("vmi", vmi.prefer_no_eviction), ("pod", pod_prefers)) if on]
    if where:
        honored = "honoured" if settings.honor_prefer_no_eviction else "not honoured: honorPreferNoEviction false"
        parts = [f"prefer-no-eviction (on the {' and '.join(where)}; {honored}, descheduler evictions only)"]
    else:
        parts = ["prefer-no-eviction no"]
    parts.extend(override_notes(vmi, verbose=True) or [f"no {COOLDOWN_OVERRIDE.split('/')[0]} overrides"])
    return "; ".join(parts)


def override_notes(vmi: VMIRecord, verbose: bool = False) -> list[str]:
    o = vmi.overrides
    if o is None:
        return []
    notes = []
    if o.exempt:
        notes.append(f"{EXEMPT_OVERRIDE}: true (only the in-flight rules apply)" if verbose else "exempt")
    elif o.exempt_ignored:
        notes.append(f"{EXEMPT_OVERRIDE}: {o.exempt_ignored!r} ignored (only \"true\" exempts)" if verbose
                     else "exempt=ignored")
    if o.cooldown is not None:
        notes.append(f"{COOLDOWN_OVERRIDE}: {format_duration(o.cooldown)} (replaces migrationCooldown)" if verbose
                     else f"cooldown={format_duration(o.cooldown)}")
    elif o.cooldown_ignored:
        notes.append(f"{COOLDOWN_OVERRIDE}: {o.cooldown_ignored} ignored: bad duration (migrationCooldown used)" if verbose
                     else "cooldown=ignored(bad-duration)")
    return notes


def report(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    settings = policy_settings(args)
    now = clock(args)()
    write_report(load_store(args), now, settings, out)
    return 0


def vmi_state(store: ClusterStore, vmi, now: float, settings: PolicySettings) -> tuple[list, str]:
    migs = relevant_migrations(vmi, store.migrations(vmi.namespace, vmi.name))
    st = cooldown_state(vmi, migs, now, settings)
    exempt = vmi.overrides is not None and vmi.overrides.exempt
    stuck = stuck_evacuation(vmi, migs, store.node(vmi.evacuation_node), now, settings) if vmi.evacuation_node else None
    if stuck is not None:
        state = "evacuation-stuck"  # before "migrating": its retries keep failing
    elif describe_in_flight(vmi, migs, now):
        state = "migrating"
    elif vmi.evacuation_node:
        state = "evacuation-pending"
    elif exempt:
        state = "movable"
    elif vmi.prefer_no_eviction and settings.honor_prefer_no_eviction:
        state = "prefer-no-eviction"
    elif st is not None and st.active:
        state = "cooldown"
    else:
        state = "movable"
    notes = (["prefer-no-eviction"] if vmi.prefer_no_eviction else []) + override_notes(vmi)
    row = [
        vmi.namespace, vmi.name, vmi.node or "-",
        str(st.count) if st else "0",
        format_timestamp(st.last_end) if st else "-",
        format_duration(st.cooldown) if st else "-",
        format_duration(st.remaining) if st and st.active else "-",
        state,
        ",".join(notes),
    ]
    return row, state


def write_report(store: ClusterStore, now: float, settings: PolicySettings, out: TextIO) -> None:
    header = ["NAMESPACE", "VMI", "NODE", "MIGRATIONS", "LAST-END", "COOLDOWN", "REMAINING", "STATE", "NOTES"]
    rows = [vmi_state(store, v, now, settings)[0] for v in sorted(store.vmis(), key=lambda v: v.key)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        out.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n")
    out.write(f"\n{len(rows)} VMIs as of {format_timestamp(now)}; migrations counted in the last "
              f"{format_duration(settings.migration_history_window)}\n")
    write_node_cooldowns(store, now, settings, out)
    write_history(store, out)


HISTORY_PER_VMI = 5  # what KubeVirt keeps: the 5 most recent finalized VMIMs per VMI


def migration_history(store: ClusterStore, vmi, limit: int = HISTORY_PER_VMI) -> list[list[str]]:
    """The VMI's last migrations, newest first: VMIMs, plus its ``migrationState`` when that
    migration's VMIM is gone. Each row: ended, cause, priority, annotations, route, outcome, VMIM."""
    entries = []
    latest = vmi.migration
    vmims = store.migrations(vmi.namespace, vmi.name)
    for m in vmims:
        state = latest if latest is not None and latest.uid and latest.uid == m.uid else None
        source = m.source_node or (state.source_node if state else "")
        target = m.target_node or (state.target_node if state else "")
        if m.phase in FINAL_PHASES:
            outcome = m.phase
        else:
            outcome = f"in flight ({m.phase or 'queued'})"
        notes = [f"evacuationMigration={m.evacuation_node}" if m.evacuation_node else "",
                 f"workloadUpdateMigration={m.workload_update}" if m.workload_update else ""]
        when = m.end if m.finished else None
        entries.append((when if when is not None else m.start or m.created or 0.0, [
            format_timestamp(when) if when is not None else "-", cause_of(m), m.priority or "-",
            ",".join(n for n in notes if n) or "-", f"{source or '?'} -> {target or '?'}", outcome, m.name]))
    if latest is not None and latest.started and not any(m.uid == latest.uid for m in vmims if latest.uid):
        outcome = "in flight" if latest.in_flight else ("Failed" if latest.failed else "Succeeded")
        when = latest.end if latest.ended else None
        entries.append((when if when is not None else latest.start or 0.0, [
            format_timestamp(when) if when is not None else "-", "unknown", "-", "-",
            f"{latest.source_node or '?'} -> {latest.target_node or '?'}", outcome,
            "(VMIM gone; from the VMI's migrationState)"]))
    entries.sort(key=lambda e: e[0], reverse=True)
    return [row for _, row in entries[:limit]]


def write_history(store: ClusterStore, out: TextIO, limit: int = HISTORY_PER_VMI) -> None:
    """Why each VM moved: its last migrations with their cause (VMIM ``spec.priority``:
    system-maintenance = descheduler, system-critical = drain or evacuation, user-triggered = user)."""
    header = ["  VMI", "ENDED", "CAUSE", "PRIORITY", "ANNOTATIONS", "SOURCE -> TARGET", "OUTCOME", "MIGRATION"]
    rows = []
    for vmi in sorted(store.vmis(), key=lambda v: v.key):
        for row in migration_history(store, vmi, limit):
            rows.append([f"  {vmi.namespace}/{vmi.name}", *row])
    out.write(f"\nRecent migrations (newest first, up to {limit} per VMI; cause from the VMIM's spec.priority: "
              "system-maintenance = descheduler, system-critical = drain or evacuation, user-triggered = user):\n")
    if not rows:
        out.write("  none\n")
        return
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        out.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n")
