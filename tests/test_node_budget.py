"""The node budget's invariant, and what makes a held node visible.

The invariant (docs/decisions.md): with the guard, never more descheduler-caused VMs leave a node that is not
being drained than ``pendingEvacuationsPerNode``. A departure counts until it ends (the VM left, or it is no longer
marked and has no unfinished VMIM), stuck or waiting ones too. Checked here on short simulator runs of the
scenarios where it used to break (and of those unlike the built-in ones), across seeds and guard modes, and on
the policy functions that rule 8 and the held-node watch share.
"""

from __future__ import annotations

import time

import pytest

from app.domain.records import KubeVirtRecord
from app.metrics import Metrics
from app.policy import PolicySettings
from app.policy.decide import fix_for, held_node, is_leaving, leavers, not_migratable
from app.sim.engine import simulate
from app.sim.scenario import read_scenario, scenario_with_seed
from tests.builders import (
    MIN,
    NOW,
    condition,
    failing_evacuation,
    mstate,
    node,
    store_of,
    vmi,
    vmim,
)

SRC = {"kubevirt.io/eviction-source": "descheduler"}
MAINT = "system-maintenance"
BACKUP = condition("migrationBlockedByBackup", "BackupInProgress", "Waiting for backup nightly to complete")

# ---- the invariant on the simulator ------------------------------------------------------------

SCENARIOS = ("failing-migrations", "fleet", "tight", "drains")
GUARD_MODES = ("upstream+guard", "ocp+guard", "upstream+guard-nosteer", "profile+guard-nocancel")
SEEDS = (1, 2, 3)
HOURS = 3.0


@pytest.fixture(scope="module")
def scenario_data():
    return {name: read_scenario(f"examples/scenarios/{name}.yaml") for name in SCENARIOS}


@pytest.mark.timeout(600)  # a guard against a hang only: 12 short runs, with steering, on a busy machine
@pytest.mark.parametrize("name", SCENARIOS)
def test_never_more_descheduler_caused_leavers_on_a_node_than_the_budget(scenario_data, name):
    """Every guard mode, every seed: at most one VM (the default budget) leaves a node that is not drained."""
    worst = {}
    for seed in SEEDS:
        sc = scenario_with_seed(scenario_data[name], f"{name}.yaml", seed)
        for mode in GUARD_MODES:
            worst[(seed, mode)] = simulate(sc, mode, HOURS).max_leaving_per_node
    assert max(worst.values()) <= 1, {k: v for k, v in worst.items() if v > 1}
    assert max(worst.values()) == 1, "VMs did leave: the check measured something"


def test_the_measure_sees_a_broken_budget_without_the_guard(scenario_data):
    """The same measure on the same runs without the guard: the descheduler's own limits let 2 and more go."""
    sc = scenario_with_seed(scenario_data["fleet"], "fleet.yaml", 1)
    assert simulate(sc, "upstream", HOURS).max_leaving_per_node >= 2


def test_a_budget_of_two_holds_at_two(scenario_data):
    sc = scenario_with_seed(scenario_data["fleet"], "fleet.yaml", 2)
    d = simulate(sc, "upstream+guard-nocancel", HOURS, {"pendingEvacuationsPerNode": "2"})
    assert d.max_leaving_per_node == 2


# ---- rule 8's count and the held-node view, on the policy functions ---------------------------------

NODES = [node("worker-a"), node("worker-b"), node("worker-c", cordoned=True)]


DEFAULTS = PolicySettings()


def leaving_names(objects, at="worker-a", now=NOW, settings=DEFAULTS):
    return [(x.name, x.state) for x in leavers(at, store_of(*NODES, *objects), now, settings)]


def test_an_arrival_is_not_a_departure_even_if_an_index_offers_it():
    """is_leaving itself (the store's index already leaves arrivals out): a receive VMIM leaves no node of ours."""
    store = store_of(*NODES, vmi("web", "worker-a"), vmim("w1", "web", "Running", 3, receive=True),
                     vmim("w2", "web", "Synchronizing", 3, send_to=True))
    web = store.vmi("vms", "web")
    receive = [m for m in store.migrations("vms", "web") if m.name == "w1"]
    send = [m for m in store.migrations("vms", "web") if m.name == "w2"]
    assert not is_leaving(web, receive, "worker-a")
    assert is_leaving(web, send, "worker-a")


