"""The simulated descheduler against hand-computed cases: the metric, classification, pod choice, limits."""

from __future__ import annotations

from random import Random

from app.sim.descheduler import Descheduler, classify, node_scores, pressure
from app.sim.kubevirt import Answer
from app.sim.scenario import DeschedulerSettings
from tests.sim_helpers import cluster


def test_score_is_three_times_the_norm_of_positive_deviations_capped():
    # cpu use averages 0.5: the 0.7 node is 0.2 above -> 0.6 -> 60; nodes below score 0
    assert node_scores([(0.5, 0.5, 0, 0), (0.7, 0.5, 0, 0), (0.3, 0.5, 0, 0)]) == [0, 60, 0]
    # two dimensions above average: 3 x sqrt(0.03^2 + 0.04^2) = 0.15
    assert node_scores([(0.53, 0.54, 0, 0), (0.47, 0.46, 0, 0)]) == [15, 0]
    # capped at 1
    assert node_scores([(0.9, 0.9, 0.5, 0), (0.1, 0.1, 0, 0)]) == [100, 0]


def test_pressure_counts_only_above_70_percent():
    assert pressure(0.7) == 0 and pressure(0.5) == 0
    assert abs(pressure(1.0) - 0.5) < 1e-9 and pressure(1.6) == 1.0


def test_classification_uses_deviation_from_the_mean_of_percents():
    scores = {"a": 0, "b": 0, "c": 30, "d": 10}  # mean 10
    c = classify(scores, set(scores), low=0, high=10)
    assert c.under == ("a", "b", "d") and c.over == ("c",) and c.act
    # a cordoned node is never underutilised
    assert classify(scores, {"a", "c", "d"}, 0, 10).under == ("a", "d")
    # nothing over mean + high: no action
    assert not classify({"a": 0, "b": 15}, {"a", "b"}, 0, 10).act
    # over nodes are visited highest first
    assert classify({"a": 0, "b": 0, "c": 0, "x": 50, "y": 60}, set("abcxy"), 0, 10).over == ("y", "x")


def _descheduler(kv, admit=None, pre_filter=None, **settings):
    s = DeschedulerSettings(**settings)
    return Descheduler(
        s, kv,
        admit or (lambda pod, now: kv.admit_eviction(pod.name, now, True)),
        pre_filter or (lambda pod, now: None),
        Random("d"),
    )


def test_two_pods_from_every_overutilised_node_within_the_total_and_in_flight_across_cycles():
    kv, clock, _ = cluster(4, 4, node_memory=256)
    d = _descheduler(kv, max_total=3)
    d.scores = {"n0": 50, "n1": 40, "n2": 0, "n3": 0}  # mean 22.5: n0, n1 over; n2, n3 under
    d.cycle(0)
    marked = [v for v in kv.vmis if v.evacuation_node]
    assert sorted(v.node.name for v in marked) == ["n0", "n0", "n1"]  # 2 from n0, then the total (3) stops n1
    assert d.attempts == 3 and d.background == 3
    # the soft-tainter: every node that is not underutilised
    assert [n.soft_tainted for n in kv.nodes] == [True, True, False, False]
    # next cycle, migrations still in flight (nothing ran): the limits count them
    d.cycle(600)
    assert d.attempts == 3
    # once they are done (the pods are gone), the node can be relieved again
    clock.run_until(10_000)
    d.cycle(10_000)
    assert d.attempts == 6


def test_a_refusal_without_background_text_moves_on_to_the_next_candidate():
    kv, _, _ = cluster(3, 3)
    refused = []

    def admit(pod, now):
        if not refused:
            refused.append(pod.name)
            return Answer(False, "VMI is in migration cooldown", "cooldown")
        return kv.admit_eviction(pod.name, now, True)

    d = _descheduler(kv, admit=admit)
    d.scores = {"n0": 60, "n1": 0, "n2": 0}
    d.cycle(0)
    assert d.attempts == 3 and d.background == 2  # one refused, the next two went
    assert d.outcomes == {"cooldown": 1, "kubevirt_evacuation": 2}
    assert refused[0] not in d.tracked


def test_the_pre_eviction_filter_skips_pods():
    kv, _, _ = cluster(3, 3)
    d = _descheduler(kv, pre_filter=lambda pod, now: "plugin_cooldown" if pod.vmi.name != "vm02" else None)
    d.scores = {"n0": 60, "n1": 0, "n2": 0}
    d.cycle(0)
    assert d.background == 1 and d.outcomes["plugin_cooldown"] == 2
    assert [v.name for v in kv.vmis if v.evacuation_node] == ["vm02"]


def test_an_unconfirmed_background_eviction_lapses_after_ten_minutes_at_a_sweep():
    kv, _, _ = cluster(3, 3)
    # background text, but nothing marks the pod (as if KubeVirt never annotated it)
    d = _descheduler(kv, admit=lambda pod, now: Answer(False, "Eviction triggered evacuation of VMI", "x"))
    d.scores = {"n0": 60, "n1": 0, "n2": 0}
    d.cycle(0)
    assert len(d.tracked) == 2
    d.sweep(600)  # not older than 10 minutes yet
    assert len(d.tracked) == 2
    d.sweep(1200)
    assert d.tracked == {}


def test_a_confirmed_eviction_is_tracked_until_its_pod_is_gone_and_survives_a_restart():
    kv, clock, _ = cluster(2, 2, dirty_mib=1024, memory=2)  # migrations keep failing: the mark stays
    d = _descheduler(kv, max_per_node=1, eviction_limit_node=1)
    d.scores = {"n0": 60, "n1": 0}
    d.cycle(0)
    clock.run_until(3000)
    d.sweep(3000)
    assert len(d.tracked) == 1
    d.restart()
    assert len(d.tracked) == 1
    d.cycle(3600)  # n0 still at its per-node limit: nothing more
    assert d.attempts == 1
