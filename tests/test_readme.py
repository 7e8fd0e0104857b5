"""The README's commands work as written after `make run`: its shell blocks, executed.

The curl block runs against the guard serving the demo snapshot as `make run` starts it (here on a free port and
with certificates in a temporary folder: the only two things rewritten); the command-line blocks run as written
from the repository, with the virtualenv's `kubevirt-eviction-guard` (the one `make run` and `make test` create).
The Helm blocks need a cluster: they are the end-to-end tests' business.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from tests.guard_process import GuardProcess

ROOT = Path(__file__).resolve().parents[1]
VENV_CLI = ".venv/bin/kubevirt-eviction-guard"


def shell_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def block_with(needle: str) -> str:
    (block,) = [b for b in shell_blocks() if needle in b]
    return block


def commands(block: str) -> list[str]:
    """The block's commands, continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def cli() -> str:
    """The README's path to the command: the virtualenv's, when this runs in it (make test); else this Python's."""
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        assert (ROOT / VENV_CLI).exists()
        return VENV_CLI
    return f"{sys.executable} -m app"


def test_the_curl_examples_answer_as_the_readme_says(tmp_path) -> None:
    block = block_with("curl ")
    g = GuardProcess(tmp_path, ["--snapshot", str(ROOT / "examples" / "demo-snapshot.yaml"),
                                "--now", "2026-11-21T12:00:00Z"])  # what `make run` serves
    try:
        g.wait_healthy()
        answers = []
        for command in commands(block):
            assert command.startswith("curl ") and "https://127.0.0.1:8443/" in command and "certs/ca.crt" in command
            command = command.replace("127.0.0.1:8443", f"127.0.0.1:{g.port}").replace(
                "certs/ca.crt", str(g.certs["ca"]))
            r = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            answers.append(json.loads(r.stdout)["response"])
    finally:
        g.stop()
    denied, allowed = answers
    assert "denied: 429 TooManyRequests, reason cooldown, \"retry in 10m0s\"" in block
    assert denied["allowed"] is False and denied["status"]["code"] == 429
    assert denied["auditAnnotations"]["reason"] == "cooldown" and "retry in 10m0s" in denied["status"]["message"]
    assert allowed["allowed"] is True


def test_explain_and_report_run_as_written() -> None:
    explain, report = commands(block_with("explain -n vms"))
    assert explain.startswith(VENV_CLI) and report.startswith(VENV_CLI)
    r = subprocess.run(["bash", "-c", explain.replace(VENV_CLI, cli())], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr == ""  # the README: exit 1 when it would deny
    assert "decision: DENY (429 TooManyRequests)  reason: cooldown" in r.stdout
    r = subprocess.run(["bash", "-c", report.replace(VENV_CLI, cli())], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("NAMESPACE ")


def test_the_certs_command_of_mode_3_runs_as_written_and_refuses_to_overwrite(tmp_path) -> None:
    """Run where the README is read (any folder): it writes into its own temporary folder, nothing where it runs."""
    lines = commands(block_with("certificates.mode=secret"))
    assert "OUT=$(mktemp -d)" in lines
    (command,) = [c for c in lines if " certs " in c]
    command = command.replace(VENV_CLI, str(ROOT / VENV_CLI) if cli() == VENV_CLI else cli())
    here, temp = tmp_path / "here", tmp_path / "tmp"
    here.mkdir(), temp.mkdir()
    script = f"OUT=$(mktemp -d)\n{command}\necho \"$OUT\""
    r = subprocess.run(["bash", "-c", script], cwd=here, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(temp)})
    assert r.returncode == 0, r.stderr
    assert not list(here.iterdir())
    out = Path(r.stdout.strip())
    assert out.parent == temp
    ca = x509.load_pem_x509_certificate(base64.b64decode((out / "cabundle.b64").read_text()))
    assert ca.subject.rfc4514_string() == "CN=guard-kubevirt-eviction-guard-ca"
    key = (out / "guard-certs" / "tls.key").read_bytes()
    again = f"OUT={out}\n" + command.replace('> "$OUT/cabundle.b64"', '> "$OUT/again.b64"')
    r = subprocess.run(["bash", "-c", again], cwd=here, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--force replaces them" in r.stderr
    assert (out / "guard-certs" / "tls.key").read_bytes() == key


@pytest.mark.parametrize("needle", ["make run", "explain -n vms", "curl "])
def test_the_blocks_exist(needle) -> None:
    """The blocks the tests above run are still in the README (a renamed block would not be silently untested)."""
    assert block_with(needle)
