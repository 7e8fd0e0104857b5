"""Where the docs' generated figures came from, and whether the code they measure has changed since.

Every generated section of the docs (between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``) is followed by a
stamp written by this tool: a comment with the hash of the section's inputs (the generating command's code and the
code it measures, as git blob ids of the tracked files under ``INPUTS``), and one line for the reader with the
command, the commit, the date and the machine.

Whether a section's inputs changed since its stamp is computed where the figures are read, never enforced: ``make
figures-check`` lists the sections whose inputs changed (and which files), and the docs build (``make docs``, through
``tools/mkdocs_hooks.py``) shows the same under each such section. ``make test`` checks only that every section is
there and stamped, so a refactor of measured code never waits for hours of regenerated figures.

    python -m tools.figures check             # every section present and stamped (exit 1 if not); which are stale
    python -m tools.figures stamp NAME...     # after regenerating: the generating targets of the Makefile run it

``make figures`` regenerates every one of them (each target stamps what it wrote).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the guard as served: what the request-path and client figures measure
SERVING = ["app/admission", "app/policy", "app/domain", "app/cluster", "app/effects", "app/serve.py",
           "app/transport", "app/metrics.py", "app/logs.py", "app/startup.py", "app/config.py",
           "pyproject.toml"]
SIMULATOR = ["app/sim", "app/policy", "app/domain", "app/effects/history.py", "examples/scenarios"]


@dataclass(frozen=True)
class Section:
    doc: str
    command: str
    inputs: tuple[str, ...]


SECTIONS = {
    "bench": Section("docs/performance.md", "make bench (three times), then make bench-doc",
                     ("bench/run.py", "bench/plain.py", "bench/loadgen.py", "bench/bodies.py", "bench/mixes.py", "bench/baseline.py",
                      "bench/state.py", "bench/decide.py", "bench/effects_latency.py", "bench/floor.py", "bench/wrk.lua",
                      "bench/doc.py", *SERVING)),
    "watch": Section("docs/performance.md", "make bench-watch",
                     ("bench/watch_bench.py", "bench/doc.py", "tests/fakeapi", "app/cluster", "app/domain", "pyproject.toml")),
    "faults": Section("docs/reliability.md", "make reliability",
                      ("tests/test_api_faults.py", "tests/fakeapi", "tests/live_support.py", "bench/doc.py", *SERVING)),
    "replicas": Section("docs/reliability.md", "make reliability",
                        ("tests/test_replicas.py", "tests/fakeapi", "tests/live_support.py", "bench/doc.py", *SERVING)),
    "attacks": Section("docs/reliability.md", "make reliability",
                       ("bench/attacks.py", "bench/doc.py", *SERVING)),
    "simulate": Section("docs/simulator.md", "make simulate", (*SIMULATOR, "Makefile")),
    "e2e-outcome": Section("docs/simulator.md", "make e2e-outcome",
                           ("tests/e2e/outcome", "tests/e2e/actor", "tests/e2e/kubevirt.py", "e2e/go.mod",
                            "e2e/kubevirt/go.mod", *SIMULATOR, *SERVING)),
    "candidates": Section("docs/simulator.md", "bench/sim_candidates.sh",
                          ("bench/sim_candidates.sh", "bench/sim_candidates.py", *SIMULATOR)),
}
STAMP = re.compile(r"<!-- figures:(?P<name>[\w-]+) inputs=(?P<hash>[0-9a-f]{16}) commit=(?P<commit>[0-9a-f]+) -->\n"
                   r"(?P<line>\*.*\*)\n")


def git(*args: str, root: Path = ROOT, data: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True, input=data).stdout


def blob_ids(inputs: tuple[str, ...], commit: str | None = None, root: Path = ROOT) -> dict[str, str]:
    """path -> git blob id of each tracked file under ``inputs``: in the working tree, or at ``commit``."""
    if commit is not None:
        out = git("ls-tree", "-r", commit, "--", *inputs, root=root)
        return {line.split("\t", 1)[1]: line.split()[2] for line in out.splitlines()}
    paths = [p for p in git("ls-files", "-z", "--", *inputs, root=root).split("\0") if p and (root / p).is_file()]
    ids = git("hash-object", "--stdin-paths", root=root, data="\n".join(paths) + "\n").split() if paths else []
    return dict(zip(paths, ids, strict=True))


def inputs_hash(inputs: tuple[str, ...], commit: str | None = None, root: Path = ROOT) -> str:
    blobs = blob_ids(inputs, commit, root)
    return hashlib.sha256("".join(f"{p} {b}\n" for p, b in sorted(blobs.items())).encode()).hexdigest()[:16]


def machine() -> str:
    mem = ""
    try:
        kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
        mem = f", {round(kib / 1024 / 1024)} GiB"
    except (OSError, AttributeError):
        pass
    return f"{os.cpu_count()} CPUs{mem}"


def stamp_text(name: str, digest: str, commit: str, line: str) -> str:
    return f"<!-- figures:{name} inputs={digest} commit={commit} -->\n{line}\n"


def end_marker(name: str) -> str:
    return f"<!-- {name}:end -->\n"


def find(text: str, name: str) -> tuple[int, re.Match | None]:
    """Where the section ends (after its end marker) and its stamp right there, if any."""
    end = text.index(end_marker(name)) + len(end_marker(name))
    m = STAMP.match(text, end)
    return end, m if m is not None and m.group("name") == name else None


def write_stamp(name: str, digest: str, commit: str, line: str, root: Path = ROOT) -> None:
    path = root / SECTIONS[name].doc
    text = path.read_text(encoding="utf-8")
    end, old = find(text, name)
    new = stamp_text(name, digest, commit, line)
    path.write_text(text[:end] + new + text[old.end() if old else end:], encoding="utf-8")


def stamp(name: str, root: Path = ROOT) -> None:
    """The figures were just regenerated from this tree."""
    s = SECTIONS[name]
    commit = git("rev-parse", "--short", "HEAD", root=root).strip()
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--", *s.inputs, root=root).strip() else ""
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    line = (f"*Generated by `{s.command}` at commit `{commit}`{dirty} on {when}, on a machine with {machine()}.*")
    write_stamp(name, inputs_hash(s.inputs, root=root), commit, line, root)


def changed_since(name: str, commit: str, root: Path = ROOT) -> list[str]:
    s = SECTIONS[name]
    then, now = blob_ids(s.inputs, commit, root), blob_ids(s.inputs, root=root)
    return sorted(p for p in set(then) | set(now) if then.get(p) != now.get(p))


def summarize(paths: list[str], most: int = 6) -> str:
    folders: list[str] = []
    for p in paths:
        top = "/".join(p.split("/")[:2]) if p.count("/") >= 2 else p
        if top not in folders:
            folders.append(top)
    return ", ".join(f"`{f}`" for f in folders[:most]) + (", ..." if len(folders) > most else "")


def problems(root: Path = ROOT) -> list[str]:
    """What is missing: a section or its stamp (``make test`` fails on these)."""
    out = []
    for name, s in SECTIONS.items():
        text = (root / s.doc).read_text(encoding="utf-8")
        if end_marker(name) not in text:
            out.append(f"{s.doc}: no {name} section")
        elif find(text, name)[1] is None:
            out.append(f"{s.doc}: the {name} section has no stamp (python -m tools.figures stamp {name})")
    return out


@dataclass(frozen=True)
class Staleness:
    name: str
    commit: str  # where the figures were generated
    changed: tuple[str, ...]  # inputs changed since (tracked files)


def staleness(root: Path = ROOT) -> list[Staleness]:
    """The stamped sections whose inputs no longer hash to their stamp, with what changed."""
    out = []
    for name, s in SECTIONS.items():
        text = (root / s.doc).read_text(encoding="utf-8")
        if end_marker(name) not in text:
            continue
        _, m = find(text, name)
        if m is not None and m.group("hash") != inputs_hash(s.inputs, root=root):
            try:
                changed = changed_since(name, m.group("commit"), root)
            except subprocess.CalledProcessError:  # the stamp's commit is not in this clone's history
                changed = []
            out.append(Staleness(name, m.group("commit"), tuple(changed)))
    return out


def stale_note(st: Staleness) -> str:
    """One line for the reader of a stale section."""
    what = summarize(list(st.changed)) if st.changed else "its inputs"
    return (f"The code these figures measure changed after `{st.commit}` ({what}); "
            f"regenerate them with `{SECTIONS[st.name].command}`.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.figures", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check")
    check.add_argument("--strict", action="store_true", help="also exit 1 when a section's inputs changed since")
    sub.add_parser("stamp").add_argument("names", nargs="+", choices=sorted(SECTIONS))
    args = p.parse_args(argv)
    if args.command == "check":
        found = problems()
        stale = staleness()
        for line in found:
            print(line)
        for st in stale:
            print(f"{SECTIONS[st.name].doc}: {st.name}: {stale_note(st)}")
        if not found and not stale:
            print("every generated section is stamped and current")
        return 1 if found or (args.strict and stale) else 0
    for name in args.names:
        stamp(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
