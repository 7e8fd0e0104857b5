"""``python -m tests.e2e.outcome``: the outcome run (``make e2e-outcome``).

The real descheduler alone, with the guard steering (reading the run's Prometheus), with the guard without
Prometheus, and with ``evictionLimits.node: 1``, each on its own real control plane (``run.py``), then the
simulator's mode for each (``run.MODEL_MODES``) on the same scenario (same nodes, VMs, placement, load, interval,
failure mix, compression), with the same figures. ``--seeds``: each seed is another roll of the scenario's dice
(placement, load, copy times, failures), run one after the other, real and model alike; each seed's result is kept
in ``build/e2e/outcome-seed<N>.json``, and ``build/e2e/outcome.json`` (which ``make e2e`` copies into
``summary.json``) and, with ``--docs``, the side-by-side table in docs/simulator.md between its ``e2e-outcome``
markers show every seed's rolls: the real rolls' mean and range beside the model's. ``--table-only`` runs nothing
and combines the seeds' results already there (seeds run in separate invocations)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from app.sim.engine import simulate
from app.sim.guards import parse_mode
from app.sim.metrics import balance, summarize
from app.sim.scenario import ScenarioError, load_scenario
from bench.doc import update
from tests.e2e.controlplane import ROOT, missing_binaries
from tests.e2e.outcome.figures import KEYS, differs, model_figures, retry_window
from tests.e2e.outcome.run import (CYCLE_OFFSET, MODEL_MODES, REAL_MODES, ModeRun, RealMode, aligned_cycles,
                                   run_mode)

SCENARIO = Path(__file__).with_name("scenario.yaml")
DRAWS = 30
OUTCOME = ROOT / "build" / "e2e" / "outcome.json"
BEGIN, END = "<!-- e2e-outcome:begin -->", "<!-- e2e-outcome:end -->"
LABELS = {
    "evictions_requested": "evictions the descheduler sent",
    "evictions_background": "... answered as running in the background",
    "evictions_refused": "... refused (the descheduler's error)",
    "migrations": "migrations started (failed ones included)",
    "max_leaving_per_node": "most VMs leaving one node at once",
    "evictions_during_migration": "evictions reaching KubeVirt for a migrating or marked VM",
    "cooldown_violations": "evacuations inside the plugin's cooldown",
    "spread_score": "balance: std of node scores (points, mean over samples)",
    "hot_node_seconds": "balance: node-seconds above the descheduler's threshold",
    "hot_longest_seconds": "balance: longest one node stayed above it (s)",
}


def model_run(scenario, mode: str, duration: float, draws: int = DRAWS, cycle_times: list[int] | None = None,
              balance_from: float = 0.0) -> dict:
    """The simulator's figures for ``mode``: the mean over ``draws`` rolls of its dice on the scenario's workload
    (candidate order, failures), with the range; the real run is one such roll. ``cycle_times``: the descheduler's
    cycles at these seconds (the real run's, as it logged them), so both saw the same moments of the run;
    ``balance_from``: the balance figures counted from this load sample on, as the real run's are."""
    runs = []
    for draw in range(draws):
        d = simulate(scenario, mode, hours=duration / 3600, draw=draw, cycle_times=cycle_times)
        figures = model_figures(summarize(d), [dataclasses.asdict(r) for r in d.runs], scenario.plugin,
                                retry_window(scenario.kubevirt))
        kept = [i for i, t in enumerate(d.sample_times) if t >= balance_from]
        figures.update(balance([d.sample_times[i] for i in kept], [d.node_scores[i] for i in kept], d.duration,
                               d.high))
        runs.append(figures)
    out: dict = {k: round(sum(r[k] for r in runs) / draws, 2) for k in runs[0]}
    out["range"] = {k: [min(r[k] for r in runs), max(r[k] for r in runs)] for k in KEYS}
    out["draws"] = draws
    return out


def outcome(scenario_path: Path, duration: float, workdir: Path, modes: list[str], form: str,
            parallel: bool = True, extra: dict[str, RealMode] | None = None, seed: int | None = None) -> dict:
    """Every mode on its own control plane; ``parallel``: at the same time (they use little CPU: the run is
    real time, mostly waiting). ``extra``: more modes by name (the pluggable descheduler). Each real mode is
    compared with its simulator mode run on the descheduler's own logged cycle times. ``seed``: instead of the
    scenario's."""
    scenario = load_scenario(scenario_path)
    if seed is not None:
        scenario = dataclasses.replace(scenario, seed=seed)
    extra = extra or {}
    names = list(modes) + list(extra)

    def one(name: str) -> ModeRun:
        print(f"outcome: mode {name}, {duration:.0f} s ...", flush=True)
        r = run_mode(name, scenario, scenario_path, workdir / name.replace("+", "-"), duration, extra.get(name))
        print(f"outcome: mode {name} done in {r.wall_seconds:.0f} s: {r.figures}", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=len(names) if parallel else 1) as pool:
        real = dict(zip(names, pool.map(one, names)))
    balance_from = max(r.balance_from for r in real.values())
    model = {name: model_run(scenario, r.model, duration, cycle_times=aligned_cycles(r.cycles),
                             balance_from=balance_from)
             for name, r in real.items()}
    for name, r in real.items():  # the real balance over the same samples as the model's
        if r.balance_from < balance_from:
            print(f"outcome: mode {name}: balance counted from {balance_from:.0f} s as the others", flush=True)

    def off(name: str, k: str) -> str | None:
        lo, hi = model[name]["range"][k]
        value = real[name].figures[k]
        if not lo <= value <= hi:
            return "outside the model's range"
        return "over 15% from the model's mean" if differs(value, model[name][k]) else None

    return {
        "form": form, "scenario": scenario.name, "seed": scenario.seed,
        "duration_s": duration, "interval_s": scenario.descheduler.interval,
        "modes": {name: r.figures for name, r in real.items()},
        "model_modes": {name: r.model for name, r in real.items()},
        "model": model,
        "descheduler_counted": {name: r.descheduler_counted for name, r in real.items()},
        "guard_decisions": {name: r.guard_reasons for name, r in real.items() if r.guard_reasons},
        "score_check": {name: r.score_check for name, r in real.items()},
        "notes": {name: r.notes for name, r in real.items() if r.notes},
        "descheduler_cycles": {name: r.cycles for name, r in real.items()},
        # how far the real cycles drifted from firstRun + k x interval (+0.5 s): the model ran on the real ones
        "cycle_drift": {name: _drift(r.cycles, scenario.descheduler) for name, r in real.items()},
        "cycle_check": {name: r.cycle_check for name, r in real.items()},
        "wall_seconds": {name: round(r.wall_seconds, 1) for name, r in real.items()},
        "balance_from_s": balance_from,
        "differences": {name: {k: why for k in KEYS if (why := off(name, k))} for name in real},
    }


def _drift(cycles: list[float], s) -> dict:
    planned = [s.first_run + k * s.interval + CYCLE_OFFSET for k in range(len(cycles))]
    gaps = [round(t - p, 2) for t, p in zip(cycles, planned)]
    return {"cycles": len(cycles), "outside_the_planned_second": sum(1 for g in gaps if not -0.5 < g < 0.5),
            "max_s": max(gaps, key=abs, default=0.0)}


def parse_seeds(text: str) -> list[int]:
    """``1-3``, ``1,4`` or ``2``: the seeds, in order, each once."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        if not part or not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"not a seed or range of seeds: {part!r}")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"empty range of seeds: {part!r}")
        out += [n for n in range(first, last + 1) if n not in out]
    return out


def seed_path(out: Path, seed: int) -> Path:
    return out.with_name(f"{out.stem}-seed{seed}{out.suffix}")


def combine(results: dict[int, dict]) -> dict:
    """The seeds' results in one: per mode, the real rolls' mean and range (one roll per seed) and the model's
    (its draws on every seed's workload: mean of the seeds' means, min of their minima, max of their maxima)."""
    seeds = sorted(results)
    first = results[seeds[0]]
    modes = [m for m in first["modes"] if all(m in results[s]["modes"] for s in seeds)]
    real, model = {}, {}
    for m in modes:
        rolls = [results[s]["modes"][m] for s in seeds]
        real[m] = {k: round(sum(r[k] for r in rolls) / len(rolls), 2) for k in KEYS}
        real[m]["range"] = {k: [min(r[k] for r in rolls), max(r[k] for r in rolls)] for k in KEYS}
        real[m]["rolls"] = len(rolls)
        per = [results[s]["model"][m] for s in seeds]
        model[m] = {k: round(sum(p[k] for p in per) / len(per), 2) for k in KEYS}
        model[m]["range"] = {k: [min(p["range"][k][0] for p in per), max(p["range"][k][1] for p in per)] for k in KEYS}
        model[m]["draws"] = sum(p["draws"] for p in per)
    return {
        "form": first["form"], "scenario": first["scenario"], "seeds": seeds,
        "duration_s": first["duration_s"], "interval_s": first["interval_s"],
        "model_modes": {m: first["model_modes"][m] for m in modes},
        "real": real, "model": model,
        "balance_from_s": {s: results[s]["balance_from_s"] for s in seeds},
        # each real roll outside its own seed's model range, or over 15% from that seed's model mean
        "differences": {s: {m: d for m, d in results[s]["differences"].items() if d} for s in seeds},
        "per_seed": {s: results[s] for s in seeds},
    }


def _cell(mean: float, lo: float, hi: float, rolls: int) -> str:
    return f"{mean:g}" if rolls == 1 else f"{mean:g} ({lo:g}–{hi:g})"


def table(result: dict) -> str:
    """The combined result (``combine``) side by side: per mode, the real rolls and the model's."""
    modes = list(result["real"])
    head = "| | " + " | ".join(f"real `{m}` | model `{result['model_modes'][m]}`" for m in modes) + " |"
    rule = "|---|" + "---:|---:|" * len(modes)
    rows = [head, rule]
    for key in KEYS:
        cells = []
        for m in modes:
            real, model = result["real"][m], result["model"][m]
            rlo, rhi = real["range"][key]
            lo, hi = model["range"][key]
            flags = ("*" if differs(real[key], model[key]) else "") + ("†" if not (lo <= rlo and rhi <= hi) else "")
            cells += [_cell(real[key], rlo, rhi, real["rolls"]) + (f" {flags}" if flags else ""),
                      f"{model[key]:g} ({lo:g}–{hi:g})"]
        rows.append(f"| {LABELS[key]} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def docs_section(result: dict, command: str) -> str:
    seeds = result["seeds"]
    per_seed = result["per_seed"]
    rolls = (f"seed {seeds[0]}, one real roll per mode" if len(seeds) == 1 else
             f"seeds {', '.join(map(str, seeds))}: {len(seeds)} real rolls per mode, each seed another roll of the "
             "scenario's dice (placement, load, copy times, failures); real: mean (min–max) of the rolls")
    balance_from = sorted(set(result["balance_from_s"].values()))
    return "\n".join([
        BEGIN,
        f"Generated by `{command}` ({result['scenario']}, {rolls}; {result['duration_s']:.0f} s of real "
        f"time per mode, the descheduler every {result['interval_s']} s). Model: mean (min–max) over "
        f"{next(iter(result['model'].values()))['draws']} rolls of its dice ({len(seeds)} × "
        f"{per_seed[seeds[0]]['model'][next(iter(result['model']))]['draws']} on each seed's workload), its "
        "descheduler cycling at the seconds the real one logged its cycles. * the real mean "
        "is more than 15% (and more than 1) away from the model's mean; † a real roll is outside the model's range. "
        f"Balance rows from the load sample at {'/'.join(f'{b:.0f}' for b in balance_from)} s on (the first "
        "Prometheus had for every node).",
        "",
        table(result),
        "",
        "Cycle by cycle: " + "; ".join(
            f"`{m}` {sum(per_seed[s]['cycle_check'][m]['consistent'] for s in seeds)} of "
            f"{sum(per_seed[s]['cycle_check'][m]['node_visits'] for s in seeds)} visits of an overutilised node in "
            f"{sum(per_seed[s]['cycle_check'][m]['cycles'] for s in seeds)} cycles"
            for m in result["real"])
        + " started, skipped and stopped exactly as the simulator's descheduler would have in the same state "
        "(limits, the in-flight entries at each eviction; `tests/e2e/outcome/cycles.py`); in "
        + ", ".join(f"{sum(per_seed[s]['cycle_check'][m].get('changed_mid_cycle', 0) for s in seeds)}"
                    for m in result["real"])
        + " of those visits an in-flight entry on the node came or went while the cycle ran.",
        "",
        END,
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.e2e.outcome", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", type=Path, default=SCENARIO, help="scenario YAML (default: the e2e outcome's)")
    p.add_argument("--duration", type=float, help="seconds of real time per mode (default: the scenario's hours)")
    p.add_argument("--modes", default=",".join(REAL_MODES), help=f"comma-separated, of {','.join(REAL_MODES)}")
    p.add_argument("--seeds", help="seeds to run, e.g. 1-3 or 1,4 (default: the scenario's); each one after the other")
    p.add_argument("--table-only", action="store_true",
                   help="run nothing: combine the results of --seeds already written beside --out")
    p.add_argument("--out", type=Path, default=OUTCOME, help="where outcome.json goes (each seed's beside it)")
    p.add_argument("--docs", type=Path, help="write the side-by-side table into this file between its markers")
    p.add_argument("--workdir", type=Path, help="keep the runs' files here (default: a temporary folder)")
    p.add_argument("--sequential", action="store_true", help="one mode after the other (default: side by side)")
    p.add_argument("--descheduler", type=Path, help="another descheduler build, run as the extra mode 'custom'")
    p.add_argument("--policy", type=Path, help="its DeschedulerPolicy file (Prometheus URL replaced by the run's)")
    p.add_argument("--model", default="upstream", help="the simulator's mode to compare 'custom' with")
    p.add_argument("--structure-only", action="store_true",
                   help="the policy names plugins the pinned descheduler lacks: check only its own keys")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        seeds = parse_seeds(args.seeds) if args.seeds else [None]
    except ValueError as e:
        p.error(f"--seeds: {e}")
    if args.table_only and seeds == [None]:
        p.error("--table-only needs --seeds")
    extra: dict[str, RealMode] = {}
    try:
        parse_mode(args.model)
    except ValueError as e:
        p.error(f"--model: {e}")
    if args.descheduler or args.policy:
        if not (args.descheduler and args.policy):
            p.error("--descheduler and --policy go together")
        if not os.access(args.descheduler, os.X_OK):
            p.error(f"--descheduler: {args.descheduler} is not an executable file")
        if not args.policy.is_file():
            p.error(f"--policy: {args.policy} is not a file")
        extra["custom"] = RealMode(guard=False, model=args.model, descheduler=args.descheduler.resolve(),
                                   policy=args.policy.resolve(), structure_only=args.structure_only)
    bad = [m for m in modes if m not in REAL_MODES]
    if bad or not modes:
        p.error(f"--modes: unknown {bad or 'none'}; expected {', '.join(REAL_MODES)}")
    if args.duration is not None and args.duration < 60:
        p.error("--duration: at least 60 seconds")
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"outcome: {e}", file=sys.stderr)
        return 2
    duration = args.duration or scenario.duration
    t0 = time.monotonic()
    results: dict[int, dict] = {}
    if args.table_only:
        for seed in seeds:
            path = seed_path(args.out, seed)
            if not path.is_file():
                print(f"outcome: no result for seed {seed} ({path}): run it first", file=sys.stderr)
                return 2
            results[seed] = json.loads(path.read_text())
    else:
        missing = missing_binaries()
        if missing:
            print(f"outcome: e2e binaries missing: {', '.join(missing)}; build them with `make e2e-bin`",
                  file=sys.stderr)
            return 2
        base = args.workdir or Path(tempfile.mkdtemp(prefix="kveg-outcome-"))
        for seed in seeds:
            workdir = base if seed is None else base / f"seed{seed}"
            one = outcome(args.scenario, duration, workdir, modes, "full" if args.duration is None else "custom",
                          parallel=not args.sequential, extra=extra, seed=seed)
            seed = one["seed"]
            results[seed] = one
            args.out.parent.mkdir(parents=True, exist_ok=True)
            seed_path(args.out, seed).write_text(json.dumps(one, indent=2) + "\n")
            print(f"outcome: seed {seed} done ({time.monotonic() - t0:.0f} s; its files in {workdir})", flush=True)
    result = combine(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"wrote {args.out} ({time.monotonic() - t0:.0f} s)")
    if args.docs:
        if args.table_only or (args.duration is None and not extra):
            command = "make e2e-outcome" + (f" SEEDS={args.seeds}" if args.seeds else "")
        else:
            command = "python -m tests.e2e.outcome " + " ".join(
                shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        update(args.docs, docs_section(result, command), BEGIN, END)
        print(f"updated {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
