"""``report`` and ``explain``: one judgement, two views, three formats.

report's STATE for each VM is the decision explain shows for a descheduler eviction of
that VM's launcher pod at the same instant: checked on every VM of the demo snapshot, the
reference objects in tests/fixtures/objects and every situation of the decision table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.inspect import explanation, report_model
from app.inspect.explain import requester_request
from app.inspect.fields import STATES, state_of
from app.policy.model import Reason
from tests.builders import FIXTURES, NOW, store_of
from tests.test_policy_table import ROWS

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "examples" / "demo-snapshot.yaml")
DEMO_NOW = "2026-11-21T12:00:00Z"
JUDGEMENT = ("allowed", "code", "reason", "message")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The CLI at its default log level: report and explain must write nothing to stderr."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def fixtures_snapshot(tmp_path: Path) -> str:
    items = [json.loads(p.read_text()) for p in sorted((FIXTURES / "objects").glob("*.json"))]
    path = tmp_path / "fixtures.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


def agree_on_every_vm(capsys, snapshot: str, now: str, *settings: str) -> list[dict]:
    """report -o json, then explain -o json for each VM's pod: the same judgement, and the exit code says it."""
    code, out, err = cli(capsys, "report", "-o", "json", "--snapshot", snapshot, "--now", now, *settings)
    assert (code, err) == (0, "")
    rows = json.loads(out)["vmis"]
    assert any(row["pod"] for row in rows)
    for row in rows:
        if row["pod"] is None:  # nothing to evict: no decision
            assert (row["state"], row["reason"]) == ("no-launcher-pod", None)
            continue
        code, out, err = cli(capsys, "explain", "-o", "json", "-n", row["namespace"], "--pod", row["pod"],
                             "--snapshot", snapshot, "--now", now, *settings)
        decision = json.loads(out)
        assert err == "" and code == (0 if decision["allowed"] else 1)
        assert {k: row[k] for k in JUDGEMENT} == {k: decision[k] for k in JUDGEMENT}, row["name"]
        assert row["state"] == (STATES.get(decision["reason"]) or ("movable" if decision["allowed"] else "?"))
    return rows


def test_report_and_explain_agree_on_the_demo(capsys) -> None:
    rows = agree_on_every_vm(capsys, DEMO, DEMO_NOW)
    states = {r["name"]: (r["state"], r["reason"]) for r in rows}
    # the two VMs report once called movable although explain refused them
    assert states["web-02"] == ("node-busy", "node_busy") and states["old-01"] == ("node-busy", "node_busy")
    assert states["batch-01"] == ("movable", "allowed")  # its node is being drained: in cooldown, yet let through
    assert len(rows) == 8


def test_report_and_explain_agree_on_node_cooldowns_and_stuck_evacuations(capsys, tmp_path) -> None:
    from tests.test_cli import _cooling_snapshot, stuck_snapshot

    rows = agree_on_every_vm(capsys, _cooling_snapshot(tmp_path), DEMO_NOW, "--node-cooldown", "15m",
                             "--target-node-cooldown", "15m")
    assert {r["name"]: r["state"] for r in rows}["stay"] == "node-cooldown"
    rows = agree_on_every_vm(capsys, stuck_snapshot(tmp_path), DEMO_NOW)
    assert {r["name"]: r["state"] for r in rows} == {"db": "evacuation-stuck", "web": "evacuation-pending"}


@pytest.mark.parametrize("now", ["2026-11-21T09:10:00Z", "2026-11-21T10:45:00Z", "2026-11-22T12:00:00Z"])
def test_report_and_explain_agree_on_the_reference_objects(capsys, tmp_path, now) -> None:
    agree_on_every_vm(capsys, fixtures_snapshot(tmp_path), now)


@pytest.mark.parametrize("row", [r for r in ROWS if r.health.ready and not r.health.stale and r.usage is None],
                         ids=lambda r: r.id)
def test_report_and_explain_agree_in_every_table_situation(row) -> None:
    store = store_of(*row.objects)
    model = report_model(store, NOW, row.settings)
    for r in model["vmis"]:
        if r["pod"] is None:
            assert r["state"] == "no-launcher-pod" and r["reason"] is None
            continue
        d = explanation(requester_request(r["namespace"], r["pod"], "descheduler"), store, NOW, row.settings)
        assert {k: r[k] for k in JUDGEMENT} == {k: d[k] for k in JUDGEMENT}


