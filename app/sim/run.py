"""``kubevirt-eviction-guard simulate``: run scenarios in each mode, print and save the comparison."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import TextIO

from app.sim.engine import RunData, simulate
from app.sim.guards import MODES
from app.sim.metrics import summarize
from app.sim.report import SIMPLIFICATIONS, readme_section, render, targets, update_readme, write_json, write_plots
from app.sim.scenario import Scenario, ScenarioError, load_scenario


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", action="append", required=True, metavar="FILE",
                   help="scenario YAML (examples/scenarios/); repeat for several")
    p.add_argument("--hours", type=float, help="simulated hours (default: the scenario's)")
    p.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    p.add_argument("--out", metavar="DIR", help="write SCENARIO.json (and PNG plots with matplotlib) here")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of off,plugin,guard")
    p.add_argument("--readme", metavar="FILE", help="write the comparison into this README between its markers")


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise ScenarioError(f"--modes: expected a comma-separated subset of {','.join(MODES)}, got {text!r}")
    return list(dict.fromkeys(modes))


def run_scenario(scenario: Scenario, modes: list[str], hours: float | None = None) -> tuple[dict, dict[str, RunData], dict]:
    """(result for JSON, raw runs per mode, wall seconds per mode)."""
    runs: dict[str, RunData] = {}
    wall: dict[str, float] = {}
    for mode in modes:
        t0 = time.perf_counter()
        runs[mode] = simulate(scenario, mode, hours)
        wall[mode] = time.perf_counter() - t0
    first = next(iter(runs.values()))
    result = {
        "scenario": scenario.name,
        "description": scenario.description,
        "seed": scenario.seed,
        "hours": first.duration / 3600,
        "vms": len(scenario.vms),
        "nodes": len(scenario.nodes),
        "descheduler_interval_s": scenario.descheduler.interval,
        "modes": {mode: summarize(d) for mode, d in runs.items()},
        "simplifications": list(SIMPLIFICATIONS),
    }
    result["targets"] = targets(result)
    return result, runs, wall


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        modes = parse_modes(args.modes)
        if args.hours is not None and args.hours <= 0:
            raise ScenarioError("--hours: must be positive")
        scenarios = [load_scenario(path, seed=args.seed) for path in args.scenario]
    except ScenarioError as e:
        print(f"kubevirt-eviction-guard simulate: {e}", file=sys.stderr)
        return 2
    results = []
    for sc in scenarios:
        result, runs, wall = run_scenario(sc, modes, args.hours)
        results.append(result)
        out.write(render(result) + "\n")
        out.write("wall time: " + ", ".join(f"{m} {s:.1f}s" for m, s in wall.items()) + "\n\n")
        if args.out:
            out_dir = Path(args.out)
            path = write_json(result, out_dir)
            plots = write_plots(result, runs, out_dir)
            written = [str(path)] + [str(p) for p in plots or []]
            out.write("wrote " + ", ".join(written) + ("" if plots is not None else
                      " (no plots: install the 'sim' extra for matplotlib)") + "\n\n")
    out.write("Simplifications:\n" + "".join(f"- {s}\n" for s in SIMPLIFICATIONS))
    if args.readme:
        command = "kubevirt-eviction-guard simulate " + " ".join(
            f"--scenario {shlex.quote(p)}" for p in args.scenario
        ) + (f" --hours {args.hours:g}" if args.hours else "") + (f" --seed {args.seed}" if args.seed is not None else "") + (
            f" --out {shlex.quote(args.out)}" if args.out else "")
        update_readme(Path(args.readme), readme_section(results, command))
        out.write(f"updated {args.readme}\n")
    return 0
