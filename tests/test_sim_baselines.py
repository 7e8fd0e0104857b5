"""Today's baselines (OpenShift 4.22's profile, its node limit 1, the actuation-priority query, KubeVirt 1.9) and
the operator's actuation-priority recording rules (app/sim/recording.py)."""

from __future__ import annotations

import pytest

from app.sim.descheduler import node_scores
from app.sim.engine import Simulation
from app.sim.guards import ACTUATION, parse_mode
from app.sim.recording import ActuationPriority, cooldown_multiplier, quantile
from app.sim.scenario import parse_scenario

SCENARIO = {
    "name": "small", "hours": 2, "seed": 3,
    "nodes": [{"name": "worker", "count": 4, "cpu": 16, "memoryGiB": 128}],
    "vms": [{"name": "app", "count": 24, "cpu": 2, "memoryGiB": 8,
             "cpuLoad": {"profile": "spikes", "base": 0.3, "level": 0.95, "every": ["2m", "4m"],
                         "probability": 0.1, "duration": "5m"}}],
    "kubevirt": {"networkGbps": 10},
    "descheduler": {"interval": "60s", "deviationThresholds": {"low": 0, "high": 10}},
}


def test_openshift_baselines_set_what_the_operators_write():
    ocp, one, act, kv19 = (parse_mode(m).baseline for m in ("ocp", "ocp-node1", "ocp-actuation", "ocp-kv19"))
    assert ocp.plugin and (ocp.eviction_limit_node, ocp.max_per_node) == (2, 2) and ocp.query != ACTUATION
    assert dict(ocp.kubevirt) == {"parallel_outbound_migrations_per_node": 1}
    assert (one.eviction_limit_node, one.max_per_node) == (1, 1)  # the CR's evictionLimits.node sets both
    assert act.query == ACTUATION and not act.count_background
    assert dict(kv19.kubevirt) == {"parallel_outbound_migrations_per_node": 1, "migration_priority_queue": True}
    assert parse_mode("node-limit-1").baseline.max_per_node is None  # the older baseline keeps its meaning


def test_a_run_uses_the_baselines_kubevirt_and_limits():
    sc = parse_scenario(SCENARIO, "small")
    sim = Simulation(sc, "ocp-node1-kv19")
    assert sim.kv.s.parallel_outbound_migrations_per_node == 1 and sim.kv.s.migration_priority_queue
    assert (sim.ds.eviction_limit_node, sim.ds.max_per_node) == (1, 1)
    assert sc.kubevirt.parallel_outbound_migrations_per_node == 2  # the scenario itself is untouched
    assert Simulation(sc, "upstream").kv.s.parallel_outbound_migrations_per_node == 2


def test_quantile_is_promqls():
    assert quantile(0.66, [5.0]) == 5.0
    assert quantile(0.66, [0.0, 10.0]) == pytest.approx(6.6)
    assert quantile(0.66, [4.0, 0.0, 1.0, 3.0, 2.0]) == pytest.approx(2.64)  # rank 2.64 of 0..4, interpolated


def test_cooldown_multiplier_falls_a_tenth_per_success_to_a_floor():
    assert [cooldown_multiplier(n) for n in (0, 1, 5)] == pytest.approx([1.0, 0.9, 0.5])
    assert cooldown_multiplier(10) == pytest.approx(0.01) and cooldown_multiplier(30) == pytest.approx(0.01)


def test_actuation_priority_filters_a_short_spike_and_damps_a_node_that_just_sent_pods():
    quiet, spike = [(0.5, 0.5, 0, 0), (0.5, 0.5, 0, 0)], [(0.9, 0.5, 0, 0), (0.1, 0.5, 0, 0)]
    a = ActuationPriority()
    for t in range(0, 300, 60):
        assert a.record(t, ["a", "b"], quiet) == [0, 0]
    got = a.record(300, ["a", "b"], spike)  # one spiking sample in five: the 66th percentile ignores it
    assert got == [0, 0] and node_scores(spike)[0] == 100, got
    for t in (360, 420):
        got = a.record(t, ["a", "b"], spike)
    assert got == [100, 0]  # three of five: p66 sees it (3 x 0.4, capped)
    a.success(430, "a")
    a.success(440, "a")
    assert a.record(480, ["a", "b"], spike) == [80, 0]  # two successes in 10 minutes: x 0.8
    assert a.record(1080, ["a", "b"], spike) == [100, 0]  # the successes are out of the window


def test_background_evictions_do_not_count_as_successes_unless_asked():
    sc = parse_scenario(SCENARIO, "small")
    counted = {}
    for mode in ("ocp-actuation", "ocp-actuation-counted"):
        sim = Simulation(sc, mode)
        seen = []
        sim.desched.on_success = lambda now, node, seen=seen: seen.append((now, node))
        d = sim.run()
        counted[mode] = (len(seen), d.answers["background"], d.answers["allowed"])
    (real, bg, allowed), (intent, bg2, _) = counted["ocp-actuation"], counted["ocp-actuation-counted"]
    assert bg > 0 and real == allowed, counted  # only evictions the API server allowed at once
    assert bg2 > 0 and intent > 0, counted  # the what-if counts finished background evictions


def _summary(**modes):
    return {"modes": {m: {"migrations_total": [mig], "spread_score": [spr]} for m, (mig, spr) in modes.items()}}


def test_best_plain_setting_moves_fewest_vms_among_those_with_a_spread_near_the_best():
    from app.sim.report import best_plain, goal

    s = _summary(**{"ocp": (500, 10.0), "ocp-node1": (400, 10.4), "ocp-actuation": (300, 12.0),
                    "ocp+guard": (270, 10.5)})
    base = ("ocp", "ocp-node1", "ocp-actuation")
    assert best_plain(s["modes"], base) == "ocp-node1"  # ocp-actuation moves fewer, at a 20% wider spread
    [(version, guard, best, cut, ratio, met)] = goal(s)
    assert (version, guard, best) == ("1.8.3", "ocp+guard", "ocp-node1")
    assert cut == pytest.approx(0.325) and ratio == pytest.approx(10.5 / 10.4) and met
    s["modes"]["ocp+guard"]["spread_score"] = [11.0]  # 5.8% wider than ocp-node1's
    assert not goal(s)[0][5]
