"""The three modes: the guard decides with the real policy on the store KubeVirt publishes into."""

from __future__ import annotations

from app.domain.records import vmi_from_object
from app.policy.model import PolicySettings, Reason
from app.sim.guards import Guard, Mode, Plugin
from app.sim.kubevirt import NAMESPACE
from tests.sim_helpers import cluster

SETTINGS = PolicySettings()


def test_published_records_are_what_the_projection_makes_of_the_objects():
    kv, _, store = cluster(2, 2)
    vmi = kv.vmis[0]
    kv.admit_eviction(vmi.pod.name, 0, True)
    rec = store.vmi(NAMESPACE, vmi.name)
    assert rec == vmi_from_object({
        "metadata": {"name": vmi.name, "namespace": NAMESPACE, "uid": f"uid-vmi-{vmi.name}",
                     "creationTimestamp": "2025-12-31T23:00:00Z"},
        "status": {"nodeName": "n0", "evacuationNodeName": "n0", "migrationState": {
            "migrationUid": kv.running[0].uid, "startTimestamp": "2026-01-01T00:00:00Z", "sourceNode": "n0",
            "targetNode": "n1"}},
    })
    assert store.pod(NAMESPACE, vmi.pod.name).eviction_in_progress


def test_guard_denies_a_second_vm_leaving_the_same_node_and_the_migrating_one():
    kv, _, store = cluster(3, 3)
    guard = Guard(kv, SETTINGS)
    first = guard.admit(kv.vmis[0].pod, 0, from_descheduler=True)
    assert first.background and first.reason == "kubevirt_evacuation"
    again = guard.admit(kv.vmis[0].pod, 5, from_descheduler=True)
    assert again.background and again.reason == Reason.MIGRATION_IN_PROGRESS
    second = guard.admit(kv.vmis[1].pod, 5, from_descheduler=True)
    assert not second.background and second.reason == Reason.NODE_BUSY
    assert "already has 1 VM(s) leaving (vms/vm00)" in second.message
    other_node = guard.admit(kv.vmis[3].pod, 5, from_descheduler=True)
    assert other_node.reason == "kubevirt_evacuation"
    assert guard.policy_calls == 4 and kv.vmis[1].evacuation_node == ""


def test_guard_lets_drains_through_and_applies_cooldown_to_the_descheduler_only():
    kv, clock, _ = cluster(3, 3)
    guard = Guard(kv, SETTINGS)
    guard.admit(kv.vmis[0].pod, 0, from_descheduler=True)
    clock.run_until(100)  # migrated by 18 s: cooldown 15 min from then
    moved = kv.vmis[0]
    assert moved.node.name != "n0"
    refused = guard.admit(moved.pod, 100, from_descheduler=True)
    assert refused.reason == Reason.COOLDOWN and "retry in 13m38s" in refused.message
    assert guard.admit(moved.pod, 100, from_descheduler=False).reason == "kubevirt_evacuation"
    # a cordoned node: neither the node budget nor cooldown holds a drain back
    kv.set_cordoned(kv.nodes[1], True, 200)
    assert guard.admit(kv.vmis[3].pod, 200, from_descheduler=False).reason == "kubevirt_evacuation"
    assert guard.admit(kv.vmis[4].pod, 200, from_descheduler=False).reason == "kubevirt_evacuation"


def test_off_sends_everything_to_kubevirt():
    kv, _, _ = cluster(2, 2)
    off = Mode(kv, SETTINGS)
    assert off.admit(kv.vmis[0].pod, 0, True).reason == "kubevirt_evacuation"
    assert off.admit(kv.vmis[1].pod, 0, True).reason == "kubevirt_evacuation"
    assert kv.concurrent_evacuations == 1 and off.pre_filter(kv.vmis[0].pod, 0) is None


def test_plugin_blocks_in_flight_and_cooldown_and_forgets_failures_on_restart():
    kv, clock, _ = cluster(2, 2, dirty_mib=1024, memory=2)  # every attempt fails after 164 s
    plugin = Plugin(kv, SETTINGS)
    pod = kv.vmis[0].pod
    kv.admit_eviction(pod.name, 0, True)
    assert plugin.pre_filter(pod, 10) == "plugin_migration_in_progress"
    clock.run_until(170)  # failed at 164, retry pending (backoff 20 s): not in flight, but in cooldown
    assert plugin.pre_filter(pod, 170) == "plugin_cooldown"
    assert plugin.pre_filter(kv.vmis[1].pod, 170) is None
    plugin.descheduler_restarted(170)  # history rebuilt from Succeeded VMIMs: the failure is forgotten
    assert plugin.pre_filter(pod, 170) is None
