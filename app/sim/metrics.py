"""The numbers a run is judged by, computed from what it observed (``RunData``)."""

from __future__ import annotations

from collections import defaultdict

from app.sim.engine import RunData

REPEAT_WINDOW = 3600  # a VM moved again within an hour of its previous move
REBALANCE_BASELINE = 3600  # spread before a load step is averaged over this long
REBALANCE_MARGIN = 1.1  # rebalanced: max-min spread back within 110% of that average...
REBALANCE_HOLD = 10  # ...for this many consecutive samples
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
    """Seconds from a load step until the max-min CPU spread is back within 110% of
    its mean over the hour before the step, held for 10 samples; None if never."""
    times, spread = d.sample_times, d.cpu_range
    before = [s for t, s in zip(times, spread) if step - REBALANCE_BASELINE <= t < step]
    if not before:
        return None
    limit = REBALANCE_MARGIN * mean(before)
    run_start = None
    held = 0
    for t, s in zip(times, spread):
        if t < step:
            continue
        if s <= limit:
            if held == 0:
                run_start = t
            held += 1
            if held >= REBALANCE_HOLD:
                return run_start - step
        else:
            held = 0
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
