"""The real descheduler evicting through the guard into real KubeVirt, and the outcome run in short
(``make e2e-outcome``: the full one).

Two modes of the outcome run (``tests/e2e/outcome``), side by side, each on its own control plane with real
virt-api and virt-controller (KubeVirt v1.8.3, the KubeVirt CR's migration settings from the scenario), for 90 s
each: the real descheduler v0.36 (KubeVirt profile settings, Prometheus score, EvictionsInBackground, its chart's
RBAC and token) without and with the guard (chart installed by Helm, guard and its canceller running with the
chart's ServiceAccount token, steering with the run's Prometheus: the VMs' CPU and memory as virt-handler and
KubeVirt's rules serve them, the nodes' capacity as kube-state-metrics does). The actor plays only the scheduler's
binding, kubelet and virt-handler, with the scenario's physics (``tests/e2e/actor``). The figures go to ``build/e2e/outcome.json`` (form "short"), which the
summary carries. Beside them, on a third control plane, the descheduler's limits with a VM in flight
(``outcome/limits.yaml``), against the simulator's model of them. Self-contained: it starts and stops its own control
planes, so it can run beside any other group.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import OUTCOME
from tests.e2e.outcome.__main__ import SCENARIO, outcome
from tests.e2e.outcome.run import SHORT_MODES

SHORT_SECONDS = 90
LIMITS = SCENARIO.with_name("limits.yaml")


@pytest.fixture(scope="module")
def runs(binaries, e2e_dir) -> tuple[dict, dict]:
    """The short outcome run (both modes) and the limits scenario, all three on their own control planes at once."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        short = pool.submit(outcome, SCENARIO, SHORT_SECONDS, e2e_dir / "outcome", list(SHORT_MODES), "short")
        limits = pool.submit(outcome, LIMITS, SHORT_SECONDS, e2e_dir / "limits", ["descheduler"], "limits")
        result = short.result()
        OUTCOME.parent.mkdir(parents=True, exist_ok=True)
        OUTCOME.write_text(json.dumps(result, indent=2) + "\n")
        return result, limits.result()


@pytest.fixture(scope="module")
def short_outcome(runs) -> dict:
    return runs[0]


@pytest.mark.timeout(900)
@pytest.mark.check("descheduler evicts through the guard")
def test_descheduler_evicts_through_the_guard(short_outcome, detail):
    real = short_outcome["modes"]
    guarded, plain = real["descheduler+guard"], real["descheduler"]
    # the descheduler did evict, in both modes (else nothing below would mean anything)
    assert plain["evictions_requested"] > 0 and guarded["evictions_requested"] > 0, real
    # every eviction of the guarded run went through the guard (the API server called it for each one)
    reasons = short_outcome["guard_decisions"]["descheduler+guard"]
    decisions = {k: v for k, v in reasons.items() if not k.startswith(("effect ", "prometheus "))}
    # the guard read the run's Prometheus (steering had data; without it the guard fails open)
    assert reasons.get("prometheus queries:ok", 0) > 0, reasons
    assert sum(decisions.values()) >= guarded["evictions_requested"], (decisions, guarded)
    assert any(k.startswith("denied:") for k in decisions), decisions
    # ... and the descheduler counted the answers as kubevirt-facts.md says: the background text as "background",
    # any other 429 as "error" (its own descheduler_pods_evicted_total, against the API server's audit log)
    for name, figures in real.items():
        counted = short_outcome["descheduler_counted"][name]
        assert counted.get("background", 0) == figures["evictions_background"], (name, counted, figures)
        assert counted.get("error", 0) == figures["evictions_refused"], (name, counted, figures)
    # every visit of an overutilised node in every cycle: what the simulator's descheduler would have done there
    for name, checked in short_outcome["cycle_check"].items():
        assert checked["node_visits"] > 0 and checked["inconsistent_count"] == 0, (name, checked)
    # Prometheus computed the profile's score from the actor's load as the simulator does
    for name, nodes in short_outcome["score_check"].items():
        assert all(abs(v["prometheus"] - v["model"]) <= 1 for v in nodes.values()), (name, nodes)
    detail["detail"] = (f"{SHORT_SECONDS} s per mode: descheduler {plain['evictions_requested']} evictions "
                        f"({plain['evictions_background']} background); "
                        f"with the guard {guarded['evictions_requested']} "
                        f"({guarded['evictions_background']} background, {guarded['evictions_refused']} refused: "
                        f"{decisions}; Prometheus query rounds {reasons.get('prometheus queries:ok', 0):g} ok, "
                        f"{reasons.get('prometheus queries:error', 0):g} failed); the descheduler's counters equal "
                        "the audit log's")


@pytest.mark.timeout(900)
@pytest.mark.check("outcome run (short)")
def test_outcome_with_the_guard_keeps_the_promises(short_outcome, detail):
    guarded = short_outcome["modes"]["descheduler+guard"]
    assert guarded["migrations"] > 0, guarded
    assert guarded["evictions_during_migration"] == 0, guarded
    assert guarded["cooldown_violations"] == 0, guarded
    assert guarded["max_leaving_per_node"] <= 1, guarded
    assert not short_outcome["notes"], short_outcome["notes"]
    detail["detail"] = json.dumps({"real": short_outcome["modes"], "model": short_outcome["model"]})


@pytest.mark.timeout(900)
@pytest.mark.check("descheduler limits as the simulator models them")
def test_a_node_with_one_vm_in_flight_is_limited_as_the_simulator_limits_it(runs, detail):
    limits = runs[1]
    real, model = limits["modes"]["descheduler"], limits["model"]["descheduler"]
    checked = limits["cycle_check"]["descheduler"]
    # every visit of the hot node, cycle by cycle, is what the simulator's descheduler does in that state:
    # evictionLimits.node (1) counts the cycle's own evictions, the in-flight pod among them when it is met first;
    # maxNoOfPodsToEvictPerNode (2) counts the VMs in flight too; a second VM is never refused for the first
    assert checked["node_visits"] > 0 and checked["inconsistent_count"] == 0, checked
    held = checked["with_in_flight"]
    assert held["visits"] > 0, checked  # the node was visited with a VM in flight
    assert held["sent_another"] + held["in_flight_pod_first"] + held["node_full"] == held["visits"], checked
    # never more than maxNoOfPodsToEvictPerNode leave, and 2 exactly when a second was sent
    assert real["max_leaving_per_node"] == (2 if held["sent_another"] else 1), (real, held)
    assert model["range"]["max_leaving_per_node"] == [2, 2], model
    detail["detail"] = (f"evictionLimits.node 1, maxNoOfPodsToEvictPerNode 2, evacuations that never end: "
                        f"{checked['node_visits']} visits of a hot node as the simulator's rules have them; with a VM "
                        f"in flight {held['visits']} visits, {held['sent_another']} sent a second VM, "
                        f"{held['in_flight_pod_first']} met the in-flight pod first and stopped, {held['node_full']} "
                        f"found 2 in flight; real "
                        f"{real['max_leaving_per_node']} VMs leaving one node (simulator, shuffling every cycle: "
                        f"{model['range']['max_leaving_per_node']})")
