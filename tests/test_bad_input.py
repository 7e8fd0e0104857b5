"""Bad input on the command line: one line on stderr, a non-zero exit, no traceback, before any work,
and nothing lost (an existing file is never overwritten without --force).

``serve`` is refused with the port it would listen on taken all along (``taken_port``): a refusal that came after
binding would name the port instead, so each case shows its flag is checked before anything is bound. No case
times the refusal (a busy machine is slow, not wrong): the subprocess timeouts only catch a hang.

Most cases run ``main`` in this process (fast); the ones about the process itself (argparse's exit,
a key the process may not read, a port in use) run it as a subprocess."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.transport.tls import issue_certs, write_certs
from tests.guard_process import free_port

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "examples" / "demo-snapshot.yaml")
SCENARIO = str(ROOT / "examples" / "scenarios" / "pilot.yaml")
NOW = "2026-11-21T12:00:00Z"
TAKEN = ""  # the port of taken_port, as serve's --port


@pytest.fixture(scope="module", autouse=True)
def taken_port():
    """A port something else listens on, for every ``serve`` below (as ``make run`` in another terminal)."""
    global TAKEN
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        TAKEN = str(s.getsockname()[1])
        yield TAKEN


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    return write_certs(issue_certs("guard", "test"), tmp_path_factory.mktemp("certs"))


def refused(capsys, *argv: str) -> tuple[int, str]:
    """Run the CLI in this process; the exit status and the one line it printed."""
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    assert code not in (0, None), (argv, out, err)
    assert out == "" and "Traceback" not in err, (out, err)
    assert err.endswith("\n"), err
    *before, err = err.splitlines(keepends=True)  # one line, after at most what serve loaded before binding
    assert all(json.loads(line)["level"] == "info" for line in before), before
    assert "cannot listen" not in err, err  # refused for its flag, before binding the taken port
    return code, err.strip()


def serve(certs: dict[str, Path], *extra: str) -> list[str]:
    return ["serve", "--host", "127.0.0.1", "--port", TAKEN, "--tls-cert", str(certs["cert"]),
            "--tls-key", str(certs["key"]), "--snapshot", DEMO, "--now", NOW, *extra]


# ---- flags argparse checks --------------------------------------------------------


@pytest.mark.parametrize("argv, says", [
    (["--log-level", "bogus", "report", "--snapshot", DEMO], "argument --log-level: expected one of debug, info"),
    (["report", "--log-level", "loud", "--snapshot", DEMO], "argument --log-level: expected one of"),
    (["--log-format", "xml", "report"], "argument --log-format: invalid choice: 'xml'"),
    (["serve", "--port", "99999", "--tls-cert", "c", "--tls-key", "k"], "argument --port: expected a port number"),
    (["serve", "--port", "-1", "--tls-cert", "c", "--tls-key", "k"], "argument --port: expected a port number"),
    (["serve", "--port", "https", "--tls-cert", "c", "--tls-key", "k"], "argument --port: expected a port number"),
    (["serve", "--metrics-port", "70000", "--tls-cert", "c", "--tls-key", "k"], "argument --metrics-port"),
    (["serve", "--tls-reload-interval", "-5", "--tls-cert", "c", "--tls-key", "k"], "argument --tls-reload-interval"),
    (["serve", "--max-body-bytes", "0", "--tls-cert", "c", "--tls-key", "k"], "argument --max-body-bytes"),
    (["serve", "--side-effect-queue", "0", "--tls-cert", "c", "--tls-key", "k"], "argument --side-effect-queue"),
    (["serve", "--bogus", "--tls-cert", "c", "--tls-key", "k"], "unrecognized arguments: --bogus"),
    (["serve"], "the following arguments are required: --tls-cert, --tls-key"),
    (["explain", "-o", "xml", "-n", "vms", "--pod", "p"], "argument -o/--output: invalid choice: 'xml'"),
    (["explain", "-n", "Bad_NS", "--pod", "p"], "argument --namespace/-n: expected a namespace name"),
    (["certs", "--service", "s", "--namespace", "n", "--out", "d", "--days", "-1"], "argument --days: expected"),
    (["certs", "--service", "s", "--namespace", "n", "--out", "d", "--days", "0"], "argument --days: expected"),
    (["certs", "--service", "s", "--namespace", "n", "--out", "d", "--days", "99999"], "argument --days: expected"),
    (["certs", "--service", "s", "--namespace", "n", "--out", "d", "--days", "year"], "argument --days: expected"),
    (["certs", "--service", "My_Guard", "--namespace", "n", "--out", "d"], "argument --service: expected a Service"),
    (["certs", "--service", "1guard", "--namespace", "n", "--out", "d"], "argument --service: expected a Service"),
    (["certs", "--service", "g", "--namespace", "kube..system", "--out", "d"], "argument --namespace: expected"),
    (["certs", "--service", "g" * 64, "--namespace", "n", "--out", "d"], "argument --service: expected"),
])
def test_flags_argparse_refuses(capsys, argv, says) -> None:
    code, line = refused(capsys, *argv)
    assert code == 2 and says in line, line


# ---- values the commands check ----------------------------------------------------


def test_serve_settings(capsys, certs, tmp_path) -> None:
    cases = [
        (["--metrics-port", TAKEN], f"--metrics-port: must be a port other than --port {TAKEN}"),
        (["--migration-cooldown=-5m"], "migrationCooldown: must not be negative"),
        (["--max-migration-cooldown", "5m"], "maxMigrationCooldown: must be 0 (no cap) or at least migrationCooldown"),
        (["--stale-after=-1m"], "--stale-after: must be a positive duration"),
        (["--event-interval=-1m"], "--event-interval: must not be negative"),
        (["--request-timeout=-5s"], "--request-timeout: must be positive"),
        (["--cancel-interval", "0"], "--cancel-interval: must be positive"),
        (["--prometheus-url", "http://127.0.0.1:9", "--prometheus-interval=-30s"], "--prometheus-interval: must be"),
        (["--now", ""], "--now: not an RFC 3339 timestamp: ''"),
        (["--config", str(tmp_path / "none.yaml")], "cannot read: No such file or directory"),
        (["--client-ca", str(tmp_path / "none.crt")], "--client-ca"),
        # checked while the context is built, still before binding
        (["--prometheus-url", "ftp://prometheus"], "--prometheus-url: must be an http(s) URL"),
        (["--prometheus-url", "http://127.0.0.1:9", "--prometheus-token-file", str(tmp_path / "t")],
         "--prometheus-url: must be https:// when --prometheus-token-file is given"),
        (["--snapshot", str(tmp_path / "none.yaml")], "none.yaml: cannot read: No such file or directory"),
    ]
    for extra, says in cases:
        code, line = refused(capsys, *serve(certs, *extra))
        assert code == 2 and says in line, (extra, line)


def test_serve_tls_files(capsys, certs, tmp_path) -> None:
    other = write_certs(issue_certs("other", "test"), tmp_path / "other")
    not_pem = tmp_path / "junk.pem"
    not_pem.write_text("hello\n")
    cases = [
        (["--tls-key", str(tmp_path / "missing.key")], "--tls-key", "cannot read: No such file or directory"),
        (["--tls-key", str(tmp_path)], "--tls-key", "cannot read: Is a directory"),
        (["--tls-key", str(other["key"])], "--tls-key", "does not load with --tls-cert"),
        (["--tls-cert", str(tmp_path / "missing.crt")], "--tls-cert", "cannot read"),
        (["--tls-cert", str(not_pem)], "--tls-cert", "not a PEM certificate"),
    ]
    for extra, flag, says in cases:
        argv = serve(certs)
        i = argv.index(extra[0])
        argv[i + 1] = extra[1]
        code, line = refused(capsys, *argv)
        assert code == 2 and line.startswith(f"kubevirt-eviction-guard: {flag} ") and says in line, line


@pytest.mark.parametrize("content, says", [
    ("", "no VirtualMachineInstance in it"),
    ("apiVersion: v1\nkind: List\nitems: []\n", "no VirtualMachineInstance in it"),
    ("apiVersion: v1\nkind: List\nitems:\n- {kind: Node, metadata: {name: worker-a}}\n", "no VirtualMachineInstance"),
    ("kind: List\nitems: [\n", "not valid YAML or JSON"),
    (None, "cannot read: No such file or directory"),
])
@pytest.mark.parametrize("command", ["report", "explain", "serve"])
def test_snapshots_without_vms(capsys, certs, tmp_path, content, says, command) -> None:
    snap = tmp_path / "dump.yaml"
    if content is not None:
        snap.write_text(content)
    argv = {"report": ["report", "--snapshot", str(snap)],
            "explain": ["explain", "-n", "vms", "--pod", "p", "--snapshot", str(snap)],
            "serve": serve(certs)[:-4] + ["--snapshot", str(snap)]}[command]
    code, line = refused(capsys, *argv)
    assert code == 2 and str(snap) in line and says in line, line


def test_explain_and_report_values(capsys) -> None:
    cases = [
        (["explain", "-n", "vms", "--pod", "virt-launcher-nothere", "--snapshot", DEMO, "--now", NOW],
         f"pod vms/virt-launcher-nothere not found in {DEMO}"),
        (["explain", "-n", "vms", "--pod", "p", "--snapshot", DEMO, "--now", ""], "--now: not an RFC 3339"),
        (["explain", "-n", "vms", "--pod", "p", "--requester", "me", "--snapshot", DEMO], "--requester: expected"),
        (["report", "--snapshot", DEMO, "--now", "noon"], "--now: not an RFC 3339 timestamp: 'noon'"),
        (["report", "--snapshot", DEMO, "--migration-history-window", "2 days"], "migrationHistoryWindow: not a dur"),
        (["report", "--snapshot", DEMO, "--node-cooldown=-1h"], "nodeCooldown: must not be negative"),
    ]
    for argv, says in cases:
        code, line = refused(capsys, *argv)
        assert code == 2 and says in line, (argv, line)


# ---- nothing lost: certs ----------------------------------------------------------


def test_certs_never_overwrite_without_force(capsys, tmp_path) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--service", "guard", "--namespace", "ns", "--out", str(out)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, line = refused(capsys, "certs", "--service", "guard", "--namespace", "ns", "--out", str(out))
    assert code == 2 and "ca.crt, tls.crt, tls.key already there; --force replaces them" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "tls.crt").unlink()  # one of three missing: still refused, the others kept
    code, line = refused(capsys, "certs", "--service", "guard", "--namespace", "ns", "--out", str(out))
    assert "ca.crt, tls.key already there" in line and (out / "tls.key").read_bytes() == before["tls.key"]
    assert not (out / "tls.crt").exists()


def test_certs_force_replaces_and_the_key_is_private(capsys, tmp_path) -> None:
    out = tmp_path / "certs"
    out.mkdir()
    (out / "tls.key").write_text("old key\n")
    os.chmod(out / "tls.key", 0o644)  # a key left readable by an older tool
    assert main(["certs", "--service", "guard", "--namespace", "ns", "--out", str(out), "--force"]) == 0
    capsys.readouterr()
    key = out / "tls.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text().startswith("-----BEGIN PRIVATE KEY")
    assert stat.S_IMODE((out / "tls.crt").stat().st_mode) == 0o644
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]  # no temporary files left


def test_certs_out_is_not_a_folder(capsys, tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("keep me\n")
    code, line = refused(capsys, "certs", "--service", "g", "--namespace", "n", "--out", str(f))
    assert code == 2 and "exists and is not a folder" in line and f.read_text() == "keep me\n"
    code, line = refused(capsys, "certs", "--service", "g", "--namespace", "n", "--out", str(f / "sub"))
    assert code == 2 and "cannot write: Not a directory" in line


# ---- nothing lost: simulate ---------------------------------------------------------


def simulate(*extra: str) -> list[str]:
    return ["simulate", "--scenario", SCENARIO, "--hours", "1", "--modes", "upstream", "--jobs", "1", *extra]


def test_simulate_checks_its_outputs_before_the_first_run(capsys, tmp_path) -> None:
    file_out = tmp_path / "results"
    file_out.write_text("not a folder\n")
    full = tmp_path / "full"
    full.mkdir()
    (full / "summary.json").write_text('{"mine": 1}\n')
    no_markers = tmp_path / "notes.md"
    no_markers.write_text("# notes\n")
    text = tmp_path / "notes.txt"
    text.write_text("<!-- simulate:begin -->\n<!-- simulate:end -->\n")
    cases = [
        (["--out", str(file_out)], "exists and is not a folder"),
        (["--out", str(full)], "not empty (an earlier run's results?); --force replaces its files"),
        (["--out", str(file_out / "sub")], "cannot write there: Not a directory"),
        (["--readme", str(no_markers)], "needs one <!-- simulate:begin --> line"),
        (["--readme", str(text)], "not a Markdown file (.md)"),
        (["--readme", str(tmp_path / "missing.md")], "cannot read: No such file or directory"),
        (["--hours", "-1"], "--hours: must be positive"),
        (["--seeds", "x"], "--seeds: expected e.g. 1-10"),
        (["--modes", "nope"], "--modes:"),
        (["--jobs", "0"], "--jobs: must be at least 1"),
    ]
    for extra, says in cases:
        code, line = refused(capsys, *simulate(*extra))
        assert code == 2 and line.startswith("kubevirt-eviction-guard simulate: ") and says in line, (extra, line)
    assert file_out.read_text() == "not a folder\n" and no_markers.read_text() == "# notes\n"
    assert json.loads((full / "summary.json").read_text()) == {"mine": 1}
    code, line = refused(capsys, "simulate", "--scenario", str(tmp_path / "none.yaml"))
    assert code == 2 and "cannot read" in line


# ---- as a process ---------------------------------------------------------------------


def run(*argv: str, **kw) -> subprocess.CompletedProcess:
    """The process's exit; its stderr reduced to the refusal: one line, after at most the info lines of what it
    loaded before binding (serve loads the snapshot before it listens)."""
    r = subprocess.run([sys.executable, "-m", "app", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       **kw)
    assert r.returncode != 0 and r.stdout == "" and "Traceback" not in r.stderr, r
    *before, last = r.stderr.splitlines(keepends=True)
    assert all(json.loads(line)["level"] == "info" for line in before), r.stderr
    r.stderr = last
    return r


def test_process_usage_error_is_one_line() -> None:
    r = run("--log-level", "bogus", "report")
    assert r.returncode == 2 and r.stderr.startswith("kubevirt-eviction-guard: argument --log-level:")


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_process_port_in_use(certs, flag) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        argv = serve(certs, "--metrics-port", str(free_port()))
        argv[argv.index("--port") + 1] = str(free_port())
        argv[argv.index(flag) + 1] = str(busy)
        r = run(*argv)
    assert r.returncode == 2 and r.stderr == (f"kubevirt-eviction-guard: {flag} {busy}: cannot listen on 127.0.0.1: "
                                              "Address already in use\n")


def test_process_unknown_host(certs) -> None:
    r = run("serve", "--host", "no-such-host.invalid", *serve(certs)[3:])
    assert r.returncode == 2 and f"--port {TAKEN}: cannot listen on no-such-host.invalid:" in r.stderr


def test_process_key_it_may_not_read(tmp_path) -> None:
    """OpenShift runs the container with a random UID: a key mounted for another user cannot be read."""
    paths = write_certs(issue_certs("guard", "test"), tmp_path)
    os.chmod(paths["key"], 0)
    argv = ["serve", "--tls-cert", str(paths["cert"]), "--tls-key", str(paths["key"]), "--snapshot", DEMO]
    prefix = []
    if os.geteuid() == 0:  # root reads every file: take away the capabilities that let it (util-linux setpriv)
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]
    r = subprocess.run([*prefix, sys.executable, "-m", "app", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"kubevirt-eviction-guard: --tls-key {paths['key']}: cannot read: Permission denied\n"


def test_an_internal_error_is_one_line_and_not_a_denial(capsys, monkeypatch) -> None:
    import importlib

    explain_module = importlib.import_module("app.inspect.explain")  # the module (app.inspect.explain is the function)

    def broken(*args, **kwargs):
        raise KeyError("node")

    monkeypatch.setattr(explain_module, "explanation", broken)  # a bug, as it would surface
    argv = ["explain", "-n", "vms", "--pod", "virt-launcher-api-01-a1b2c", "--snapshot", DEMO, "--now", NOW]
    code, line = refused(capsys, *argv)
    assert code == 3  # explain's 1 means "denied": a bug must not read as one
    assert line == "kubevirt-eviction-guard: internal error: KeyError: 'node' (--log-level debug shows where)"
    with pytest.raises(KeyError):  # and at debug level, the traceback
        main(["--log-level", "debug", *argv])
