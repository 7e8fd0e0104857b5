"""The documentation: README is a front door, docs/ is the reference and builds strictly as a site.

The strict MkDocs build fails on a link to a page or an anchor that does not exist; the other checks keep the
repository self-contained (no path outside it, no machine's paths) and the user docs free of development history.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
USER_DOCS = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; reference belongs in docs/"
    text = "\n".join(lines)
    for needed in ("make run", "make test", "VirtualMachineInstance", "VirtualMachineInstanceMigration", "helm install"):
        assert needed in text, needed


def test_docs_has_reference_pages():
    pages = {p.name for p in DOCS.glob("*.md")}
    assert {"design.md", "decisions.md", "cli.md", "operations.md", "install.md"} <= pages
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in pages:
        assert page in nav, f"{page} is not in mkdocs.yml's nav"


def test_mkdocs_strict_build(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "decisions" / "index.html").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The check above can fail: the same build on a copy with one broken anchor is refused."""
    copy = tmp_path / "repo"
    (copy / "docs").mkdir(parents=True)
    for page in DOCS.glob("*.md"):
        (copy / "docs" / page.name).write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
    (copy / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), encoding="utf-8")
    shutil.copytree(ROOT / "tools", copy / "tools")  # the build's hook
    with (copy / "docs" / "testing.md").open("a", encoding="utf-8") as f:
        f.write("\nSee [nowhere](design.md#no-such-section).\n")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=copy, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "no-such-section" in run.stdout + run.stderr


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_docs_hold_no_development_history(doc):
    text = doc.read_text(encoding="utf-8")
    assert not re.search(r"\bissues? #?\d+", text, re.IGNORECASE), "issue numbers belong in notes, not user docs"
    assert not re.search(r"\bcommit [0-9a-f]{7,40}\b", text), "commit hashes belong in notes, not user docs"


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        assert (ROOT / path).exists(), f"README links to {target}, which does not exist"


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.fail("git ls-files failed: the checks on tracked files need a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_nothing_tracked_points_outside_the_repository_or_at_a_machine():
    outside = re.compile(r"\.\./shared|/w" r"ork/|/r" r"oot/|/t" r"mp/wt")
    offenders = []
    for path in _tracked_files():
        if not path.is_file() or path.suffix in {".png", ".gz"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if outside.search(text):
            offenders.append(path.relative_to(ROOT).as_posix())
    assert not offenders, f"tracked files pointing outside the repository or at a machine: {offenders}"


def test_the_license_is_the_full_apache_2_0_text():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    for part in ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "9. Accepting Warranty or Additional "
                 "Liability.", "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."):
        assert part in text, part
    assert len(text.splitlines()) > 190
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
