"""The Dockerfile, parsed by BuildKit's own parser (the `dockerfile` package); no Docker engine is needed.

The image is not built here (`make image` builds it, `make e2e` runs it); these tests hold the Dockerfile and
`make image` (image/build.sh) to one recipe, the files of image/: the same Debian release, package lists, scripts
and configuration; dependencies pinned with hashes, nothing compiled, compilable or installable in the final image
(no pip, setuptools or ensurepip), a numeric non-root user, and `kubevirt-eviction-guard serve` as the entrypoint.
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


IMAGE = ROOT / "image"


def runs(stage: list[dockerfile.Command]) -> str:
    return " && ".join(" ".join(c.value) for c in stage if c.cmd == "RUN")


def script(name: str) -> str:
    """An image/ script without its comments: what runs."""
    return "\n".join(line for line in (IMAGE / name).read_text().splitlines() if not line.lstrip().startswith("#"))


def packages(name: str) -> list[str]:
    return [w for line in (IMAGE / name).read_text().splitlines() for w in line.partition("#")[0].split()]


def image_config() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (IMAGE / "config").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_multi_stage_on_debian_bookworm_slim_like_make_image():
    all_stages = stages()
    assert len(all_stages) == 2
    build, final = all_stages
    assert [v.lower() for v in build[0].value[1:]] == ["as", "build"]
    for stage in (build, final):
        assert re.fullmatch(r"debian:bookworm-slim(@sha256:[0-9a-f]{64})?", base_image(stage)), base_image(stage)
    # make image builds the same Debian release, slimmed as the official slim image is
    recipe = (IMAGE / "build.sh").read_text()
    assert "SUITE=bookworm" in recipe and "--variant=minbase" in recipe and "path-exclude=/usr/share/$d/*" in recipe
    # the Python the constraints were compiled with is the image's Python (bookworm's python3 is 3.11)
    import sys

    assert sys.version_info[:2] == (3, 11)


def test_dockerfile_and_make_image_run_the_same_steps():
    build, final = stages()
    assert runs(build).split(" && ") == ["sh /image/install-packages.sh /image/packages.build",
                                         "sh image/build-venv.sh /src"]
    assert runs(final).split(" && ") == ["sh /image/install-packages.sh /image/packages.runtime",
                                         "sh /image/runtime-setup.sh", "rm -rf /image"]
    recipe = (IMAGE / "build.sh").read_text()
    assert '--include="$(list image/packages.build)"' in recipe
    assert 'chroot "$1" sh /src/image/build-venv.sh /src' in recipe
    assert '--include="$(list image/packages.runtime)"' in recipe
    assert 'chroot "$1" sh /image/runtime-setup.sh' in recipe
    assert "cp -a '$work/build/opt/guard'" in recipe  # the virtualenv alone crosses from the build stage
    # mmdebstrap installs with --no-install-recommends semantics, as install-packages.sh does
    assert "--no-install-recommends" in script("install-packages.sh")


def test_dockerfile_says_what_image_config_says():
    final = stages()[-1]
    config = image_config()
    (user,) = [c.value[0] for c in final if c.cmd == "USER"]
    (entrypoint,) = [c for c in final if c.cmd == "ENTRYPOINT"]
    env = [f"{k}={v}" for c in final if c.cmd == "ENV" for k, v in zip(c.value[::2], c.value[1::2])]
    expose = [v for c in final if c.cmd == "EXPOSE" for v in c.value]
    assert config["USER"] == [user]
    assert config["ENTRYPOINT"] == [" ".join(entrypoint.value)]
    assert config["ENV"] == env
    assert config["EXPOSE"] == expose


def test_final_stage_copies_only_the_virtualenv_from_the_build_stage():
    final = stages()[-1]
    copies = [c for c in final if c.cmd in ("COPY", "ADD")]
    from_build = [c for c in copies if "--from=build" in c.flags]
    assert [c.value for c in from_build] == [("/opt/guard", "/opt/guard")]
    for c in copies:
        assert c.cmd == "COPY", c.original
        if c not in from_build:  # the recipe's own files, removed in the same step that runs them
            assert all(v.startswith("image/") for v in c.value[:-1]) and c.value[-1] == "/image/", c.original
    assert "rm -rf /image" in runs(final)


def test_no_build_tools_in_the_final_image():
    for name in ("packages.runtime", "packages.build"):
        assert not [p for p in packages(name) if COMPILERS.fullmatch(p)], name
    assert packages("packages.runtime") == ["python3"]
    venv = script("build-venv.sh")
    assert "--only-binary=:all:" in venv, "dependencies come as wheels: nothing to compile"
    assert "python3 -m venv --without-pip /opt/guard" in venv, "no installer in the copied virtualenv"
    # nor in the base system's Python (Debian's python3 has no pip; ensurepip's module goes), checked at build time
    setup = script("runtime-setup.sh")
    assert "ensurepip" in setup and "set -eu" in setup
    for module in ("pip", "setuptools", "ensurepip"):
        assert f'! python3 -c "import {module}"' in setup


def test_runs_as_a_numeric_non_root_user():
    users = [c for c in stages()[-1] if c.cmd == "USER"]
    assert users, "the final stage sets USER"
    uid, _, gid = users[-1].value[0].partition(":")
    assert uid.isdigit() and int(uid) > 0, "numeric, so that runAsNonRoot can verify it"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    assert f"--uid {uid} --gid {gid or uid}" in script("runtime-setup.sh")
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
    lines = re.sub(r"\\\n", " ", script("build-venv.sh")).splitlines()
    installs = [shlex.split(line) for line in lines if " install " in line]
    by_file = {words[words.index("-r") + 1]: words for words in installs if "-r" in words}
    assert set(by_file) == {"constraints.txt", "build-constraints.txt"}
    for words in by_file.values():
        assert "--require-hashes" in words and "--no-deps" in words  # exactly the pinned files, hashes checked
    assert by_file["constraints.txt"][by_file["constraints.txt"].index("--python") + 1] == "/opt/guard/bin/python"
    project = [words for words in installs if "-r" not in words]
    assert project and all("--no-index" in w and "--no-deps" in w for w in project)  # only the wheel built here
    copied = [c for c in stages()[0] if c.cmd == "COPY"]
    assert any({"constraints.txt", "build-constraints.txt"} <= set(c.value) for c in copied)
    assert "constraints.txt build-constraints.txt" in (IMAGE / "build.sh").read_text()  # make image copies them too
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
