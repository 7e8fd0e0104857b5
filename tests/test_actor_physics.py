"""The outcome run's actor plays the guests and NICs with the simulator's physics: a copy alone on its NIC ends
when ``app.sim.kubevirt.migration_duration`` says, for every kind of VM of the e2e scenario; a shared NIC slows
both copies; the scheduler's pick is the simulator's."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from random import Random

from app.sim.kubevirt import migration_duration
from app.sim.scenario import load_scenario
from tests.e2e.actor.physics import Copies, choose_target

SCENARIO = Path(__file__).parent / "e2e" / "outcome" / "scenario.yaml"


def _scenario():
    sc = load_scenario(SCENARIO)
    return sc, copy.deepcopy(sc.nodes), copy.deepcopy(sc.vms)


def test_a_copy_alone_ends_when_the_simulator_says():
    sc, nodes, vms = _scenario()
    settings = sc.kubevirt
    seen = set()
    for vm in vms:
        c_rng_free = Copies(dataclasses.replace(settings, failure_probability=0.0), nodes, Random(0))
        c_rng_free.start("m", vm, nodes[0].name, nodes[1].name, 100.0)
        c = c_rng_free.copies["m"]
        expected, aborted = migration_duration(vm.memory, vm.dirty_rate, settings.network, settings)
        assert math.ceil(c.end_at - 100.0 - 1e-9) == expected - settings.setup_seconds, vm.name
        assert bool(c.why) == aborted, (vm.name, c.why)
        assert c_rng_free.outcome("m", c.end_at - 0.01) is None
        assert c_rng_free.outcome("m", c.end_at) == (aborted, c.why)
        seen.add((vm.group, aborted))
    assert ("db", True) in seen and ("app", False) in seen  # the scenario has both kinds


def test_a_shared_nic_slows_both_copies_and_one_ending_speeds_the_other():
    sc, nodes, vms = _scenario()
    settings = dataclasses.replace(sc.kubevirt, failure_probability=0.0)
    app = next(vm for vm in vms if vm.group == "app")
    copies = Copies(settings, nodes, Random(0))
    copies.start("a", app, "worker-00", "worker-01", 0.0)
    alone = copies.copies["a"].end_at
    copies.start("b", app, "worker-00", "worker-02", 0.0)
    shared = copies.copies["a"].end_at
    assert shared > alone
    copies.stop("b", 0.5)
    assert alone < copies.copies["a"].end_at < shared


def test_the_target_is_the_least_allocated_node_that_fits_and_never_the_source():
    sc, nodes, vms = _scenario()
    big = next(vm for vm in vms if vm.group == "big")
    requests = {n.name: (1.0, 100.0) for n in nodes}
    requests["worker-03"] = (0.5, 10.0)
    assert choose_target(big, "worker-05", nodes, requests, Random(0)).name == "worker-03"
    assert choose_target(big, "worker-03", nodes, requests, Random(0)).name != "worker-03"
    requests["worker-03"] = (0.5, nodes[3].memory - 1)  # the VM's memory does not fit there
    assert choose_target(big, "worker-05", nodes, requests, Random(0)).name != "worker-03"
    pinned = next(vm for vm in vms if vm.target_unschedulable)
    assert choose_target(pinned, "worker-05", nodes, requests, Random(0)) is None


def test_the_real_figures_read_who_answered_from_the_audit_log_and_retries_from_the_record():
    from app.policy.model import PolicySettings
    from tests.e2e.outcome.figures import real_figures

    hook = 'admission webhook "virt-launcher-eviction-interceptor.kubevirt.io" denied the request: '
    guard = 'admission webhook "guard.example" denied the request: '
    answers = [(429, hook + 'Eviction triggered evacuation of VMI "vms/a"'),
               (429, hook + 'Evacuation in progress: Eviction triggered evacuation of VMI "vms/a"'),
               (429, hook + 'Eviction request for target Pod of VMI "vms/b"'),
               (429, guard + 'Evacuation in progress: Eviction triggered evacuation of VMI "vms/c"'),
               (429, guard + "cooldown")]
    # a: marked at 10, failed at 40, retried at 100 (still marked: not a new evacuation), evicted anew at 5000
    runs = [{"vm": "a", "cause": "descheduler", "created": 10, "start": 10, "end": 40, "failed": True,
             "copy_start": 12, "retry": False},
            {"vm": "a", "cause": "descheduler", "created": 100, "start": 100, "end": 110, "failed": False,
             "copy_start": 102, "retry": True},
            {"vm": "a", "cause": "descheduler", "created": 5000, "start": 5000, "end": None, "failed": False,
             "copy_start": None, "retry": False}]
    plugin = PolicySettings(migration_cooldown=150, max_migration_cooldown=3600, migration_history_window=28800)
    f = real_figures(answers, {"runs": runs, "max_leaving_per_node": 1}, plugin)
    assert f["evictions_requested"] == 5 and f["evictions_background"] == 3 and f["evictions_refused"] == 2
    assert f["evictions_reaching_kubevirt"] == 3 and f["evictions_during_migration"] == 2
    assert f["migrations"] == 3 and f["migrations_failed"] == 1
    assert f["cooldown_violations"] == 0  # the retry at 100 is KubeVirt's; 5000 is past any cooldown
    runs[1]["retry"] = False  # the same attempt as a new eviction, 60 s after the failure: inside the cooldown
    assert real_figures(answers, {"runs": runs, "max_leaving_per_node": 1}, plugin)["cooldown_violations"] == 1


def test_the_outcome_policy_lets_the_descheduler_evict_virt_launcher_pods():
    """Real virt-launcher pods have emptyDir volumes; descheduler v0.36 protects such pods unless told otherwise."""
    from app.sim.scenario import DeschedulerSettings
    from tests.e2e.outcome.descheduler import policy, protects_local_storage

    doc = policy("http://127.0.0.1:9", DeschedulerSettings())
    assert not protects_local_storage(doc)
    doc["profiles"][0]["pluginConfig"][0]["args"].pop("evictLocalStoragePods")
    assert protects_local_storage(doc)
    doc["profiles"][0]["pluginConfig"][0]["args"]["podProtections"] = {"defaultDisabled": ["PodsWithLocalStorage"]}
    assert not protects_local_storage(doc)
