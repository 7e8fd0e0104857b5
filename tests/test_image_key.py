"""`make image` (image/build.sh) reuses build/image's archive only while its key is unchanged: the key must cover
every input of the image, as the Dockerfile's COPY lines name them (image/ with its package lists and scripts, app/,
pyproject.toml, README.md, the pins), so that a change to any of them builds a new image, and nothing else."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import dockerfile
import pytest

ROOT = Path(__file__).resolve().parents[1]


def copied_sources() -> set[str]:
    """The paths of this tree the Dockerfile copies into its stages (first path part)."""
    out = set()
    for cmd in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if cmd.cmd == "COPY" and not any(f.startswith("--from") for f in cmd.flags):
            out |= {src.split("/")[0] for src in cmd.value[:-1]}
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in sorted(copied_sources()) + ["tests/test_image_key.py"]:
        src, dst = ROOT / name, tmp_path / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dst)
    return tmp_path


def key(tree: Path) -> str:
    out = subprocess.run(["bash", str(tree / "image" / "build.sh"), "--key"], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() and not out.stderr, out
    return out.stdout.strip()


def test_the_key_changes_with_every_input_of_the_image_and_nothing_else(tree: Path):
    first = key(tree)
    assert key(tree) == first  # stable
    # every input the Dockerfile copies: a changed byte in any of them is a new image
    inputs = {"app": "app/__init__.py", "image": "image/packages.runtime", "pyproject.toml": "pyproject.toml",
              "README.md": "README.md", "constraints.txt": "constraints.txt",
              "build-constraints.txt": "build-constraints.txt"}
    assert set(inputs) == copied_sources()
    seen = {first}
    for path in inputs.values():
        f = tree / path
        before = f.read_bytes()
        f.write_bytes(before + b"\n# changed\n")
        changed = key(tree)
        assert changed not in seen, path
        seen.add(changed)
        f.write_bytes(before)
        assert key(tree) == first, path
    # a new file in app/ too (a module the image would carry)
    (tree / "app" / "new_module.py").write_text("X = 1\n")
    assert key(tree) not in seen
    (tree / "app" / "new_module.py").unlink()
    # what the image does not hold: tests, bytecode caches
    (tree / "tests" / "test_image_key.py").write_text("changed\n")
    (tree / "app" / "__pycache__").mkdir(exist_ok=True)
    (tree / "app" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert key(tree) == first
