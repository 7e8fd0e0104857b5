"""Whole runs: a small scenario whose numbers follow by hand, determinism, the CLI and scenario errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.sim.engine import Simulation, simulate
from app.sim.metrics import repeat_moves, summarize
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
    "kubevirt": {"networkGbps": 4.294967296, "migrationFailureProbability": 0},  # 0.5 GiB/s
    "descheduler": {"interval": "1h"},
}


def run(mode: str, data=HOT_NODE):
    d = simulate(parse_scenario(data, "hot-node"), mode)
    return d, summarize(d)


def test_upstream_takes_two_vms_per_cycle_sharing_the_nic_and_empties_the_small_node():
    d, s = run("upstream")
    # cycle at 300 s: 2 evicted; they share the small node's 0.5 GiB/s: 10 s + 4 GiB / 0.25 = 26 s.
    # cycle at 3900 s: small at 2/8 = 25%, bigs at 5/32: score 18 > mean 6 + 10 -> 2 more, small is empty.
    assert [(r.start, r.end, r.source) for r in sorted(d.runs, key=lambda r: (r.start, r.vm))] == [
        (300, 326, "small"), (300, 326, "small"), (3900, 3926, "small"), (3900, 3926, "small")]
    assert s["migrations_total"] == 4 and s["failed_migrations"] == 0 and s["max_leaving_per_node"] == 2
    assert s["evictions"] == {"allowed": 0, "background": 4, "error": 0}


def test_guard_takes_one_vm_per_cycle_and_refuses_the_rest_as_node_busy():
    d, s = run("upstream+guard")
    # cycle 300 s: one goes (alone on the NIC: 18 s), the next is node_busy, then a third is tried;
    # cycle 3900 s: small at 3/8, score 46 > mean 15.3 + 10: one more
    assert [(r.start, r.end) for r in d.runs] == [(300, 318), (3900, 3918)]
    assert s["max_leaving_per_node"] == 1 and s["descheduler_outcomes"]["node_busy"] >= 2
    assert s["evictions"]["background"] == 2 and s["evictions"]["error"] >= 2


def test_node_limit_1_takes_one_vm_per_cycle_without_refusals():
    d, s = run("node-limit-1")
    assert [(r.start, r.end) for r in d.runs] == [(300, 318), (3900, 3918)]
    assert s["evictions"] == {"allowed": 0, "background": 2, "error": 0}


def test_same_seed_same_result_and_the_seed_matters():
    path = REPO / "examples" / "scenarios" / "failing-migrations.yaml"
    a = summarize(simulate(load_scenario(path), "profile+guard", hours=3))
    b = summarize(simulate(load_scenario(path), "profile+guard", hours=3))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = summarize(simulate(load_scenario(path, seed=99), "profile+guard", hours=3))
    assert c["spread_cpu"] != a["spread_cpu"]


def test_a_draw_rolls_the_dice_again_on_the_same_workload():
    path = REPO / "examples" / "scenarios" / "failing-migrations.yaml"
    first, other = (Simulation(load_scenario(path), "upstream", hours=1, draw=k) for k in (0, 3))
    # the same cluster and load: placement and the load walks come from the workload's streams
    assert [v.node.name for v in first.kv.vmis] == [v.node.name for v in other.kv.vmis]
    a, b = first.run(), other.run()
    assert [cpu[0] for cpu in a.node_cpu] == [cpu[0] for cpu in b.node_cpu]  # the load before the first cycle
    # ... but another candidate order (and failure draws): the descheduler evicts other VMs
    assert [(r.vm, r.start) for r in a.runs] != [(r.vm, r.start) for r in b.runs]
    again = simulate(load_scenario(path), "upstream", hours=1, draw=3)
    assert [(r.vm, r.start, r.end) for r in again.runs] == [(r.vm, r.start, r.end) for r in b.runs]


def test_a_restart_runs_a_cycle_at_once_and_refills_the_cache_from_annotated_pods():
    data = {**HOT_NODE, "vms": [{**HOT_NODE["vms"][0], "dirtyRateMiBps": 1024}],  # never converge
            "events": [{"at": "1000s", "kind": "deschedulerRestart"}]}
    sim = Simulation(parse_scenario(data, "hot-node"), "upstream")
    cycles = []
    real = sim.desched.cycle
    sim.desched.cycle = lambda now: cycles.append(now) or real(now)
    sim.run()
    assert cycles == [300, 1000, 4600]  # at once, then hourly from the restart (3900 is gone)
    # the two failing VMs were found again through their annotation: observed entries, no lapse
    assert len(sim.desched.cache) == 2 and not any(e.assumed for e in sim.desched.cache.values())
    assert sum(1 for v in sim.kv.vmis if v.evacuation_node) == 2


def test_drains_cordon_or_autoscaler_taint_empty_the_node_and_their_entries_hold_the_descheduler():
    data = {**HOT_NODE, "hours": 1, "descheduler": {"interval": "60s", "firstRun": "600s"},
            "vms": [{**HOT_NODE["vms"][0], "memoryGiB": 2}],
            "events": [{"at": "60s", "kind": "drain", "node": "big-00", "how": "autoscaler"},
                       {"at": "60s", "kind": "drain", "node": "big-01", "how": "cordon"}]}
    d, s = run("upstream", data)
    assert [dr.done is not None for dr in d.drains] == [True, True]
    assert {r.cause for r in d.runs} == {"drain"}  # the small node has nowhere to go: nothing else moves
    assert s["drain_seconds"] is not None and s["drain_seconds"] < 600


def test_repeat_moves_counts_a_vm_moved_again_within_six_hours():
    from app.sim.kubevirt import MigrationRun

    runs = [MigrationRun("a", "descheduler", 0, 0, 60, "x", "y", False),
            MigrationRun("a", "descheduler", 3000, 3000, 3060, "y", "x", False),  # 49 min after: repeat
            MigrationRun("a", "descheduler", 30000, 30000, 30060, "x", "y", False),  # 7.5 h after: not
            MigrationRun("b", "descheduler", 100, 100, 160, "x", "y", True),
            MigrationRun("b", "descheduler", 200, 200, 260, "x", "y", False)]  # first success of b
    assert repeat_moves(runs) == 1


def test_cli_runs_seeds_and_modes_writes_summary_json_plots_csv_and_the_readme(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(HOT_NODE), encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text("# project\n\nintro\n\n<!-- simulate:begin -->\nstale-section-text\n<!-- simulate:end -->\n\nafter\n",
                      encoding="utf-8")
    out_dir = tmp_path / "out"
    args = ["simulate", "--scenario", str(scenario), "--seeds", "1-2", "--modes", "upstream,upstream+guard",
            "--out", str(out_dir), "--format", "csv", "--readme", str(readme), "--jobs", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| migrations | 4 | 2 |" in out and "`upstream+guard` vs `upstream`: migrations -50%" in out
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["seeds"] == [1, 2] and summary["scenario"] == "hot-node" and summary["hours"] == 2
    assert summary["modes"]["upstream"]["migrations_total"] == [4, 4]
    assert summary["modes"]["upstream+guard"]["evictions"]["background"] == [2, 2]
    assert summary["modes"]["upstream"]["drain_seconds"] == [None, None] and summary["simplifications"]
    assert "migrations.csv" in out and (out_dir / "spread.csv").read_text().startswith("mode,seed,t_seconds")
    try:
        import matplotlib  # noqa: F401  (the optional 'sim' extra)
    except ImportError:
        assert "(no plots: matplotlib is not installed; install it with: " in out
    else:
        assert (out_dir / "hot-node-timeline.png").stat().st_size > 1000
    # the modes, the files and the simplifications: once, in the output folder, not on the terminal
    assert "Only virt-launcher pods" not in out and f"wrote {out_dir / 'README.md'}" in out
    notes = (out_dir / "README.md").read_text()
    assert "| `upstream+guard` | upstream descheduler" in notes and "the guard at its default settings" in notes
    assert "- `summary.json`: every number" in notes and "- `migrations.csv`: every migration" in notes
    assert "## Simplifications of the model" in notes and "Only virt-launcher pods" in notes
    text = readme.read_text()
    assert text.startswith("# project\n\nintro\n") and text.count("<!-- simulate:begin -->") == 1
    assert "stale-section-text" not in text and text.endswith("<!-- simulate:end -->\n\nafter\n")
    assert "--seeds 1-2" in text


def test_guard_set_reaches_the_guard_and_bad_values_are_named(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(HOT_NODE), encoding="utf-8")
    base = ["simulate", "--scenario", str(scenario), "--modes", "upstream+guard", "--jobs", "1"]
    assert main(base + ["--guard-set", "pendingEvacuationsPerNode=0"]) == 0
    assert "| migrations | 4 |" in capsys.readouterr().out  # no node budget: as upstream
    assert main(base + ["--guard-set", "migrationCooldown=soon"]) == 2
    assert "migrationCooldown" in capsys.readouterr().err
    assert main(base + ["--guard-set", "colour=blue"]) == 2


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
    good = tmp_path / "good.yaml"
    good.write_text(json.dumps(HOT_NODE), encoding="utf-8")
    assert main(["simulate", "--scenario", str(good), "--modes", "off,bogus"]) == 2
    assert "unknown mode 'bogus'" in capsys.readouterr().err
    assert main(["simulate", "--scenario", str(good), "--seeds", "5-1"]) == 2


def test_stall_counts_cycles_held_by_in_flight_entries_of_failing_vms_only():
    # the small node is hot; its VMs never converge: both marked VMs fail forever and fill the
    # node's limit of 2, so later cycles evict nothing until the assumed entries lapse
    failing = {**HOT_NODE, "descheduler": {"interval": "60s"},
               "vms": [{**HOT_NODE["vms"][0], "dirtyRateMiBps": 1024}]}
    d, s = run("upstream", failing)
    assert s["stall_seconds"] > 0 and s["blocked_by_in_flight_seconds"] >= s["stall_seconds"]
    assert s["in_flight_lapsed"] >= 1 and s["failed_migrations"] > 0
    ok = {**HOT_NODE, "descheduler": {"interval": "60s"}}
    _, s = run("upstream", ok)
    assert s["stall_seconds"] == 0 and s["failed_migrations"] == 0


def test_candidate_longrest_holds_the_node_an_hour_after_its_departure():
    # as above, but the departure at 300-318 s puts "small" in node cooldown (rule 8b) for 60 min: at 3900 s
    # (3582 s later) the descheduler is refused with node_cooldown and nothing moves. The node cooldown knows a
    # descheduler move by its VMIM's system-maintenance priority: KubeVirt with the MigrationPriorityQueue gate on
    gated = {**HOT_NODE, "kubevirt": {**HOT_NODE["kubevirt"], "migrationPriorityQueue": True}}
    d, s = run("upstream+guard-longrest", gated)
    assert [(r.start, r.end) for r in d.runs] == [(300, 318)]
    assert s["descheduler_outcomes"]["node_cooldown"] >= 1
    d, s = run("upstream+guard-nodecool", gated)  # 15 min: over by 3900 s
    assert [(r.start, r.end) for r in d.runs] == [(300, 318), (3900, 3918)]
    # v1.8's default (gate off): the VMIM has no priority and the VMI's eviction-source annotation is gone after
    # the move, so the guard cannot tell the departure was the descheduler's and the node never rests
    d, s = run("upstream+guard-longrest")
    assert [(r.start, r.end) for r in d.runs] == [(300, 318), (3900, 3918)]
    assert s["descheduler_outcomes"].get("node_cooldown", 0) == 0


def test_without_matplotlib_the_exact_install_command_is_named(tmp_path, capsys, monkeypatch):
    from app.sim import run as sim_run

    command = sim_run.install_command()
    assert command.startswith(sys.executable) and command.endswith("-m pip install 'matplotlib>=3.8'")
    monkeypatch.setattr(sim_run, "plotting_available", lambda: False)  # as after `make run`: no 'sim' extra
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(HOT_NODE), encoding="utf-8")
    assert main(["simulate", "--scenario", str(scenario), "--modes", "upstream", "--jobs", "1",
                 "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert err == f"kubevirt-eviction-guard simulate: no plots: matplotlib is not installed; install it with: {command}\n"
    assert f"(no plots: matplotlib is not installed; install it with: {command})" in out
    assert not list((tmp_path / "out").glob("*.png"))


def test_balance_counts_time_above_the_descheduler_threshold_and_the_longest_hot_stretch():
    from app.sim.metrics import balance

    # a is 30 points above the mean at 0 and 10 s (hot for 20 s), cools at 20 s; b gets hot at 30 s until the end
    scores = [{"a": 60, "b": 10, "c": 20}, {"a": 60, "b": 10, "c": 20}, {"a": 30, "b": 30, "c": 30},
              {"a": 10, "b": 60, "c": 20}]
    out = balance([0, 10, 20, 30], scores, 45, high=10)
    assert out["hot_node_seconds"] == 20 + 15 and out["hot_longest_seconds"] == 20
    assert out["spread_score"] == round(3 * (1400 / 3) ** 0.5 / 4, 3)  # std 21.6 three times, 0 once
    # at the threshold exactly is not above it (the descheduler's ``>``)
    assert balance([0], [{"a": 20, "b": 0}], 10, high=10)["hot_node_seconds"] == 0


def test_the_descheduler_cycles_at_given_seconds_instead_of_its_interval():
    from app.sim.engine import simulate
    from app.sim.scenario import load_scenario

    sc = load_scenario("tests/e2e/outcome/scenario.yaml")
    regular = simulate(sc, "upstream", hours=0.05)
    assert regular.descheduler_cycles == len(range(sc.descheduler.first_run, 180 + 1, sc.descheduler.interval))
    given = simulate(sc, "upstream", hours=0.05, cycle_times=[26, 37, 47, 170])
    assert given.descheduler_cycles == 4
