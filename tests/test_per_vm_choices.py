"""Per-VM choices users express with annotations, as explain and report show them."""

from __future__ import annotations

import yaml

from app.cli import main
from tests.builders import mstate, node, pod, vmi

NOW_ARG = "2026-11-21T12:00:00Z"  # builders.NOW
PNE = "descheduler.alpha.kubernetes.io/prefer-no-eviction"
EX = "kubevirt-eviction-guard.io/exempt"
CD = "kubevirt-eviction-guard.io/migration-cooldown"
RECENT = mstate("m1", "worker-b", "worker-a", start=7, end=5)  # ended 5 min ago after 2 min

OBJECTS = [
    node("worker-a"),
    vmi("shy", "worker-a", annotations={PNE: ""}), pod("shy", "worker-a", name="virt-launcher-shy", annotations={PNE: ""}),
    vmi("free", "worker-a", migration=RECENT, annotations={EX: "true"}), pod("free", "worker-a", name="virt-launcher-free"),
    vmi("slow", "worker-a", migration=RECENT, annotations={CD: "1h"}), pod("slow", "worker-a", name="virt-launcher-slow"),
    vmi("typo", "worker-a", migration=RECENT, annotations={CD: "an hour", EX: "yes"}),
    pod("typo", "worker-a", name="virt-launcher-typo"),
]


def run(capsys, tmp_path, *argv: str) -> str:
    snap = tmp_path / "snap.yaml"
    snap.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": OBJECTS}))
    code = main(["--log-level", "warning", *argv, "--snapshot", str(snap), "--now", NOW_ARG])
    out = capsys.readouterr().out
    assert code == (1 if "decision: DENY" in out else 0)  # explain: 1 on a denial
    return out


def explain(capsys, tmp_path, name: str, *extra: str) -> str:
    return run(capsys, tmp_path, "explain", "-n", "vms", "--pod", f"virt-launcher-{name}", *extra)


def test_explain_prefer_no_eviction(capsys, tmp_path) -> None:
    out = explain(capsys, tmp_path, "shy")
    assert "reason: prefer_no_eviction" in out
    assert "prefer-no-eviction (on the vmi and pod; honoured, descheduler evictions only)" in out
    out = explain(capsys, tmp_path, "shy", "--honor-prefer-no-eviction", "false")
    assert "reason: allowed" in out and "not honoured: honorPreferNoEviction false" in out


def test_explain_exempt(capsys, tmp_path) -> None:
    out = explain(capsys, tmp_path, "free")
    assert "decision: ALLOW" in out and "VMI is exempt" in out
    assert f"{EX}: true (only the in-flight rules apply)" in out


def test_explain_per_vm_cooldown(capsys, tmp_path) -> None:
    out = explain(capsys, tmp_path, "slow")
    assert "reason: cooldown" in out and "retry in 55m0s" in out
    assert f"{CD}: 1h0m0s (replaces migrationCooldown)" in out
    assert f"base 1h0m0s = max({CD} (this VM) 1h0m0s, last duration 2m0s)" in out


def test_explain_ignored_overrides(capsys, tmp_path) -> None:
    out = explain(capsys, tmp_path, "typo")
    assert "reason: cooldown" in out and "cooldown 15m0s" in out
    assert f"{CD}: an hour ignored: bad duration (migrationCooldown used)" in out
    assert f"{EX}: 'yes' ignored" in out
    assert "base 15m0s = max(migrationCooldown 15m0s" in out


def test_report_shows_choices(capsys, tmp_path) -> None:
    out = run(capsys, tmp_path, "report")
    assert out.splitlines()[0].split()[-1] == "NOTES"
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:] if line.startswith("vms ")}
    assert rows["shy"][-3:] == ["prefer-no-eviction", "prefer_no_eviction", "prefer-no-eviction"]
    assert rows["free"][-3:] == ["movable", "allowed", "exempt"]
    assert rows["slow"][5:] == ["1h0m0s", "55m0s", "cooldown", "cooldown", "cooldown=1h0m0s"]
    assert rows["typo"][-3:] == ["cooldown", "cooldown", "exempt=ignored,cooldown=ignored(bad-duration)"]
