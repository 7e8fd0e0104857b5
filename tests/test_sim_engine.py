"""Whole runs: a small scenario whose numbers follow by hand, determinism, the CLI and scenario errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.sim.engine import simulate
from app.sim.metrics import repeat_moves, summarize
from app.sim.run import run_scenario
from app.sim.scenario import ScenarioError, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parents[1]

# One small node among two big ones, identical VMs (1 core of load each, no memory load):
# 4 VMs per node (placement by memory), so at 300 s the small node is at 50% CPU and
# the big ones at 12.5%: scores 75, 0, 0 (mean 25) -> the small node is overutilised.
HOT_NODE = {
    "name": "hot-node",
    "hours": 2,
    "nodes": [{"name": "small", "cpu": 8, "memoryGiB": 64}, {"name": "big", "count": 2, "cpu": 32, "memoryGiB": 64}],
    "vms": [{"name": "vm", "count": 12, "cpu": 2, "memoryGiB": 4, "dirtyRateMiBps": 0, "cpuLoad": 0.5,
             "memoryLoad": 0}],
    "kubevirt": {"bandwidthGiBps": 0.5, "migrationFailureProbability": 0},
    "descheduler": {"interval": "1h"},
}


def run(mode: str, data=HOT_NODE):
    d = simulate(parse_scenario(data, "hot-node"), mode)
    return d, summarize(d)


def test_off_takes_two_vms_per_cycle_and_empties_the_small_node():
    d, s = run("off")
    # cycle at 300 s: 2 evicted, 18 s each (4 GiB / 0.5 GiB/s + 10 s setup), one per big node.
    # cycle at 3900 s: small at 2/8 = 25%, bigs at 5/32: score 18 > mean 6 + 10 -> 2 more, small is empty.
    assert [(r.start, r.end, r.source) for r in sorted(d.runs, key=lambda r: (r.start, r.vm))] == [
        (300, 318, "small"), (300, 318, "small"), (3900, 3918, "small"), (3900, 3918, "small")]
    assert s["migrations"] == 4 and s["failed"] == 0
    assert s["concurrent_descheduler_evacuations"] == 2  # the second of each cycle
    assert s["descheduler_refusals_by_reason"] == {}


def test_guard_takes_one_vm_per_cycle_and_refuses_the_rest_as_node_busy():
    d, s = run("guard")
    # cycle 300 s: one goes, the 3 others on the node are node_busy. cycle 3900 s: small at 3/8,
    # score 46 > mean 15.3 + 10: one more, 2 node_busy.
    assert [(r.start, r.end) for r in d.runs] == [(300, 318), (3900, 3918)]
    assert s["concurrent_descheduler_evacuations"] == 0
    assert s["descheduler_refusals_by_reason"] == {"node_busy": 5}
    assert s["policy_calls"] == 7 and s["descheduler_eviction_requests"] == 7


def test_plugin_moves_as_many_as_off_here():
    _, s = run("plugin")
    assert s["migrations"] == 4 and s["concurrent_descheduler_evacuations"] == 2


def test_same_seed_same_result_and_the_seed_matters():
    path = REPO / "examples" / "scenarios" / "two-retry-loops.yaml"
    a, _, _ = run_scenario(load_scenario(path), ["guard", "off"], hours=6)
    b, _, _ = run_scenario(load_scenario(path), ["guard", "off"], hours=6)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c, _, _ = run_scenario(load_scenario(path, seed=99), ["guard", "off"], hours=6)
    assert c["modes"]["off"]["cpu_spread_std_pp"] != a["modes"]["off"]["cpu_spread_std_pp"]


def test_repeat_moves_counts_a_vm_moved_again_within_an_hour():
    from app.sim.kubevirt import MigrationRun

    runs = [MigrationRun("a", "descheduler", 0, 0, 60, "x", "y", False),
            MigrationRun("a", "descheduler", 3000, 3000, 3060, "y", "x", False),  # 49 min after: repeat
            MigrationRun("a", "descheduler", 7000, 7000, 7060, "x", "y", False),  # 66 min after: not
            MigrationRun("b", "descheduler", 100, 100, 160, "x", "y", True),
            MigrationRun("b", "descheduler", 200, 200, 260, "x", "y", False)]  # first success of b
    assert repeat_moves(runs) == 1


def test_cli_writes_json_and_replaces_its_readme_section(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(HOT_NODE), encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text("# project\n\nintro\n", encoding="utf-8")
    args = ["simulate", "--scenario", str(scenario), "--out", str(tmp_path / "out"), "--readme", str(readme)]
    assert main(args) == 0
    assert main(args + ["--modes", "off,guard"]) == 0
    out = capsys.readouterr().out
    assert "| migrations (per VM per day) | 4 (4.00) | 2 (2.00) |" in out  # 12 VMs, 2 hours
    try:
        import matplotlib  # noqa: F401  (the optional 'sim' extra)
    except ImportError:
        assert "no plots: install the 'sim' extra" in out
    else:
        assert (tmp_path / "out" / "hot-node-utilisation.png").stat().st_size > 1000
    result = json.loads((tmp_path / "out" / "hot-node.json").read_text())
    assert set(result["modes"]) == {"off", "guard"} and result["modes"]["guard"]["migrations"] == 2
    text = readme.read_text()
    assert text.startswith("# project\n\nintro\n") and text.count("<!-- simulate:begin -->") == 1
    assert "## What the guard does to a cluster" in text and "kubevirt-eviction-guard simulate --scenario" in text


@pytest.mark.parametrize("change, message", [
    ({"nodes": "x"}, "nodes: expected a non-empty list"),
    ({"descheduler": {"interval": "ten minutes"}}, "descheduler.interval: not a duration"),
    ({"guard": {"migrationCooldown": "-5m"}}, "guard: migrationCooldown: must not be negative"),
    ({"plugin": {"pendingEvacuationsPerNode": 1}}, "plugin: unknown key(s): pendingEvacuationsPerNode"),
    ({"events": [{"at": "1h", "kind": "drain", "node": "nope"}]}, "events[0].node: no such node"),
    ({"colour": "blue"}, "scenario: unknown key(s): colour"),
])
def test_scenario_mistakes_are_named(change, message):
    with pytest.raises(ScenarioError, match=None) as e:
        parse_scenario({**HOT_NODE, **change}, "f.yaml")
    assert message in str(e.value) and str(e.value).startswith("f.yaml: ")


def test_cli_reports_a_bad_scenario_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n", encoding="utf-8")
    assert main(["simulate", "--scenario", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["simulate", "--scenario", str(bad), "--modes", "off,bogus"]) == 2