def test_leavers_oldest_first_with_their_state():
    objects = [
        vmi("stuck", "worker-a", evacuation="worker-a", annotations=SRC), *failing_evacuation("stuck", "worker-a", 3),
        vmi("slow", "worker-a", migration=mstate("s1", "worker-a", "worker-b", 5)),
        vmi("waits", "worker-a", evacuation="worker-a", annotations=SRC),
        vmim("waits-1", "waits", "Pending", 30, evacuation="worker-a", priority=MAINT, conditions=[BACKUP]),
    ]
    assert leaving_names(objects) == [
        ("waits", "waiting: migrationBlockedByBackup (BackupInProgress: Waiting for backup nightly to complete)"),
        ("stuck", "stuck: 3 failed attempts in 15m0s"),
        ("slow", ""),
    ]


def held(objects, settings=DEFAULTS, now=NOW, at="worker-a"):
    store = store_of(*NODES, *objects)
    return held_node(store.node(at), store, now, settings)


def test_a_node_held_longer_than_evacuation_stale_after_is_shown_with_the_fix():
    objects = [vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
               *failing_evacuation("db", "worker-a", 3, first=70)]  # leaving for 70 minutes
    h = held(objects)
    assert h is not None and h.node == "worker-a" and h.held_for == pytest.approx(70 * MIN)
    (one,) = h.holders
    assert one.state == "stuck: 3 failed attempts in 1h10m0s"
    assert "virtctl evacuate-cancel vmi db -n vms" in fix_for(one) and "--cancel-stuck-evacuations" in fix_for(one)
    assert held(objects, PolicySettings(evacuation_stale_after=2 * 3600)) is None  # not long enough yet
    assert held(objects, PolicySettings(pending_evacuations_per_node=2)) is None  # the budget is not full
    assert held(objects, PolicySettings(pending_evacuations_per_node=0)) is None  # rule 8 off


def test_a_drained_node_is_never_held():
    objects = [vmi("db", "worker-c", evacuation="worker-c", annotations=SRC),
               *failing_evacuation("db", "worker-c", 3, first=70)]
    assert held(objects, at="worker-c") is None


def test_with_budget_two_the_node_is_held_since_the_second_departure_began():
    objects = [vmi("old", "worker-a", evacuation="worker-a", annotations=SRC),
               *failing_evacuation("old", "worker-a", 3, first=180),
               vmi("new", "worker-a", migration=mstate("n1", "worker-a", "worker-b", 75))]
    h = held(objects, PolicySettings(pending_evacuations_per_node=2))
    assert h is not None and h.held_for == pytest.approx(75 * MIN)
    assert [x.name for x in h.holders] == ["old", "new"]
    assert "wait for its migration" in fix_for(h.holders[1])


def test_a_waiting_evacuation_holds_the_node_and_its_fix_is_not_a_cancel_by_the_guard():
    objects = [vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
               vmim("db-1", "db", "Pending", 90, evacuation="worker-a", priority=MAINT, conditions=[BACKUP])]
    h = held(objects)
    assert h is not None and h.holders[0].state.startswith("waiting: migrationBlockedByBackup")
    assert "the guard never cancels a waiting evacuation" in fix_for(h.holders[0])


# ---- rule 7n's judgement -------------------------------------------------------------------------


