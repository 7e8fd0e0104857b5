"""The numbers a run is judged by, computed from what it observed (``RunData``)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from app.sim.engine import RunData

REPEAT_WINDOW = 6 * 3600  # a VM moved again within 6 hours of its previous move
ALERT_WINDOW, ALERT_COUNT = 24 * 3600, 12  # KubeVirtVMIExcessiveMigrations


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def repeat_moves(runs, window: int = REPEAT_WINDOW) -> int:
    """Successful migrations that started less than ``window`` after the same VM's
    previous successful migration ended."""
    by_vm: dict[str, list] = defaultdict(list)
    for r in runs:
        if r.end is not None and not r.failed:
            by_vm[r.vm].append(r)
    count = 0
    for moves in by_vm.values():
        moves.sort(key=lambda r: r.start)
        count += sum(1 for a, b in zip(moves, moves[1:]) if b.start - a.end < window)
    return count


def alerting_vms(runs) -> int:
    """VMs with 12 or more successful migrations within some 24 h."""
    ends: dict[str, list[int]] = defaultdict(list)
    for r in runs:
        if r.end is not None and not r.failed:
            ends[r.vm].append(r.end)
    out = 0
    for times in ends.values():
        times.sort()
        if any(times[i + ALERT_COUNT - 1] - times[i] <= ALERT_WINDOW for i in range(len(times) - ALERT_COUNT + 1)):
            out += 1
    return out


def drain_seconds(d: RunData) -> int | None:
    """Until the last drain of the run finished (the longest one); None without drains or
    when one did not finish within the run."""
    if not d.drains or any(dr.done is None for dr in d.drains):
        return None
    return max(dr.done - dr.start for dr in d.drains)  # type: ignore[operator]


def balance(sample_times: list[float], scores: list[dict[str, int]], end: float, high: float) -> dict:
    """Balance over a run, from the node scores (percent) as the descheduler reads them at each load sample:
    ``spread_score``, the mean over samples of their standard deviation; ``hot_node_seconds``, node-seconds above
    the descheduler's threshold (more than ``high`` points over the mean: the nodes it calls overutilised), a
    sample counting until the next one (the last until ``end``); ``hot_longest_seconds``, the longest one node
    stayed above it without a break. Computed the same way for the simulator and for a real run."""
    stds, hot, longest = [], 0.0, 0.0
    since: dict[str, float] = {}
    for i, (t, row) in enumerate(zip(sample_times, scores)):
        nxt = sample_times[i + 1] if i + 1 < len(sample_times) else end
        if not row:
            continue
        values = list(row.values())
        mean_ = sum(values) / len(values)
        stds.append(math.sqrt(sum((v - mean_) ** 2 for v in values) / len(values)))
        over = {n for n, v in row.items() if v > mean_ + high}
        for n in list(since):
            if n not in over:
                del since[n]
        for n in over:
            since.setdefault(n, t)
            longest = max(longest, nxt - since[n])
        hot += len(over) * max(0.0, nxt - t)
    return {"spread_score": round(mean(stds), 3), "hot_node_seconds": round(hot), "hot_longest_seconds": round(longest)}


def summarize(d: RunData) -> dict:
    runs = d.runs
    days = d.duration / 86400
    per_vm = Counter(r.vm for r in runs)
    hot = balance(d.sample_times, d.node_scores, d.duration, d.high)
    return {
        "migrations_total": len(runs),
        "migrations_descheduler": sum(1 for r in runs if r.cause == "descheduler"),
        "migrations_per_vm_day_mean": round(len(runs) / d.vm_count / days, 3) if days else 0.0,
        "migrations_per_vm_day_max": round(max(per_vm.values(), default=0) / days, 3) if days else 0.0,
        "repeat_migrations_6h": repeat_moves(runs),
        "spread_score": round(mean(d.score_std), 3),
        "spread_cpu": round(100 * mean(d.cpu_std), 3),
        "hot_node_seconds": hot["hot_node_seconds"],
        "hot_longest_seconds": hot["hot_longest_seconds"],
        "drain_seconds": drain_seconds(d),
        "stall_seconds": d.stall_seconds,
        "stall_max_one_vm_seconds": max(d.stall_by_vm.values(), default=0),
        "longest_stall_seconds": d.longest_stall_seconds,
        "blocked_by_in_flight_seconds": d.blocked_seconds,
        "max_leaving_per_node": d.max_leaving_per_node,
        "stall_node_max_seconds": max(d.stall_by_node.values(), default=0),
        "stall_node_seconds": sum(d.stall_by_node.values()),
        "stall_nodes": len(d.stall_by_node),
        "failed_migrations": sum(1 for r in runs if r.failed),
        "failures_by_kind": dict(sorted(Counter(r.failure for r in runs if r.failed).items())),
        "evictions": {k: d.answers.get(k, 0) for k in ("allowed", "background", "error")},
        "evictions_redirected": d.redirected,
        "in_flight_lapsed": d.lapsed,
        "in_flight_counted_without_request": d.cached_hits,
        "vms_alerting_12_in_24h": alerting_vms(runs),
        "vms_migrated": len(per_vm),
        "concurrent_descheduler_evacuations": d.concurrent_evacuations,
        "descheduler_cycles": d.descheduler_cycles,
        "descheduler_cycles_with_action": d.active_cycles,
        "descheduler_outcomes": dict(sorted(d.descheduler_outcomes.items())),
        "policy_calls": d.policy_calls,
        "evacuations_cancelled": d.evacuations_cancelled,
        "drains": [
            {"node": dr.node, "how": dr.how, "start_s": dr.start,
             "seconds": None if dr.done is None else dr.done - dr.start, "vms_at_start": dr.vms_at_start,
             "answers": dict(sorted(dr.answers.items()))}
            for dr in d.drains
        ],
    }


def series(d: RunData, step: int = 600) -> dict:
    """Time series for plots and CSV: migrations per hour by cause, spread every ``step``
    seconds, and every migration (the per-VM timeline)."""
    hours = max(1, -(-d.duration // 3600))
    per_hour = {"descheduler": [0] * hours, "drain": [0] * hours}
    for r in d.runs:
        per_hour[r.cause][min(hours - 1, r.start // 3600)] += 1
    every = max(1, step // d.sample_interval)
    return {
        "migrations_per_hour": per_hour,
        "spread": [
            {"t": t, "score_std": round(s, 2), "cpu_std": round(100 * c, 2)}
            for t, s, c in list(zip(d.sample_times, d.score_std, d.cpu_std))[::every]
        ],
        "migrations": [
            {"vm": r.vm, "cause": r.cause, "start": r.start, "end": r.end, "source": r.source, "target": r.target,
             "failed": r.failed, "failure": r.failure, "copy_start": r.copy_start}
            for r in sorted(d.runs, key=lambda r: (r.start, r.vm))
        ],
    }
