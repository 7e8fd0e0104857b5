"""``explain`` and ``report``: the decisions and numbers, for humans at a terminal."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from app.cluster.store import ClusterStore
from app.policy import cooldown_state, decide
from app.policy.cooldown import finished_migrations, relevant_migrations
from app.policy.decide import describe_in_flight, is_leaving, leaving_age
from app.policy.model import DESCHEDULER_REQUESTER, EvictionRequest, PolicySettings
from app.domain.usage import UsageSnapshot
from app.policy.decide import steering_ranking
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
      f"vmi={pod.vmi_name or '-'} eviction-in-progress={pod.eviction_in_progress}\n")
    w(f"node:     {pod.node or '-'} draining={(node.drain or 'no') if node else 'unknown'}\n")
    vmi = store.vmi(pod.namespace, pod.vmi_name)
    if vmi is None:
        return
    migs = relevant_migrations(vmi, store.migrations(vmi.namespace, vmi.name))
    w(f"vmi:      node={vmi.node or '-'} evacuationNodeName={vmi.evacuation_node or '-'}"
      f" in-flight={describe_in_flight(vmi, migs, now) or 'none'}\n")
    finished = sorted(finished_migrations(vmi, migs), key=lambda f: f.end)
    w(f"finished migrations ({len(finished)}):\n")
    for f in finished:
        dur = format_duration(f.end - f.start) if f.start is not None else "unknown"
        w(f"  ended {format_timestamp(f.end)} ({format_duration(now - f.end)} ago), took {dur}, uid {f.uid or '-'}\n")
    st = cooldown_state(vmi, migs, now, settings)
    if st is not None:
        w(f"cooldown: base {format_duration(st.base)} = max(migrationCooldown {format_duration(settings.migration_cooldown)},"
          f" last duration {format_duration(st.last_duration) if st.last_duration is not None else 'unknown'});"
          f" x2^({max(st.count, 1)}-1) for {st.count} in {format_duration(settings.migration_history_window)};"
          f" cap {format_duration(settings.max_migration_cooldown) if settings.max_migration_cooldown else 'none'}"
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
    if usage is not None:
        write_ranking(pod.node, vmi, store, now, settings, usage, w)


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


def report(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    settings = policy_settings(args)
    now = clock(args)()
    write_report(load_store(args), now, settings, out)
    return 0


def vmi_state(store: ClusterStore, vmi, now: float, settings: PolicySettings) -> tuple[list, str]:
    migs = relevant_migrations(vmi, store.migrations(vmi.namespace, vmi.name))
    st = cooldown_state(vmi, migs, now, settings)
    if describe_in_flight(vmi, migs, now):
        state = "migrating"
    elif vmi.evacuation_node:
        state = "evacuation-pending"
    elif st is not None and st.active:
        state = "cooldown"
    else:
        state = "movable"
    row = [
        vmi.namespace, vmi.name, vmi.node or "-",
        str(st.count) if st else "0",
        format_timestamp(st.last_end) if st else "-",
        format_duration(st.cooldown) if st else "-",
        format_duration(st.remaining) if st and st.active else "-",
        state,
    ]
    return row, state


def write_report(store: ClusterStore, now: float, settings: PolicySettings, out: TextIO) -> None:
    header = ["NAMESPACE", "VMI", "NODE", "MIGRATIONS", "LAST-END", "COOLDOWN", "REMAINING", "STATE"]
    rows = [vmi_state(store, v, now, settings)[0] for v in sorted(store.vmis(), key=lambda v: v.key)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        out.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n")
    out.write(f"\n{len(rows)} VMIs as of {format_timestamp(now)}; migrations counted in the last "
              f"{format_duration(settings.migration_history_window)}\n")
