"""The command line: explain, report, certs, and start-up errors that name what is wrong."""

from __future__ import annotations

import argparse
import base64
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from app.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "examples" / "demo-snapshot.yaml")
DEMO_NOW = "2026-11-21T12:00:00Z"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--log-level", "warning", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("pod, requester, verdict, reason", [
    ("virt-launcher-rhel9-db-01-a1b2c", "descheduler", "DENY", "cooldown"),
    ("virt-launcher-rhel9-db-01-a1b2c", "user:kubernetes-admin", "ALLOW", "allowed"),
    ("virt-launcher-web-02-a1b2c", "descheduler", "DENY", "node_busy"),
    ("virt-launcher-win2022-app-03-a1b2c", "descheduler", "DENY", "migration_in_progress"),
    ("virt-launcher-win2022-app-03-zz9k8", "descheduler", "DENY", "migration_target"),
    ("virt-launcher-web-01-a1b2c", "descheduler", "DENY", "evacuation_pending"),
    ("virt-launcher-batch-01-a1b2c", "descheduler", "ALLOW", "allowed"),
    ("virt-launcher-cache-01-a1b2c", "descheduler", "ALLOW", "allowed"),
    ("nginx-5d9c", "descheduler", "ALLOW", "not_a_vm_pod"),
])
def test_explain_demo(capsys, pod, requester, verdict, reason) -> None:
    ns = "web" if pod.startswith("nginx") else "vms"
    code, out, _ = run(capsys, "explain", "-n", ns, "--pod", pod, "--requester", requester, "--snapshot", DEMO, "--now", DEMO_NOW)
    assert code == (0 if verdict == "ALLOW" else 1)
    assert f"decision: {verdict}" in out and f"reason: {reason}" in out


def test_explain_shows_the_numbers(capsys) -> None:
    _, out, _ = run(capsys, "explain", "-n", "vms", "--pod", "virt-launcher-api-01-a1b2c", "--snapshot", DEMO, "--now", DEMO_NOW)
    assert "finished migrations (3)" in out
    assert "base 30m0s" in out and "-> 2h0m0s, remaining 1h20m0s" in out


def test_report_demo(capsys) -> None:
    code, out, _ = run(capsys, "report", "--snapshot", DEMO, "--now", DEMO_NOW)
    assert code == 0
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:] if line.startswith("vms ")}
    assert rows["api-01"][3:] == ["3", "2026-11-21T11:20:00Z", "2h0m0s", "1h20m0s", "cooldown", "cooldown"]
    assert rows["win2022-app-03"][-2:] == ["migrating", "migration_in_progress"]
    assert rows["web-01"][-2:] == ["evacuation-pending", "evacuation_pending"]
    assert rows["web-02"][-2:] == ["node-busy", "node_busy"]  # web-01 is leaving worker-a
    assert rows["cache-01"][-2:] == ["movable", "allowed"]


def test_report_respects_settings(capsys) -> None:
    _, out, _ = run(capsys, "report", "--snapshot", DEMO, "--now", DEMO_NOW, "--migration-cooldown", "1h")
    api = next(line.split() for line in out.splitlines() if " api-01 " in line)
    assert api[5] == "4h0m0s"


