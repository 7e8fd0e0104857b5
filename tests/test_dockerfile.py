"""The Dockerfile, parsed by BuildKit's own parser (the `dockerfile` package); no Docker engine is needed.

The image itself is not built here (no engine on these machines); these tests hold the Dockerfile to its promises:
multi-stage, slim base, pinned dependencies, nothing compiled or compilable in the final image, a numeric non-root
user, and `kubevirt-eviction-guard serve` as the entrypoint.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib import metadata
from pathlib import Path

import dockerfile
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|make|build-essential|python3?-dev|libc6?-dev|rustc|cargo)\b")


def stages() -> list[list[dockerfile.Command]]:
    """Commands grouped by stage (anything before the first FROM is the global ARG section, dropped)."""
    out: list[list[dockerfile.Command]] = []
    for cmd in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if cmd.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(cmd)
    return out


def global_args() -> dict[str, str]:
    args = {}
    for cmd in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if cmd.cmd == "FROM":
            break
        if cmd.cmd == "ARG" and "=" in cmd.value[0]:
            k, v = cmd.value[0].split("=", 1)
            args[k] = v
    return args


def base_image(stage: list[dockerfile.Command]) -> str:
    image = stage[0].value[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: global_args()[m.group(1)], image)


def test_multi_stage_on_a_slim_python_base():
    all_stages = stages()
    assert len(all_stages) >= 2
    build, final = all_stages[0], all_stages[-1]
    assert [v.lower() for v in build[0].value[1:]] == ["as", "build"]
    for stage in (build, final):
        assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base_image(stage)), base_image(stage)
    # the Python the constraints were frozen with is the image's Python
    import sys

    assert base_image(final).startswith(f"python:{sys.version_info.major}.{sys.version_info.minor}-")


def test_final_stage_copies_only_the_virtualenv_from_the_build_stage():
    final = stages()[-1]
    copies = [c for c in final if c.cmd in ("COPY", "ADD")]
    assert copies, "the final stage gets the application from the build stage"
    for c in copies:
        assert c.cmd == "COPY" and "--from=build" in c.flags, c.original
    assert [c.value for c in copies] == [("/opt/guard", "/opt/guard")]


def test_no_build_tools_in_the_final_image():
    final = stages()[-1]
    for cmd in final:
        if cmd.cmd == "RUN":
            text = " ".join(cmd.value)
            assert "apt-get install" not in text and "apk add" not in text, cmd.original
            assert not COMPILERS.search(text), cmd.original
    build_runs = " ".join(" ".join(c.value) for c in stages()[0] if c.cmd == "RUN")
    assert "--only-binary=:all:" in build_runs, "dependencies come as wheels: nothing to compile"
    assert "pip uninstall --yes pip" in build_runs, "no installer left in the copied virtualenv"


def test_runs_as_a_numeric_non_root_user():
    users = [c for c in stages()[-1] if c.cmd == "USER"]
    assert users, "the final stage sets USER"
    uid, _, gid = users[-1].value[0].partition(":")
    assert uid.isdigit() and int(uid) > 0, "numeric, so that runAsNonRoot can verify it"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    last = max(i for i, c in enumerate(stages()[-1]) if c.cmd == "USER")
    assert not [c for c in stages()[-1][last:] if c.cmd == "RUN"], "nothing runs as root after USER"
    values = (ROOT / "charts" / "kubevirt-eviction-guard" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values, "the chart's default UID is the image's"


def test_entrypoint_is_the_serve_command():
    (entrypoint,) = [c for c in stages()[-1] if c.cmd == "ENTRYPOINT"]
    assert entrypoint.json, "exec form: the guard is PID 1 and receives SIGTERM itself"
    assert list(entrypoint.value) == ["kubevirt-eviction-guard", "serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubevirt-eviction-guard"] == "app.cli:main"
    assert not [c for c in stages()[-1] if c.cmd == "CMD"], "the chart passes serve's flags as args"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt: not an exact pin: {line!r}"
            out[canonical(name)] = version
    return out


def runtime_closure() -> set[str]:
    """The runtime dependencies of the project and, transitively, theirs (as installed here)."""
    todo = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonical(req.name)
        for extra in req.extras:
            for sub in metadata.requires(req.name) or ():
                r = Requirement(sub)
                if r.marker and r.marker.evaluate({"extra": extra}):
                    todo.append(r)
        if name in seen:
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.requires(req.name) or ()]
    return seen


def test_dependencies_are_installed_from_exact_pins():
    runs = " ".join(" ".join(c.value) for c in stages()[0] if c.cmd == "RUN")
    install = next(part for part in runs.split("&&") if "/opt/guard/bin/pip install" in part)
    words = shlex.split(install)
    assert "--constraint" in words and words[words.index("--constraint") + 1] == "constraints.txt"
    copied = [c for c in stages()[0] if c.cmd == "COPY"]
    assert any("constraints.txt" in c.value for c in copied)
    pinned = pins()
    missing = sorted(runtime_closure() - set(pinned))
    assert missing == [], f"runtime dependencies without a pin in constraints.txt: {missing}"
    # every pin satisfies pyproject's ranges (a stale constraints.txt would fail the image build)
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(spec)
        version = pinned[canonical(req.name)]
        assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version} outside {req.specifier}"


@pytest.mark.parametrize("path", [".venv", "tests", "charts", ".git"])
def test_build_context_leaves_out_what_the_image_does_not_need(path):
    assert path in (ROOT / ".dockerignore").read_text().split()
