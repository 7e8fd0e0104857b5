"""The modes: baselines and guard variants, the plugin model (live and after a restart), and the
guard deciding with the real policy on the store KubeVirt publishes into."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from app.domain.records import vmi_from_object
from app.policy.model import PolicySettings, Reason
from app.sim.guards import DESCHEDULER, KUBECTL, MODES, Mode, PluginModel, parse_mode
from app.sim.kubevirt import NAMESPACE
from tests.sim_helpers import S, cluster

SETTINGS = PolicySettings()


def mode(name, kv, guard=SETTINGS):
    return Mode(parse_mode(name), kv, SETTINGS, guard)


def test_modes_are_baselines_with_optional_guard_variants():
    assert {m.split("+")[0] for m in MODES} <= {"ocp", "ocp-node1", "ocp-actuation", "ocp-kv19", "ocp-node1-kv19",
                                                "ocp-actuation-kv19", "ocp-actuation-counted"}
    assert "ocp+guard" in MODES and "ocp-kv19+guard" in MODES
    assert parse_mode("off").baseline == parse_mode("upstream").baseline
    assert parse_mode("profile+guard").baseline.plugin and parse_mode("profile+guard").guard is not None
    assert parse_mode("node-limit-1").baseline.eviction_limit_node == 1
    with pytest.raises(ValueError, match="unknown mode 'profile\\+nothing'"):
        parse_mode("profile+nothing")


def test_published_records_are_what_the_projection_makes_of_the_objects():
    kv, clock, store = cluster(2, 2)
    vmi = kv.vmis[0]
    kv.admit_eviction(vmi.pod.name, 0, True)
    clock.run_until(10)  # the copy starts after 10 s setup: migrationState appears
    rec = store.vmi(NAMESPACE, vmi.name)
    assert rec == vmi_from_object({
        "metadata": {"name": vmi.name, "namespace": NAMESPACE, "uid": f"uid-vmi-{vmi.name}",
                     "creationTimestamp": "2025-12-31T23:00:00Z",
                     "annotations": {"kubevirt.io/eviction-source": "descheduler"}},
        "status": {"nodeName": "n0", "evacuationNodeName": "n0", "migrationState": {
            "migrationUid": kv.running[0].uid, "startTimestamp": "2026-01-01T00:00:10Z", "sourceNode": "n0",
            "targetNode": "n1"}},
    })
    assert store.pod(NAMESPACE, vmi.pod.name).eviction_in_progress


def test_guard_denies_a_second_vm_leaving_the_same_node_and_the_migrating_one():
    kv, _, _ = cluster(3, 3)
    guard = mode("upstream+guard", kv)
    first = guard.admit(kv.vmis[0].pod, 0)
    assert first.background and first.reason == "kubevirt_evacuation"
    again = guard.admit(kv.vmis[0].pod, 5)
    assert again.background and again.reason in (Reason.MIGRATION_IN_PROGRESS, Reason.EVACUATION_PENDING)
    second = guard.admit(kv.vmis[1].pod, 5)
    assert not second.background and second.reason == Reason.NODE_BUSY
    assert "already has 1 VM(s) leaving (vms/vm00)" in second.message
    assert guard.admit(kv.vmis[3].pod, 5).reason == "kubevirt_evacuation"
    assert guard.policy_calls == 4 and kv.vmis[1].evacuation_node == ""


def test_guard_lets_drains_through_cordon_or_autoscaler_taint_and_cools_down_the_descheduler_only():
    kv, clock, _ = cluster(3, 3)
    guard = mode("upstream+guard", kv)
    guard.admit(kv.vmis[0].pod, 0)
    clock.run_until(100)  # migrated by 18 s: cooldown 15 min from then
    moved = kv.vmis[0]
    refused = guard.admit(moved.pod, 100)
    assert refused.reason == Reason.COOLDOWN and "retry in 13m38s" in refused.message
    assert guard.admit(moved.pod, 100, KUBECTL).reason == "kubevirt_evacuation"
    kv.set_no_schedule(kv.nodes[1], "ToBeDeletedByClusterAutoscaler", 200)  # no cordon
    assert guard.admit(kv.vmis[3].pod, 200, DESCHEDULER).reason == "kubevirt_evacuation"
    assert guard.admit(kv.vmis[4].pod, 200, DESCHEDULER).reason == "kubevirt_evacuation"


def test_upstream_sends_everything_to_kubevirt():
    kv, _, _ = cluster(2, 2)
    off = mode("upstream", kv, guard=None)
    assert off.admit(kv.vmis[0].pod, 0).reason == "kubevirt_evacuation"
    assert off.admit(kv.vmis[1].pod, 0).reason == "kubevirt_evacuation"
    assert kv.concurrent_evacuations == 1 and off.pre_filter(kv.vmis[0].pod, 0) is None


def test_plugin_in_flight_check_reads_migration_state_not_the_mark():
    kv, clock, _ = cluster(2, 2)
    plugin = PluginModel(kv, SETTINGS)
    pod = kv.vmis[0].pod
    kv.admit_eviction(pod.name, 0, True)
    assert plugin.check(pod, 5) is None  # marked, target pod starting: no migrationState yet
    clock.run_until(10)
    assert plugin.check(pod, 10) == "plugin_migration_in_progress"
    plugin.restarted(11)
    assert plugin.check(pod, 11) == "plugin_migration_in_progress"  # no history needed for that


def test_plugin_after_restart_counts_only_succeeded_vmims_but_the_last_migration_still_applies():
    # every attempt fails 164 s after it starts (copy 154 s); retries after 20, 40 s (a heartbeat every second:
    # the evacuation controller creates each retry at once)
    kv, clock, _ = cluster(2, 2, dirty_mib=1024, memory=2,
                           settings=replace(S, heartbeat_interval=1, heartbeat_jitter=0))
    plugin = PluginModel(kv, SETTINGS)
    pod = kv.vmis[0].pod
    kv.admit_eviction(pod.name, 0, True)
    clock.run_until(164 + 20 + 164 + 40 + 164)  # three failures, the last ends at 552
    end = kv.vmis[0].migration.end
    assert end == 552 and len(plugin.history["vm00"]) == 3
    at = end + 30 * 60  # 30 min after: live, count 3 -> 15m x 4 = 1 h: blocked
    assert plugin.check(pod, at) == "plugin_cooldown"
    plugin.restarted(at)  # no Succeeded VMIM: count 0 -> 15 min from the failed migrationState
    assert plugin.history == {} and plugin.check(pod, at) is None
    assert plugin.check(pod, end + 60) == "plugin_cooldown"


def test_plugin_after_restart_sees_at_most_the_five_kept_successes():
    kv, clock, _ = cluster(2, 1, node_memory=256)
    plugin = PluginModel(kv, SETTINGS)
    for i in range(6):  # six successful moves, 1000 s apart
        kv.admit_eviction(kv.vmis[0].pod.name, i * 1000, True)
        clock.run_until(i * 1000 + 100)
    pod = kv.vmis[0].pod
    last = kv.vmis[0].migration.end
    at = last + 5 * 3600  # live: count 6 -> 15m x 32 capped at 6 h: blocked; re-seeded: 5 -> 4 h: free
    assert plugin.check(pod, at) == "plugin_cooldown"
    plugin.restarted(at)
    assert len(plugin.history["vm00"]) == 5 and plugin.check(pod, at) is None


def test_cancel_clears_the_mark_but_not_a_created_vmim_and_is_refused_on_a_drain_tainted_node():
    from app.domain.records import KUBEVIRT_DRAIN_TAINT
    from app.sim.kubevirt import PRIORITY_DESCHEDULER
    from app.sim.model import TAINT_AUTOSCALER

    kv, clock, store = cluster(2, 2)
    a, b = kv.vmis[0], kv.vmis[1]
    kv.admit_eviction(a.pod.name, 0, True)
    clock.run_until(2)
    assert a.pod.eviction_in_progress and len(a.vmims) == 1
    assert kv.cancel_evacuation(a, "n1", 2) is False  # not the node it is marked for
    assert kv.cancel_evacuation(a, "n0", 2) is True
    clock.run_until(4)
    assert store.vmi(NAMESPACE, a.name).evacuation_node == "" and not a.pod.eviction_in_progress
    assert a.vmims[0].phase != "Failed" and kv.leaving("n0") == 0  # the created VMIM is not aborted
    # virt-api refuses only on KubeVirt's own drain taint (evacuate_cancel.go), not on the autoscaler's
    kv.set_no_schedule(kv.node_by_name["n0"], TAINT_AUTOSCALER, 4)
    kv.admit_eviction(b.pod.name, 4, True)
    assert kv.cancel_evacuation(b, "n0", 5) is True and b.evacuation_node == ""
    kv.set_no_schedule(kv.node_by_name["n0"], KUBEVIRT_DRAIN_TAINT, 6)
    kv.admit_eviction(b.pod.name, 6, False)
    assert kv.cancel_evacuation(b, "n0", 7) is False and b.evacuation_node == "n0"


def test_a_cancelled_descheduler_mark_leaves_its_annotation_and_one_vmim_at_a_time():
    from app.sim.kubevirt import PRIORITY_DESCHEDULER
    # a VM that never converges: the descheduler's mark is cancelled, its VMIM fails; a drain's eviction later
    # finds the annotation still there (only a successful migration removes it), so its VMIM is system-maintenance
    kv, clock, _ = cluster(2, 1, memory=2.0, dirty_mib=1024)
    vmi = kv.vmis[0]
    kv.admit_eviction(vmi.pod.name, 0, True)
    clock.run_until(0)
    assert kv.cancel_evacuation(vmi, "n0", 1) is True
    clock.run_until(2)
    kv.admit_eviction(vmi.pod.name, 2, True)  # marked again while the first VMIM runs: no second VMIM
    clock.run_until(2)
    assert len(vmi.vmims) == 1
    assert kv.cancel_evacuation(vmi, "n0", 3) is True
    clock.run_until(200)
    assert [m.phase for m in vmi.vmims] == ["Failed"] and vmi.evacuation_node == ""
    kv.admit_eviction(vmi.pod.name, 200, False)
    clock.run_until(200)
    assert len(vmi.vmims) == 2 and vmi.from_descheduler and vmi.vmims[-1].priority == PRIORITY_DESCHEDULER


def test_the_default_guard_cancels_stuck_descheduler_evacuations_only():
    from app.sim.engine import Simulation
    from app.sim.scenario import load_scenario

    sc = load_scenario("examples/scenarios/failing-migrations.yaml")
    plain = Simulation(sc, "upstream+guard-nocancel", hours=4).run()
    sim = Simulation(sc, "upstream+guard", hours=4)
    cancelling = sim.run()
    assert plain.evacuations_cancelled == 0 and cancelling.evacuations_cancelled > 0

    def most_failures_of_one_evacuation(runs) -> int:
        """Failed attempts in a row of one marking: a retry is created at the next wake-up of the evacuation
        controller for the node after its predecessor failed, at the latest the next heartbeat (132 s)."""
        most, streak, last_end = 0, Counter(), {}
        for r in sorted(runs, key=lambda r: r.created):
            if not r.failed:
                streak[r.vm] = 0
                continue
            retry = r.vm in last_end and 0 < r.created - last_end[r.vm] <= 133
            streak[r.vm] = streak[r.vm] + 1 if retry else 1
            last_end[r.vm] = r.end
            most = max(most, streak[r.vm])
        return most

    # without the canceller KubeVirt retries a VM that never converges on and on; with it, the mark goes after
    # evacuationStaleAfterFailures attempts (3) and only the retry already queued still runs
    assert most_failures_of_one_evacuation(cancelling.runs) <= 3 + 1 < most_failures_of_one_evacuation(plain.runs)
    assert all(r.cause == "descheduler" for r in cancelling.runs)  # no drain in this scenario to protect
    assert parse_mode("profile+guard").guard.cancel and not parse_mode("profile+guard-nocancel").guard.cancel
