"""The candidate comparison: reads ``simulate --out DIR --format csv`` results and writes the table.

For every scenario and mode: descheduler-caused migrations, spread (std of the node score),
drain time, and the guard's invariants (VM cooldown, node budget, longest stall), as
mean (min–max) over seeds; then, for every guard mode, the goal checked against the best
plain setting of today (``app.sim.report.best_plain`` of ``ocp``, ``ocp-node1``,
``ocp-actuation``): 30% fewer descheduler-caused migrations, spread at most 1.05 times its,
drains at most 30 s slower.

    python -m bench.sim_candidates --dir sim-candidates [--readme docs/simulator.md]

The VM-cooldown check is independent of the guard's code path: from the migration
timeline (migrations.csv), a descheduler-caused migration that *started* before the
VM's previous finished migration (one that reached its ``migrationState``) ended plus the
cooldown the default settings give (15m floor or that migration's copy time, doubling per
migration in 48 h, 6 h cap). A migration right after a failed attempt of the same VM is
KubeVirt's retry of the same evacuation (the VMI stays marked), not a new eviction, and is
not checked. Its eviction came before its start, so this count is a lower bound of violations.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

from app.policy import PolicySettings, effective_cooldown
from app.sim.report import TODAY, best_plain

BEGIN, END = "<!-- candidates:begin -->", "<!-- candidates:end -->"
BASELINES = ("ocp",)
PLAIN = TODAY["1.8.3"][0]
GOAL_CUT = 0.30
SPREAD_LIMIT, DRAIN_LIMIT = 1.05, 30.0
STALE_AFTER = PolicySettings().evacuation_stale_after
BUDGET = PolicySettings().pending_evacuations_per_node


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def cell(xs, digits=0) -> str:
    vals = [x for x in xs if x is not None]
    if not vals:
        return "–"
    f = f"{{:.{digits}f}}"
    lo, hi = min(vals), max(vals)
    m = f.format(mean(vals))
    return m if lo == hi else f"{m} ({f.format(lo)}–{f.format(hi)})"


def cooldown_violations(rows: list[dict], settings: PolicySettings) -> int:
    by_vm: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_vm[r["vm"]].append(r)
    count = 0
    for moves in by_vm.values():
        moves.sort(key=lambda r: int(r["start_s"]))
        done: list[tuple[int, int]] = []  # (copy start, end) of the migrations that reached the VMI's migrationState
        previous_failed = False
        for r in moves:
            start = int(r["start_s"])
            ended = [d for d in done if d[1] <= start]
            # after a failed attempt the VMI stays marked and KubeVirt retries: no new eviction, nothing to check
            if r["cause"] == "descheduler" and ended and not previous_failed:
                last = max(ended, key=lambda d: d[1])
                n = sum(1 for d in ended if d[1] > start - settings.migration_history_window)
                _, cd = effective_cooldown(last[1] - last[0], n, settings)
                if start < last[1] + cd:
                    count += 1
            if r["end_s"] and r.get("copy_start_s"):
                done.append((int(r["copy_start_s"]), int(r["end_s"])))
            previous_failed = r["failed"] == "True"
    return count


def load(dir_: Path) -> dict:
    out = {}
    for summary in sorted([*dir_.glob("summary.json"), *dir_.glob("*/summary.json")]):
        data = json.loads(summary.read_text())
        rows: dict = defaultdict(list)
        mig = summary.parent / "migrations.csv"
        if mig.exists():
            with mig.open() as f:
                for r in csv.DictReader(f):
                    rows[(r["mode"], int(r["seed"]))].append(r)
        settings = PolicySettings()
        for mode, entry in data["modes"].items():
            entry["cooldown_violations"] = [cooldown_violations(rows.get((mode, s), []), settings)
                                            if mig.exists() else None for s in data["seeds"]]
        out[data["scenario"]] = data
    return out


def baseline_of(mode: str) -> str | None:
    base, _, variant = mode.partition("+")
    return base if variant and base in BASELINES else None


def goals(data: dict, mode: str) -> list[tuple[str, bool, str]]:
    """(goal, met, evidence) for one guard mode in one scenario."""
    modes = data["modes"]
    g = modes[mode]
    out = []
    best = best_plain(modes, PLAIN)
    refs = [(best, GOAL_CUT)] if best is not None else []
    for ref, cut in refs:
        r = modes[ref]
        gm, rm = mean(g["migrations_descheduler"]), mean(r["migrations_descheduler"])
        change = (gm - rm) / rm if rm else 0.0
        vol_ok, vol = change <= -cut, f"{change:+.0%} (goal -{cut:.0%})"
        sp = mean(g["spread_score"]) / mean(r["spread_score"])
        gd, rd = mean(g["drain_seconds"]), mean(r["drain_seconds"])
        dd = None if gd is None or rd is None else gd - rd
        sp_ok, dr_ok = sp <= SPREAD_LIMIT, dd is None or dd <= DRAIN_LIMIT
        drain = "" if dd is None else f", drain {dd:+.0f} s"
        out.append((f"vs the best plain setting `{ref}`", vol_ok and sp_ok and dr_ok, f"migrations {vol}, spread ×{sp:.3f}{drain}"))
    return out


def invariants(entry: dict) -> tuple[bool, str]:
    cv = sum(x or 0 for x in entry["cooldown_violations"])
    lv = max(entry["max_leaving_per_node"])
    st = max(entry.get("longest_stall_seconds") or [0])
    ok = cv == 0 and lv <= BUDGET and st <= STALE_AFTER
    return ok, f"cooldown violations {cv}, most leaving one node {lv} (budget {BUDGET}), longest stall {st} s"


def render(results: dict, command: str) -> str:
    intro = (f"Regenerated by `bench/sim_candidates.sh`, which runs `{command}` and then "
             "`python -m bench.sim_candidates`. Cells: mean (min–max) over the seeds.")
    lines = [BEGIN, "", intro, ""]
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, data in results.items():
        seeds = data["seeds"]
        header = ("| mode | descheduler migrations | spread (score std) | drain (s) | VM-cooldown violations "
                  "| most leaving one node | longest stall (s) |")
        lines += [f"**{name}** (seeds {seeds[0]}–{seeds[-1]})", "", header, "|---|---:|---:|---:|---:|---:|---:|"]
        for mode, e in data["modes"].items():
            lines.append(f"| `{mode}` | {cell(e['migrations_descheduler'])} | {cell(e['spread_score'], 2)} | "
                         f"{cell(e['drain_seconds'])} | {cell(e['cooldown_violations'])} | "
                         f"{cell(e['max_leaving_per_node'])} | {cell(e.get('longest_stall_seconds') or [None])} |")
        lines.append("")
        for mode in data["modes"]:
            if baseline_of(mode) is None:
                continue
            checks = goals(data, mode)
            inv_ok, inv = invariants(data["modes"][mode])
            parts = [f"{g}: {'met' if ok else 'MISSED'} ({ev})" for g, ok, ev in checks]
            parts.append(f"invariants: {'held' if inv_ok else 'BROKEN'} ({inv})")
            met = sum(ok for _, ok, _ in checks) + inv_ok
            tally[mode][0] += met
            tally[mode][1] += len(checks) + 1
            lines.append(f"- `{mode}`: " + "; ".join(parts) + ".")
        lines.append("")
    lines += ["**Goals met, all scenarios** (per scenario: vs the best plain setting, invariants)", "",
              "| guard mode | goals met |", "|---|---:|"]
    lines += [f"| `{m}` | {a} of {b} |" for m, (a, b) in tally.items()]
    lines += ["", END]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="the simulate --out directory (one subdirectory per scenario)")
    p.add_argument("--readme", help="replace the text between the candidates markers in this file")
    p.add_argument("--command", default="simulate ...", help="the simulate command line, for the text")
    a = p.parse_args(argv)
    text = render(load(Path(a.dir)), a.command)
    if a.readme:
        path = Path(a.readme)
        old = path.read_text(encoding="utf-8")
        if BEGIN not in old or END not in old:
            raise SystemExit(f"{path}: no {BEGIN} ... {END} markers")
        head, rest = old.split(BEGIN, 1)
        path.write_text(head + text + rest.split(END, 1)[1], encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
