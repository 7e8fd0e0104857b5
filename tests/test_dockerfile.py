"""The Dockerfile, parsed by BuildKit's own parser (the `dockerfile` package); no Docker engine is needed.

The image itself is not built here (no engine on these machines); these tests hold the Dockerfile to its promises:
multi-stage, a slim base pinned by digest, dependencies pinned with hashes, nothing compiled, compilable or
installable in the final image (no pip, setuptools or wheel), a numeric non-root user, and
`kubevirt-eviction-guard serve` as the entrypoint.
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
        # a slim tag, pinned by the digest of its image index: a moved tag cannot change what is built
        assert re.fullmatch(r"python:3\.\d+(\.\d+)?-slim(-\w+)?@sha256:[0-9a-f]{64}", base_image(stage)), base_image(stage)
    # the Python the constraints were compiled with is the image's Python
    import sys

    assert base_image(final).startswith(f"python:{sys.version_info.major}.{sys.version_info.minor}.")


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
    assert "python -m venv --without-pip /opt/guard" in build_runs, "no installer in the copied virtualenv"
    final_runs = " ".join(" ".join(c.value) for c in final if c.cmd == "RUN")
    # nor in the base image's own Python (pip, setuptools, wheel, ensurepip's bundled copies), checked at build time
    assert "pip uninstall --yes pip setuptools wheel" in final_runs and "ensurepip" in final_runs
    assert '! python -c "import pip"' in final_runs and '! python -c "import setuptools"' in final_runs


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


def pins(file: str = "constraints.txt") -> dict[str, str]:
    """name -> version; every requirement an exact pin with at least one sha256 hash (pip-compile's format)."""
    out = {}
    for requirement in re.sub(r"\\\n", " ", (ROOT / file).read_text()).splitlines():
        requirement = requirement.strip()
        if not requirement or requirement.startswith("#"):
            continue
        spec, *hashes = requirement.split(" --hash=")
        name, sep, version = spec.strip().partition("==")
        assert sep, f"{file}: not an exact pin: {requirement!r}"
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h.strip()) for h in hashes), f"{file}: {name}"
        out[canonical(name)] = version.strip()
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


def test_dependencies_are_installed_from_exact_pins_with_hashes():
    runs = " ".join(" ".join(c.value) for c in stages()[0] if c.cmd == "RUN")
    installs = [shlex.split(part) for part in runs.split("&&") if " install " in part]
    by_file = {words[words.index("-r") + 1]: words for words in installs if "-r" in words}
    assert set(by_file) == {"constraints.txt", "build-constraints.txt"}
    for words in by_file.values():
        assert "--require-hashes" in words and "--no-deps" in words  # exactly the pinned files, hashes checked
    assert by_file["constraints.txt"][by_file["constraints.txt"].index("--python") + 1] == "/opt/guard/bin/python"
    project = [words for words in installs if "-r" not in words]
    assert project and all("--no-index" in w and "--no-deps" in w for w in project)  # only the wheel built here
    copied = [c for c in stages()[0] if c.cmd == "COPY"]
    assert any({"constraints.txt", "build-constraints.txt"} <= set(c.value) for c in copied)
    assert set(pins("build-constraints.txt")) == {"setuptools"}
    assert "pytest" not in pins(), "test tools stay out of the image"
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
