"""``kubevirt-eviction-guard simulate``: scenarios x modes x seeds in worker processes, then the
comparison as a Markdown table, ``summary.json``, plots and (optionally) CSV time series."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from app.sim.engine import simulate
from app.sim.guards import mode_description, parse_mode
from app.sim.metrics import series, summarize
from app.sim.options import MODES
from app.sim.report import (
    BEGIN,
    END,
    out_readme,
    readme_section,
    render,
    summary_json,
    update_readme,
    write_csv,
    write_plots,
    write_summary,
)
from app.sim.scenario import ScenarioError, parse_scenario, read_scenario, scenario_with_seed


def check_out(out: Path, force: bool) -> None:
    """Before any run: ``--out`` is a folder this process can write, and empty unless ``--force``."""
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ScenarioError(f"--out {out}: not empty (an earlier run's results?); --force replaces its files, "
                            "or choose another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise ScenarioError(f"--out {out}: cannot write there: {e.strerror or e}") from None


def check_readme(path: Path) -> None:
    """Before any run: ``--readme`` is an existing Markdown file, writable, with the markers once each."""
    if path.suffix.lower() not in (".md", ".markdown"):
        raise ScenarioError(f"--readme {path}: not a Markdown file (.md)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"--readme {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ScenarioError(f"--readme {path}: needs one {BEGIN} line and, after it, one {END} line "
                            "(the section between them is replaced)")
    if not os.access(path, os.W_OK):
        raise ScenarioError(f"--readme {path}: not writable")


def parse_modes(text: str) -> list[str]:
    modes = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    if not modes:
        raise ScenarioError("--modes: empty")
    for m in modes:
        try:
            parse_mode(m)
        except ValueError as e:
            raise ScenarioError(f"--modes: {e}") from None
    return modes


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo or hi - lo > 10_000:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise ScenarioError(f"--seeds: expected e.g. 1-10 or 1,4,7, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds):
        raise ScenarioError(f"--seeds: expected e.g. 1-10 or 1,4,7, got {text!r}")
    return list(dict.fromkeys(seeds))


def parse_guard_set(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--guard-set: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _scenario(data: Any, source: str, seed: int | None, snapshot: str | None):
    sc = scenario_with_seed(data, source, seed)
    if snapshot:
        from app.sim.snapshot import apply_snapshot

        sc = apply_snapshot(sc, snapshot)
    return sc


def run_one(task: tuple) -> tuple[dict, dict, float]:
    """One mode, one seed (runs in a worker process): (summary, time series, wall seconds)."""
    data, source, seed, mode, hours, guard_overrides, snapshot = task
    sc = _scenario(data, source, seed, snapshot)
    t0 = time.perf_counter()
    d = simulate(sc, mode, hours, guard_overrides)
    wall = time.perf_counter() - t0
    return summarize(d), series(d), wall


def run_matrix(tasks: list[tuple], jobs: int) -> list[tuple[dict, dict, float]]:
    if jobs <= 1 or len(tasks) <= 1:
        return [run_one(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_one, tasks, chunksize=1))


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        modes = parse_modes(args.modes)
        if args.hours is not None and args.hours <= 0:
            raise ScenarioError("--hours: must be positive")
        if args.jobs < 1:
            raise ScenarioError("--jobs: must be at least 1")
        guard_overrides = parse_guard_set(args.guard_set)
        sources = [(read_scenario(p), p) for p in args.scenario]
        plans = []
        for data, path in sources:
            base = parse_scenario(data, path)  # validates the file once, here
            if args.seeds:
                seeds = parse_seeds(args.seeds)
            else:
                seeds = [args.seed if args.seed is not None else base.seed]
            probe = _scenario(data, path, seeds[0], args.snapshot)
            for m in modes:  # a bad --guard-set or guard block stops here, not in a worker
                spec = parse_mode(m)
                if spec.guard is not None:
                    from app.sim.guards import guard_settings_for
                    from app.sim.scenario import guard_settings

                    guard_settings(guard_settings_for(spec, probe.guard_raw, guard_overrides), "--guard-set")
            plans.append((data, path, probe, seeds))
        if args.readme:
            check_readme(Path(args.readme))
        if args.out:
            check_out(Path(args.out), args.force)
    except ScenarioError as e:
        print(f"kubevirt-eviction-guard simulate: {e}", file=sys.stderr)
        return 2
    tasks, index = [], []
    for data, path, probe, seeds in plans:
        for seed in seeds:
            for m in modes:
                tasks.append((data, path, seed, m, args.hours, guard_overrides, args.snapshot))
                index.append((probe.name, seed, m))
    plots = plotting_available()
    if args.out and not plots:
        print(f"kubevirt-eviction-guard simulate: no plots: matplotlib is not installed; install it with: "
              f"{install_command()}", file=sys.stderr)
    t0 = time.perf_counter()
    results = run_matrix(tasks, args.jobs)
    total_wall = time.perf_counter() - t0
    summaries, files = [], {}
    for data, path, probe, seeds in plans:
        runs = {(s, m): r for (name, s, m), r in zip(index, results) if name == probe.name}
        summary = summary_json(probe, seeds, modes, runs, args.hours)
        summaries.append(summary)
        out.write(render(summary) + "\n")
        walls = [runs[(s, m)][2] for s in seeds for m in modes]
        out.write(f"wall time per run: mean {sum(walls) / len(walls):.1f}s, max {max(walls):.1f}s\n\n")
        if args.out:
            folder = "" if len(plans) == 1 else probe.name
            out_dir = Path(args.out) / folder
            written = [write_summary(summary, out_dir)]
            if plots:
                written += write_plots(summary, runs, seeds[0], modes, out_dir) or []
            if args.format == "csv":
                written += write_csv(runs, out_dir)
            files[folder] = [p.name for p in written]
            out.write("wrote " + ", ".join(str(p) for p in written) + ("" if plots else
                      f" (no plots: matplotlib is not installed; install it with: {install_command()})") + "\n\n")
    out.write(f"{len(tasks)} runs in {total_wall:.1f}s wall with {args.jobs} worker(s)\n")
    command = command_line(args)
    if args.out:
        readme = Path(args.out) / "README.md"
        readme.write_text(out_readme(summaries, {m: mode_description(m) for m in modes}, command, files), encoding="utf-8")
        out.write(f"wrote {readme}: what each mode is, the files, and the model's simplifications\n")
    else:
        out.write("what each mode is and the model's simplifications: docs/simulator.md "
                  "(--out DIR also writes them to DIR/README.md)\n")
    if args.readme:
        update_readme(Path(args.readme), readme_section(summaries, command))
        out.write(f"updated {args.readme}\n")
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The command as a user would type it again (the paths as given)."""
    command = "kubevirt-eviction-guard simulate " + " ".join(f"--scenario {shlex.quote(p)}" for p in args.scenario)
    if args.seeds:
        command += f" --seeds {args.seeds}"
    if args.modes != ",".join(MODES):
        command += f" --modes {args.modes}"
    if args.hours:
        command += f" --hours {args.hours:g}"
    if args.out:
        command += f" --out {shlex.quote(args.out)}"
    return command


def plotting_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def install_command() -> str:
    """The exact command that installs the plotting extra into the Python running this."""
    spec = "matplotlib"
    try:
        for req in importlib.metadata.requires("kubevirt-eviction-guard") or ():
            if req.startswith("matplotlib") and 'extra == "sim"' in req:
                spec = req.split(";")[0].strip()
    except importlib.metadata.PackageNotFoundError:
        pass
    return f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(spec)}"
