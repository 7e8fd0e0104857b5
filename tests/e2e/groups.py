"""``make e2e``: the end-to-end groups side by side, each in a pytest process of its own.

The groups are the conftest's (``e2e_group``: by the shared resource a test's fixtures start, else by its file), so
a new test lands in its group without a list here. Most of an end-to-end run is waiting on the real components'
own pace (kubelet's probe periods, KubeVirt's retry backoff, the descheduler's cycles), not computing: the groups
overlap that waiting. Separate processes rather than pytest-xdist workers: each session fixture then starts in the
one process whose tests use it, with nothing to carry between processes but the summaries, which are merged here.

Groups are packed into ``--jobs`` processes, longest first (LPT), by each group's wall time in the last run
(``build/e2e/group-times.json``; the test count the first time). Each process writes its own summary and log under
``build/e2e/parts/N/``; they are printed as each process ends, and merged into ``build/e2e/summary.json`` (every
check once: a check shared by tests of several processes passes only if it passed in all). The output ends with
each group's wall time. Usage: ``python -m tests.e2e.groups [--jobs N] [PYTEST ARGS]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import OUTCOME, SUMMARY
from tests.e2e.controlplane import ROOT

PARTS = SUMMARY.parent / "parts"
TIMES = SUMMARY.parent / "group-times.json"
PYTEST = [sys.executable, "-m", "pytest", "-m", "e2e", str(ROOT / "tests" / "e2e")]


def collect(args: list[str]) -> dict[str, list[str]]:
    """The selected tests by group (a collect-only run of pytest with the same arguments)."""
    PARTS.mkdir(parents=True, exist_ok=True)
    out = PARTS / "groups.json"
    done = subprocess.run([*PYTEST, "--collect-only", "-q", "--e2e-groups-out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        sys.exit(f"e2e: collecting the tests failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr}")
    return json.loads(out.read_text())


def plan(groups: dict[str, list[str]], jobs: int) -> list[list[str]]:
    """Groups packed into at most ``jobs`` processes: the longest (last run's time, else test count) first, each
    into the process with the least work so far."""
    try:
        last = {name: g["seconds"] for name, g in json.loads(TIMES.read_text()).items()}
    except (OSError, ValueError, KeyError, TypeError):
        last = {}
    estimate = {name: last.get(name, 10.0 * len(tests)) for name, tests in groups.items()}
    slots: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(min(jobs, len(groups)))]
    for name in sorted(groups, key=lambda n: -estimate[n]):
        i = min(range(len(slots)), key=lambda k: slots[k][0])
        slots[i] = (slots[i][0] + estimate[name], slots[i][1] + [name])
    return [names for _, names in slots if names]


def merge(parts: list[Path]) -> dict:
    """One summary from the processes' summaries: each check once, every group's time."""
    summary: dict = {}
    checks: dict[str, dict] = {}
    groups: dict[str, dict] = {}
    for path in parts:
        if not path.exists():
            continue
        part = json.loads(path.read_text())
        for check in part.pop("checks", []):
            prev = checks.get(check["name"])
            checks[check["name"]] = check if prev is None else {
                "name": check["name"], "passed": prev["passed"] and check["passed"],
                "detail": f"{prev['detail']}; {check['detail']}"}
        groups.update(part.pop("groups", {}))
        for key, value in part.items():
            summary.setdefault(key, value)  # binaries' versions (the same in every part), the node's, the outcome
    summary["checks"] = list(checks.values())
    summary["groups"] = groups
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="pytest processes at once (default 4)")
    opts, args = parser.parse_known_args(argv)
    started = time.monotonic()
    shutil.rmtree(PARTS, ignore_errors=True)
    groups = collect(args)
    if not groups:
        print("e2e: no end-to-end test selected")
        return 5
    processes = []
    for i, names in enumerate(plan(groups, opts.jobs)):
        d = PARTS / str(i)
        d.mkdir(parents=True)
        log = (d / "pytest.log").open("w")
        cmd = [*PYTEST, *(f"--e2e-group={n}" for n in names), *args]
        env = {**os.environ, "E2E_SUMMARY": str(d / "summary.json"), "E2E_PART": str(i)}
        print(f"e2e: process {i}: {', '.join(f'{n} ({len(groups[n])} tests)' for n in names)}", flush=True)
        processes.append((i, names, d, log, time.monotonic(),
                          subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)))
    results = {}
    try:
        pending = list(processes)
        while pending:
            for entry in list(pending):
                i, names, d, log, t0, proc = entry
                if proc.poll() is None:
                    continue
                pending.remove(entry)
                log.close()
                results[i] = proc.returncode
                print(f"\n{'=' * 30} process {i} ({', '.join(names)}): exit {proc.returncode} after "
                      f"{time.monotonic() - t0:.0f} s {'=' * 30}", flush=True)
                sys.stdout.write((d / "pytest.log").read_text())
                sys.stdout.flush()
            time.sleep(0.5)
    finally:
        for *_, proc in processes:  # interrupted: the processes end their sessions (their fixtures' tear-down)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for *_, proc in processes:
            proc.wait()
    summary = merge([d / "summary.json" for _, _, d, *_ in processes])
    for _, _, d, *_ in processes:
        if (d / OUTCOME.name).exists():
            shutil.copy(d / OUTCOME.name, OUTCOME)
    missing = sorted(set(groups) - set(summary["groups"]))
    summary["parts"] = [{"groups": names, "exit": results.get(i)} for i, names, *_ in processes]
    SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")
    if summary["groups"]:
        TIMES.write_text(json.dumps(summary["groups"], indent=2) + "\n")
    print(f"\n{'=' * 30} end-to-end groups (wall time) {'=' * 30}")
    for name, g in sorted(summary["groups"].items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"{name:<26} {g['seconds']:7.1f} s  {g['tests']:3d} tests  {'passed' if g['passed'] else 'FAILED'}")
    for name in missing:
        print(f"{name:<26}       ?    {len(groups[name]):3d} tests  NOT RUN (its process: see above)")
    failed = [i for i, rc in results.items() if rc != 0]
    print(f"make e2e: {time.monotonic() - started:.0f} s wall, {len(processes)} processes, "
          f"{'all passed' if not failed and not missing else 'FAILED: processes ' + str(failed)}; "
          f"summary {SUMMARY}")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
