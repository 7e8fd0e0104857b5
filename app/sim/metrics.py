"""The numbers a run is judged by, computed from what it observed (``RunData``)."""

from __future__ import annotations

from collections import defaultdict

from app.sim.engine import RunData

REPEAT_WINDOW = 3600  # a VM moved again within an hour of its previous move
REBALANCE_BASELINE = 3600  # spread before a load step is averaged over this long
REBALANCE_MARGIN = 1.2  # rebalanced: the max-min spread, averaged over a window, back within 120% of that
REBALANCE_WINDOW = 900  # the window (15 minutes: one sample is too noisy to call a cluster balanced)
EVACUATION_ACCEPTED = "kubevirt_evacuation"  # the answer that starts a migration: not a refusal


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def mean(values: list[float]) -> float:
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


def time_to_rebalance(d: RunData, step: int) -> int | None:
    """Seconds from a load step to the end of the first 15-minute window (wholly after
    the step) whose mean max-min CPU spread is within 120% of the mean over the hour
    before the step; None if that never happens in the run."""
    times, spread = d.sample_times, d.cpu_range
    before = [s for t, s in zip(times, spread) if step - REBALANCE_BASELINE <= t < step]
    if not before:
        return None
    limit = REBALANCE_MARGIN * mean(before)
    after = [(t, s) for t, s in zip(times, spread) if t >= step]
    per_window = max(1, REBALANCE_WINDOW // d.sample_interval)
    total = 0.0
    for i, (t, s) in enumerate(after):
        total += s
        if i >= per_window:
            total -= after[i - per_window][1]
        if i + 1 >= per_window and total / per_window <= limit:
            return t - step
    return None


def summarize(d: RunData) -> dict:
    runs = d.runs
    days = d.duration / 86400
    failed = sum(1 for r in runs if r.failed)
    refused = {k: v for k, v in sorted(d.descheduler_outcomes.items()) if k != EVACUATION_ACCEPTED}
    pct = [100 * x for x in d.cpu_std]
    rng = [100 * x for x in d.cpu_range]
    return {
        "migrations": len(runs),
        "migrations_per_vm_per_day": round(len(runs) / d.vm_count / days, 3) if days else 0.0,
        "migrations_by_cause": dict(sorted(_count(r.cause for r in runs).items())),
        "succeeded": sum(1 for r in runs if r.end is not None and not r.failed),
        "failed": failed,
        "still_running_at_end": sum(1 for r in runs if r.end is None),
        "vms_migrated": len({r.vm for r in runs}),
        "repeat_moves_within_1h": repeat_moves(runs),
        "concurrent_descheduler_evacuations": d.concurrent_evacuations,
        "descheduler_cycles": d.descheduler_cycles,
        "descheduler_cycles_with_action": d.active_cycles,
        "descheduler_eviction_requests": d.eviction_requests,
        "descheduler_background_evictions": d.background_evictions,
        "descheduler_refusals_by_reason": refused,
        "policy_calls": d.policy_calls,
        "cpu_spread_std_pp": {"mean": round(mean(pct), 2), "p95": round(percentile(pct, 0.95), 2)},
        "cpu_spread_range_pp": {"mean": round(mean(rng), 2), "p95": round(percentile(rng, 0.95), 2)},
        "memory_spread_std_pp_mean": round(100 * mean(d.mem_std), 2),
        "rebalance_after_step_s": [
            {"step_at_s": s, "seconds": time_to_rebalance(d, s)} for s in d.step_times
        ],
        "drains": [
            {"node": dr.node, "start_s": dr.start, "seconds": None if dr.done is None else dr.done - dr.start,
             "vms_at_start": dr.vms_at_start,
             "answers": dict(sorted(dr.answers.items()))}
            for dr in d.drains
        ],
        "migrations_per_hour": _per_hour(runs, d.duration),
    }


def _count(items) -> dict:
    out: dict = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _per_hour(runs, duration: int) -> list[int]:
    hours = [0] * max(1, -(-duration // 3600))
    for r in runs:
        hours[min(len(hours) - 1, r.start // 3600)] += 1
    return hours