def test_certs(capsys, tmp_path) -> None:
    code, out, _ = run(capsys, "certs", "--service", "guard", "--namespace", "kv", "--out", str(tmp_path))
    assert code == 0
    ca = x509.load_pem_x509_certificate(base64.b64decode(out.strip()))
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    assert cert.issuer == ca.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"guard", "guard.kv", "guard.kv.svc", "guard.kv.svc.cluster.local", "localhost"}
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("args, named", [
    (["--migration-cooldown=-5m"], "migrationCooldown"),
    (["--migration-cooldown", "1h", "--max-migration-cooldown", "30m"], "maxMigrationCooldown"),
    (["--cooldown-scope", "nobody"], "cooldownScope"),
    (["--pending-evacuations-per-node=-2"], "pendingEvacuationsPerNode"),
    (["--config", "/nonexistent/guard.yaml"], "--config /nonexistent/guard.yaml"),
    (["--now", "noon"], "--now"),
    (["--evacuation-stale-after-failures", "7"], "evacuationStaleAfterFailures"),
    (["--cancel-interval", "0"], "--cancel-interval"),
    (["--cancel-interval", "often"], "--cancel-interval"),
])
def test_bad_settings_stop_startup_naming_them(tmp_path, args, named) -> None:
    certs = tmp_path / "c"
    main(["--log-level", "warning", "certs", "--service", "g", "--namespace", "n", "--out", str(certs)])
    with socket.socket() as taken:  # something listens on the port: the flag is refused before binding
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        r = subprocess.run([sys.executable, "-m", "app", "serve", "--port", port, "--tls-cert", str(certs / "tls.crt"),
                            "--tls-key", str(certs / "tls.key"), "--snapshot", DEMO, *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert named in r.stderr and "Traceback" not in r.stderr and "cannot listen" not in r.stderr


def test_bad_snapshot_stops_startup(tmp_path) -> None:
    bad = tmp_path / "dump.yaml"
    bad.write_text("kind: List\nitems: [\n")
    r = subprocess.run([sys.executable, "-m", "app", "explain", "-n", "vms", "--pod", "x", "--snapshot", str(bad)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr and "not valid YAML" in r.stderr and "Traceback" not in r.stderr


def test_missing_tls_files_stop_startup(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "app", "serve", "--tls-cert", str(tmp_path / "no.crt"), "--tls-key",
                        str(tmp_path / "no.key"), "--snapshot", DEMO], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--tls-cert" in r.stderr and "Traceback" not in r.stderr


def test_bad_requester(capsys) -> None:
    code, _, err = run(capsys, "explain", "-n", "vms", "--pod", "x", "--requester", "me", "--snapshot", DEMO)
    assert code == 2 and "--requester" in err


def stuck_snapshot(tmp_path: Path) -> str:
    import yaml

    from tests.builders import failing_evacuation, node, pod, vmi

    items = [node("worker-a"), node("worker-b"),
             vmi("db", "worker-a", evacuation="worker-a", annotations={"kubevirt.io/eviction-source": "descheduler"}),
             pod("db", "worker-a"), *failing_evacuation("db", "worker-a", 3, running=True),
             vmi("web", "worker-a", evacuation="worker-a"), pod("web", "worker-a")]
    path = tmp_path / "stuck.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


def _cooling_snapshot(tmp_path) -> str:
    """worker-x: a descheduler move left it 5 min ago; worker-y: one reached it 5 min ago."""
    import yaml

    from tests.builders import mstate, node, pod, vmi, vmim
    off = mstate("m-off", "worker-x", "worker-z", start=7, end=5)
    on = mstate("m-on", "worker-z", "worker-y", start=7, end=5)
    items = [node("worker-x"), node("worker-y"), node("worker-z"),
             vmi("gone", "worker-z", migration=off), vmim("m-off", "gone", "Succeeded", 8, off, priority="system-maintenance"),
             vmi("came", "worker-y", migration=on), vmim("m-on", "came", "Succeeded", 8, on, priority="system-maintenance"),
             vmi("stay", "worker-x"), pod("stay", "worker-x")]
    path = tmp_path / "cooling.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


def test_explain_and_report_show_a_stuck_evacuation(capsys, tmp_path) -> None:
    snap = stuck_snapshot(tmp_path)
    code, out, _ = run(capsys, "explain", "-n", "vms", "--pod", "virt-launcher-db-abcde", "--requester", "descheduler",
                       "--snapshot", snap, "--now", DEMO_NOW)
    assert code == 1 and "reason: evacuation_stuck" in out
    assert "evacuation: from worker-a source=descheduler STUCK (3 failed attempts in 15m0s)" in out
    _, out, _ = run(capsys, "explain", "-n", "vms", "--pod", "virt-launcher-db-abcde", "--requester", "descheduler",
                    "--snapshot", snap, "--now", DEMO_NOW, "--evacuation-stale-after-failures", "4")
    assert "reason: migration_in_progress" in out and "not stuck" in out
    _, out, _ = run(capsys, "report", "--snapshot", snap, "--now", DEMO_NOW)
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:] if line.startswith("vms ")}
    assert rows["db"][-2:] == ["evacuation-stuck", "evacuation_stuck"]
    assert rows["web"][-2:] == ["evacuation-pending", "evacuation_pending"]
def test_explain_shows_node_cooldowns(capsys, tmp_path) -> None:
    snap = _cooling_snapshot(tmp_path)
    _, out, _ = run(capsys, "explain", "-n", "vms", "--pod", "virt-launcher-stay-abcde", "--snapshot", snap,
                    "--now", DEMO_NOW, "--node-cooldown", "15m")
    assert "reason: node_cooldown" in out
    assert "node cooldown (8b):        last descheduler move vms/gone (worker-x -> worker-z)" in out
    assert "cooldown 15m0s, remaining 10m0s" in out
    assert "target-node cooldown (8c): off" in out
    _, out, _ = run(capsys, "explain", "-n", "vms", "--pod", "virt-launcher-stay-abcde", "--snapshot", snap,
                    "--now", DEMO_NOW)
    assert "reason: allowed" in out and "node cooldown (8b):        off" in out


def test_report_lists_nodes_in_cooldown(capsys, tmp_path) -> None:
    snap = _cooling_snapshot(tmp_path)
    _, out, _ = run(capsys, "report", "--snapshot", snap, "--now", DEMO_NOW, "--node-cooldown", "15m",
                    "--target-node-cooldown", "15m")
    rows = {tuple(line.split()[:2]) for line in out.splitlines() if line.startswith("  worker-")}
    # worker-z sent vms/came and received vms/gone: both rules hold it
    assert rows == {("worker-x", "8b"), ("worker-y", "8c"), ("worker-z", "8b"), ("worker-z", "8c")}
    assert "Node cooldowns: off" in run(capsys, "report", "--snapshot", snap, "--now", DEMO_NOW)[1]


def _parsers(parser):
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_flag_of_every_command_has_help() -> None:
    from app.cli import build_parser

    seen = 0
    for prog, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(choice.help for choice in action._choices_actions), prog
                continue
            seen += 1
            assert action.help, f"{prog} {'/'.join(action.option_strings) or action.dest}: no help text"
            if action.help != argparse.SUPPRESS:
                assert len(action.help) > 10, (prog, action.option_strings, action.help)
    assert seen > 100  # serve, explain, report, certs, simulate and their settings were all looked at


@pytest.mark.parametrize("command", ["serve", "explain", "report", "certs", "simulate"])
def test_help_prints_and_names_the_log_level(command) -> None:
    r = subprocess.run([sys.executable, "-m", "app", command, "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "--log-level LEVEL" in r.stdout and r.stderr == ""


def test_serve_logs_its_effective_settings_by_their_config_names(tmp_path) -> None:
    import json

    from tests.guard_process import GuardProcess

    config = tmp_path / "guard.yaml"
    config.write_text("migrationCooldown: 30m\nstaleAfter: 90s\n")
    g = GuardProcess(tmp_path, ["--snapshot", DEMO, "--now", DEMO_NOW, "--config", str(config),
                                "--max-migration-cooldown", "2h"])
    try:
        g.wait_healthy()
    finally:
        g.stop()
    lines = [json.loads(line) for line in g.log.read_text().splitlines() if line.startswith("{")]
    (serving,) = [line for line in lines if line["msg"] == "serving"]
    settings, server = serving["settings"], serving["server"]
    assert (settings["migrationCooldown"], settings["maxMigrationCooldown"], settings["migrationHistoryWindow"]) \
        == ("30m0s", "2h0m0s", "48h0m0s")  # the config file, the flag, the default: Go durations
    assert settings["pendingEvacuationsPerNode"] == 1 and settings["deschedulerUsers"] == []
    assert (server["staleAfter"], server["tlsReloadInterval"], server["port"], server["logLevel"]) \
        == ("1m30s", "5s", g.port, "info")