def test_state_words() -> None:
    from app.policy.model import Decision

    assert state_of(Decision(True, Reason.VMI_NOT_FOUND, "")) == "movable"  # a fail-open allowance lets it go
    assert state_of(Decision(False, Reason.NO_GAIN, "")) == "no-gain"
    assert state_of(Decision(False, Reason.NODE_BUSY, "")) == "node-busy"


def test_explain_json_holds_the_decision_and_its_inputs(capsys) -> None:
    code, out, _ = cli(capsys, "explain", "-o", "json", "-n", "vms", "--pod", "virt-launcher-api-01-a1b2c",
                       "--snapshot", DEMO, "--now", DEMO_NOW)
    d = json.loads(out)
    assert code == 1
    assert list(d)[:4] == ["allowed", "code", "reason", "message"]
    assert (d["allowed"], d["code"], d["reason"], d["retryIn"]) == (False, 429, "cooldown", 4800)
    assert d["request"] == {"namespace": "vms", "pod": "virt-launcher-api-01-a1b2c", "requester": "descheduler",
                            "requestedBy": "sigs.k8s.io/descheduler", "username": None}
    c = d["cooldown"]  # seconds, as numbers
    assert (c["base"], c["count"], c["cooldown"], c["remaining"], c["window"]) == (1800, 3, 7200, 4800, 172800)
    assert [f["duration"] for f in d["finishedMigrations"]] == [1800, 1800, 1800]
    assert d["vmi"]["node"] == "worker-b" and d["leaving"]["vmis"] == []


def test_explain_allowed_exits_zero_and_yaml_matches_json(capsys) -> None:
    args = ["-n", "vms", "--pod", "virt-launcher-cache-01-a1b2c", "--snapshot", DEMO, "--now", DEMO_NOW]
    code, out, err = cli(capsys, "explain", "-o", "yaml", *args)
    assert (code, err) == (0, "")
    as_yaml = yaml.safe_load(out)
    assert as_yaml == json.loads(cli(capsys, "explain", "-o", "json", *args)[1])
    assert (as_yaml["allowed"], as_yaml["code"], as_yaml["reason"]) == (True, 200, "allowed")


def test_report_json_shape(capsys) -> None:
    code, out, _ = cli(capsys, "report", "-o", "json", "--snapshot", DEMO, "--now", DEMO_NOW)
    m = json.loads(out)
    assert code == 0 and list(m)[:3] == ["cluster", "warnings", "vmis"]
    assert m["cluster"]["vmis"] == 8 and m["cluster"]["now"] == DEMO_NOW and m["warnings"] == []
    api = next(r for r in m["vmis"] if r["name"] == "api-01")
    assert {k: api[k] for k in ("namespace", "node", "state", "reason", "migrations", "cooldown", "remaining", "notes")} \
        == {"namespace": "vms", "node": "worker-b", "state": "cooldown", "reason": "cooldown", "migrations": 3,
            "cooldown": 7200, "remaining": 4800, "notes": []}
    assert yaml.safe_load(cli(capsys, "report", "-o", "yaml", "--snapshot", DEMO, "--now", DEMO_NOW)[1]) == m


def test_a_vmi_without_its_pod_is_a_warning(capsys, tmp_path) -> None:
    from tests.builders import node, vmi

    snap = tmp_path / "s.yaml"
    snap.write_text(yaml.safe_dump({"kind": "List", "items": [node("worker-a"), vmi("db", "worker-a")]}))
    code, out, _ = cli(capsys, "report", "-o", "json", "--snapshot", str(snap), "--now", DEMO_NOW)
    m = json.loads(out)
    assert code == 0 and m["vmis"][0]["state"] == "no-launcher-pod" and m["vmis"][0]["reason"] is None
    assert [w["reason"] for w in m["warnings"]] == ["no_launcher_pod"] and "vms/db" in m["warnings"][0]["message"]
    code, out, _ = cli(capsys, "report", "--snapshot", str(snap), "--now", DEMO_NOW)
    assert "warning: 1 VMI(s) without a running launcher pod" in out


def test_nothing_on_stderr_at_the_default_level_but_warnings_when_asked(tmp_path) -> None:
    import subprocess
    import sys

    for argv in (["report", "--snapshot", DEMO, "--now", DEMO_NOW],
                 ["explain", "-n", "vms", "--pod", "virt-launcher-api-01-a1b2c", "--snapshot", DEMO, "--now", DEMO_NOW]):
        r = subprocess.run([sys.executable, "-m", "app", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.stderr == "" and r.stdout and r.returncode in (0, 1), r.stderr
        r = subprocess.run([sys.executable, "-m", "app", *argv[:1], "--log-level", "info", *argv[1:]], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert "snapshot loaded" in r.stderr  # --log-level after the command, as for serve