@pytest.mark.parametrize("vm, cr, expect", [
    ({"strategy": "None"}, None, "evictionStrategy None, from spec.evictionStrategy"),
    ({}, KubeVirtRecord("kubevirt", "kubevirt", eviction_strategy="None"), "the KubeVirt CR's evictionStrategy"),
    ({}, KubeVirtRecord("kubevirt", "kubevirt"), "KubeVirt's default"),
    ({}, None, None),  # nothing known: fail open
    ({"strategy": "LiveMigrate"}, KubeVirtRecord("kubevirt", "kubevirt"), None),
    ({"strategy": "External"}, None, None),  # KubeVirt marks it for an external controller: not shut down
    ({"strategy": "LiveMigrateIfPossible", "migratable": ("Unknown", "", "")}, None, "LiveMigratable Unknown"),
    ({"strategy": "LiveMigrateIfPossible", "migratable": ("False", "HostDeviceNotLiveMigratable", "")}, None,
     "LiveMigratable False: HostDeviceNotLiveMigratable"),
])
def test_not_migratable(vm, cr, expect):
    record = store_of(vmi("db", "worker-a", **vm)).vmi("vms", "db")
    why = not_migratable(record, cr)
    assert (why is None) if expect is None else (expect in why), why


# ---- the held-node watch against the fake API server, with the real client ----------------------------


def test_held_node_watch_writes_one_warning_event_and_sets_the_gauges(tmp_path):
    from kubernetes import client as k8s

    from app.backoff import Backoff
    from app.cluster.listing import list_into
    from app.cluster.store import ClusterStore
    from app.effects import Effects, KubeEffectsApi
    from tests.fakeapi import FakeApiServer
    from tests.fakeapi import objects as o

    now = time.time()
    with FakeApiServer() as api:
        for n in ("node-a", "node-b", "node-c"):
            api.put(o.node(n))
        stuck = o.vmi("vms", "db", node="node-a", uid="uid-db", evacuation_node="node-a", created=now - 86400)
        stuck["metadata"]["annotations"]["kubevirt.io/eviction-source"] = "descheduler"
        api.put(stuck)
        api.put(o.launcher_pod("vms", "db", "node-a", name="virt-launcher-db", vmi_uid="uid-db"))
        for i in range(3):  # three failed attempts, the first 70 minutes ago
            created = now - 4200 + i * 600
            api.put(o.vmim("vms", f"db-e{i}", "db", phase="Failed", start=created + 30, end=created + 200,
                           source_node="node-a", target_node="node-b", evacuation_node="node-a", created=created,
                           priority=MAINT))
        pinned = o.launcher_pod("vms", "web", "node-b", name="virt-launcher-web", vmi_uid="uid-web")
        pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
        api.put(o.vmi("vms", "web", node="node-b", uid="uid-web", created=now - 86400))
        api.put(pinned)
        with k8s.ApiClient(api.configuration()) as kube:
            store = ClusterStore()
            list_into(kube, store)
            metrics = Metrics()
            fx = Effects(store, KubeEffectsApi(kube, timeout=(1.0, 2.0)), metrics, backoff=Backoff(base=0.05, cap=0.2))
            watch = fx.watch_held_nodes(store, PolicySettings(), ready=lambda: True, interval=3600)
            fx.start()
            try:
                assert watch.scan() == 1
                assert watch.scan() == 0  # told once per VMI and node, not at every pass
                assert fx.queue.wait_idle(5)
            finally:
                fx.stop()
        events = [e for e in api.events() if e.get("reason") == "NodeHeld"]
        assert len(events) == 1 and events[0]["type"] == "Warning"
        assert events[0]["involvedObject"]["name"] == "db" and events[0]["involvedObject"]["uid"] == "uid-db"
        message = events[0]["message"]
        assert message.startswith('Node "node-a" has been held for 1h10m')
        assert "(stuck: 3 failed attempts" in message and "virtctl evacuate-cancel vmi db -n vms" in message
    sample = metrics.registry.get_sample_value
    assert sample("kubevirt_eviction_guard_held_nodes") == 1
    assert sample("kubevirt_eviction_guard_pinned_vms") == 1
    assert sample("kubevirt_eviction_guard_not_migratable_vms") == 0  # no strategy, no KubeVirt CR: unknown
    assert sample("kubevirt_eviction_guard_background_passes_total", {"loop": "held_nodes"}) == 2
