"""The simulated KubeVirt (v1.8.3's code, the MigrationPriorityQueue gate off unless a test turns it on) against
hand-computed cases: admitter, durations on a shared NIC, failures, retries and what wakes the evacuation
controller for them, retention, limits and priorities, targets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.sim.kubevirt import NAMESPACE, KubeVirt, migration_duration, retry_backoff
from tests.sim_helpers import S, cluster


def evict_vm(kv: KubeVirt, clock, vm_index: int, now: int, from_descheduler: bool = True):
    """The eviction, then what follows in the same second (the evacuation controller's sync)."""
    vmi = kv.vmis[vm_index]
    assert vmi.pod is not None
    clock.run_until(now)
    answer = kv.admit_eviction(vmi.pod.name, now, from_descheduler)
    clock.run_until(now)
    return answer


# ---- the admitter ------------------------------------------------------------------


def test_admitter_checks_the_mark_first_then_the_target_pod_then_marks():
    kv, clock, store = cluster(2, 1)
    first = evict_vm(kv, clock, 0, 0)
    assert first.background and first.reason == "kubevirt_evacuation"
    assert first.message == 'Eviction triggered evacuation of VMI "vms/vm00"'
    again = evict_vm(kv, clock, 0, 1)
    assert again.background and again.reason == "kubevirt_evacuation_in_progress"
    assert again.message.startswith("Evacuation in progress: ")
    # the migration target pod of a marked VMI: the mark is checked first -> background text
    target = kv.running[0].target_pod
    assert kv.admit_eviction(target.name, 2, True).reason == "kubevirt_evacuation_in_progress"
    kv.vmis[0].evacuation_node = ""  # as evacuate/cancel would leave it: now the target check answers
    answer = kv.admit_eviction(target.name, 3, True)
    assert not answer.allowed and not answer.background and answer.reason == "kubevirt_target_pod"
    assert answer.message == "Eviction request for target Pod"  # pod-eviction-admitter.go:170, no VMI named
    assert len(kv.vmis[0].vmims) == 1


def test_annotation_follows_the_mark_a_second_later_and_stays_through_failures():
    kv, clock, store = cluster(2, 1, memory=2.0, dirty_mib=1024)  # never converges
    pod = kv.vmis[0].pod
    evict_vm(kv, clock, 0, 0)
    assert not store.pod(NAMESPACE, pod.name).eviction_in_progress  # virt-controller has not run yet
    clock.run_until(1)
    assert store.pod(NAMESPACE, pod.name).eviction_in_progress
    clock.run_until(2000)
    assert kv.finished and all(r.failed for r in kv.finished)
    assert store.pod(NAMESPACE, pod.name).eviction_in_progress and kv.vmis[0].evacuation_node == "n0"


def test_vmim_priority_maintenance_for_the_descheduler_critical_for_drains():
    kv, clock, store = cluster(2, 2)
    evict_vm(kv, clock, 0, 0, from_descheduler=True)
    evict_vm(kv, clock, 2, 0, from_descheduler=False)
    by_vmi = {m.vmi.name: m for m in kv.running}
    assert by_vmi["vm00"].cause == "descheduler" and by_vmi["vm02"].cause == "drain"
    assert store.vmi(NAMESPACE, "vm00") is not None
    assert kv.vmis[0].from_descheduler and not kv.vmis[2].from_descheduler


# ---- duration ------------------------------------------------------------------


def test_duration_is_setup_plus_memory_over_bandwidth_minus_dirty_rate():
    # 8 GiB at 0.5 GiB/s with 0.25 GiB/s dirtied: 8 / 0.25 = 32 s, plus 10 s setup
    assert migration_duration(8, 0.25, 0.5, S) == (42, False)
    assert migration_duration(4, 0.0, 0.5, S) == (18, False)
    # 1 GiB, 0.5 - 0.4999 GiB/s net: the completion timeout (150 s x 1 GiB) aborts it
    assert migration_duration(1, 0.4999, 0.5, S) == (10 + 150, True)
    # dirty rate above bandwidth: 4 GiB first pass 8 s, then 150 s without progress
    assert migration_duration(4, 0.6, 0.5, S) == (10 + 8 + 150, True)


def test_outbound_migrations_share_the_source_nic_and_reshare_when_one_starts_or_ends():
    kv, clock, _ = cluster(3, 2, node_memory=256)
    evict_vm(kv, clock, 0, 0)  # copy from 10 s, alone: 0.5 GiB/s
    evict_vm(kv, clock, 2, 0)  # from n1: its own NIC
    evict_vm(kv, clock, 1, 4)  # copy from 14 s: both at 0.25 GiB/s
    clock.run_until(100)
    ends = {r.vm: r.end for r in kv.finished}
    # vm00: 2 GiB by 14 s, 2 GiB left at 0.25 -> 22 s; vm01: 2 GiB by 22 s, then alone 2 / 0.5 -> 26 s
    assert ends == {"vm00": 22, "vm01": 26, "vm02": 18}


def test_two_never_converging_vms_share_a_nic_and_are_aborted_by_no_progress():
    kv, clock, _ = cluster(2, 2, memory=2.0, dirty_mib=400)  # 0.39 GiB/s: converges alone, not when sharing
    evict_vm(kv, clock, 0, 0)
    evict_vm(kv, clock, 1, 0)
    clock.run_until(10 + 8 + 150)  # first pass 2 GiB at 0.25 -> 8 s, then 150 s without progress
    assert [(r.vm, r.end, r.failure) for r in kv.finished] == [("vm00", 168, "no-progress"),
                                                                ("vm01", 168, "no-progress")]


def test_a_target_that_cannot_schedule_fails_the_vmim_after_five_minutes():
    kv, clock, _ = cluster(2, 1)
    kv.vmis[0].vm.target_unschedulable = True
    evict_vm(kv, clock, 0, 0)
    clock.run_until(300)
    (run,) = kv.finished
    assert (run.end, run.failed, run.failure, run.target) == (300, True, "unschedulable", "")


def test_transient_failure_rate_fails_attempts_and_they_are_retried():
    kv, clock, _ = cluster(2, 1, settings=replace(S, failure_probability=1.0))
    evict_vm(kv, clock, 0, 0)
    clock.run_until(500)
    assert len(kv.finished) >= 3 and all(r.failure == "transient" for r in kv.finished)


# ---- retry backoff and retention -------------------------------------------------


def test_backoff_counts_the_failed_evacuation_vmims_kept_since_the_last_success():
    # virt-controller's handleMigrationBackoff: newest first until a Succeeded one, 20 s then doubling per Failed
    assert retry_backoff([], 20) == 0
    assert [retry_backoff(["Failed"] * n, 20) for n in range(6)] == [0, 20, 40, 80, 160, 320]
    assert retry_backoff(["Failed", "Succeeded"], 20) == 0
    assert retry_backoff(["Failed", "Failed", "Succeeded", "Failed", "Failed"], 20) == 40
    assert retry_backoff(["Failed", "Pending", "Failed"], 20) == 40  # an unfinished one counts for nothing


def beats_of(kv: KubeVirt, node: str) -> list[int]:
    """Records the heartbeats of ``node`` from now on."""
    seen: list[int] = []
    kv.heartbeat_listeners.append(lambda n, t: seen.append(t) if n == node else None)
    return seen


def test_a_failed_attempts_retry_is_created_at_the_next_heartbeat_and_started_after_the_backoff():
    # dirty rate above bandwidth: every attempt aborts after 10 s setup + 4 s first pass + 150 s = 164 s. Nothing
    # else changes on n0 after a failure, so the evacuation controller next runs at n0's heartbeat (after the
    # target pod has gone, 1 s after the failure); the migration controller holds the new VMIM until the backoff
    # (20 s doubling, 5 kept VMIMs: at most 320 s) has passed since the failure
    kv, clock, store = cluster(2, 1, memory=2.0, dirty_mib=1024)
    beats = beats_of(kv, "n0")
    evict_vm(kv, clock, 0, 0)
    clock.run_until(30_000)
    runs = kv.finished
    assert len(runs) >= 20 and all(r.failed for r in runs)
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert min(gaps) >= 60 and max(gaps) <= 132 and len(set(gaps)) > 5  # 60 s x (1 + 1.2 x U[0, 1))
    heartbeat_bound = backoff_bound = 0
    for n in range(1, len(runs)):
        end = runs[n - 1].end
        created = min(b for b in beats if b >= end + 1)
        backoff = min(20 * 2 ** (n - 1), 320)
        assert (runs[n].created, runs[n].start) == (created, max(created, end + backoff))
        heartbeat_bound += created > end + backoff
        backoff_bound += created < end + backoff
    assert heartbeat_bound >= 1 and backoff_bound >= 10  # both rules decide some retries
    assert kv.vmis[0].evacuation_node == "n0"
    kept = store.migrations(NAMESPACE, "vm00")
    assert sum(1 for m in kept if m.finished) == 5
    assert all(m.name.startswith("kubevirt-evacuation-") and len(m.name) == 25 for m in kept)


def test_any_update_on_the_node_wakes_the_evacuation_controller_but_not_the_failures_own():
    # no heartbeat within the test: vm00's retry waits until another VMI on n0 changes (vm01 is marked at 170)
    kv, clock, store = cluster(2, 2, memory=2.0, dirty_mib=1024,
                               settings=replace(S, heartbeat_interval=100_000, heartbeat_jitter=0))
    beats = beats_of(kv, "n0")
    evict_vm(kv, clock, 0, 0)
    clock.run_until(169)
    assert [m.phase for m in kv.vmis[0].vmims] == ["Failed"] and kv.finished[0].end == 164
    evict_vm(kv, clock, 1, 170)
    assert [m.phase for m in kv.vmis[0].vmims] == ["Failed", "Pending"]  # created at 170, backoff until 184
    assert [m.created for m in kv.vmis[0].vmims] == [0, 170] and kv.vmis[0].vmims[1].eligible_at == 184
    assert [m.phase for m in kv.vmis[1].vmims] == ["Scheduling"]
    assert not [b for b in beats if b <= 170]


def test_an_unschedulable_targets_retry_is_created_at_once():
    # the migration controller deletes the pending target pod before it fails the VMIM: the failure's own updates
    # find one active pod, so the retry VMIM exists at once and starts when the 20 s backoff has passed
    kv, clock, _ = cluster(2, 1, settings=replace(S, heartbeat_interval=100_000, heartbeat_jitter=0))
    kv.vmis[0].vm.target_unschedulable = True
    evict_vm(kv, clock, 0, 0)
    clock.run_until(301)
    (first, second) = kv.vmis[0].vmims
    assert (first.phase, first.end, second.created, second.eligible_at) == ("Failed", 300, 300, 320)


def test_the_backoff_runs_from_the_previous_failure_and_a_success_resets_it():
    kv, clock, _ = cluster(2, 1, memory=2.0, dirty_mib=1024,
                           settings=replace(S, heartbeat_interval=5, heartbeat_jitter=0))
    vmi = kv.vmis[0]
    evict_vm(kv, clock, 0, 0)
    clock.run_until(164 + 20 + 164 + 6)  # two failures; a heartbeat every 5 s creates the third attempt at once
    pending = vmi.vmims[-1]
    assert [m.phase for m in vmi.vmims] == ["Failed", "Failed", "Pending"]
    assert pending.created < kv.finished[-1].end + 40 == pending.eligible_at  # 40 s from the second failure
    vmi.vm.dirty_rate = 0.0  # the next attempt succeeds: nothing older than it counts any more
    clock.run_until(2000)
    assert kv.finished[-1].failed is False and vmi.evacuation_node == ""
    assert retry_backoff([m.phase for m in vmi.vmims], 20) == 0


def test_success_clears_the_mark_and_moves_the_pod():
    kv, clock, store = cluster(2, 1)
    old_pod = kv.vmis[0].pod.name
    evict_vm(kv, clock, 0, 100)
    clock.run_until(110)
    assert store.vmi(NAMESPACE, "vm00").migration.in_flight
    clock.run_until(1000)
    (run,) = kv.finished
    assert (run.start, run.end, run.failed, run.source, run.target) == (100, 118, False, "n0", "n1")
    vmi = store.vmi(NAMESPACE, "vm00")
    assert vmi.node == "n1" and vmi.evacuation_node == "" and not vmi.migration.in_flight
    assert store.pod(NAMESPACE, old_pod) is None
    assert not store.pod(NAMESPACE, kv.vmis[0].pod.name).eviction_in_progress


# ---- limits, priority, targets --------------------------------------------------------


def test_without_the_priority_queue_vmims_are_created_only_for_free_slots_and_carry_no_priority():
    # KubeVirt v1.8's default: the evacuation controller counts running VMIMs against 2 outbound per node and 5 per
    # cluster before it creates any; a full node is looked at again every 5 s (no heartbeat within the test)
    kv, clock, store = cluster(4, 4, node_memory=256, settings=replace(S, heartbeat_interval=100_000))
    for i in range(4):  # four marked on n0: two VMIMs, the other two VMIs stay marked without one
        evict_vm(kv, clock, i, 0)
    assert len(kv.running) == 2 and not kv.pending
    assert sum(1 for v in kv.vmis[:4] if v.vmims) == 2 and all(v.evacuation_node == "n0" for v in kv.vmis[:4])
    assert all(m.priority == "" for m in store.migrations(NAMESPACE, kv.running[0].vmi.name))
    clock.run_until(29)  # the pair shares n0's NIC: both end at 26 s, which wakes the VMIs' new nodes, not n0
    assert sum(1 for v in kv.vmis[:4] if v.vmims) == 2 and not kv.running
    clock.run_until(30)  # n0's next look, 5 s after the last
    assert sum(1 for v in kv.vmis[:4] if v.vmims) == 4 and len(kv.running) == 2
    clock.run_until(100)
    for i in (4, 5, 8, 9, 10, 12, 13):
        evict_vm(kv, clock, i, 100)
    # n1 two, n2 two (vm10: the node's limit), n3 one (vm13: the cluster's limit)
    assert sorted(m.vmi.name for m in kv.running) == ["vm04", "vm05", "vm08", "vm09", "vm12"] and not kv.pending
    assert not kv.vmis[10].vmims and not kv.vmis[13].vmims


@pytest.mark.parametrize("gate, start", [(False, 226), (True, 222)])
def test_a_retry_held_by_the_node_limit_starts_at_its_next_look_or_at_once_with_the_priority_queue(gate, start):
    # vm00 (8 GiB, dirtied faster than the NIC) fails at 10 + 16 + 150 = 176 s; vm01 and vm02 (8 GiB, clean) are
    # marked at 180 s and take n0's two outbound slots until 190 + 8 / 0.25 = 222 s. vm00's retry (created at 180 s,
    # held by the backoff until 196 s) then waits for a slot: without the gate the migration controller looks again
    # every 5 s (196, 201, ... 226 s), with it the finished VMIMs hand their slot to the pending one at once
    kv, clock, _ = cluster(2, 3, memory=8.0, settings=replace(S, heartbeat_interval=100_000,
                                                              migration_priority_queue=gate))
    kv.vmis[0].vm.dirty_rate = 1.0
    evict_vm(kv, clock, 0, 0)
    evict_vm(kv, clock, 1, 180)
    evict_vm(kv, clock, 2, 180)
    retry = kv.vmis[0].vmims[-1]
    assert (kv.finished[0].end, retry.created, retry.eligible_at, retry.phase) == (176, 180, 196, "Pending")
    clock.run_until(start - 1)
    assert retry.phase == "Pending"
    clock.run_until(start)
    assert retry.start == start and [r.end for r in kv.finished[1:]] == [222, 222]


def test_with_the_priority_queue_every_marked_vmi_gets_a_vmim_and_slots_go_by_priority():
    kv, clock, store = cluster(4, 4, node_memory=256, settings=replace(S, migration_priority_queue=True))
    for i in range(4):  # four from n0: two run, two wait
        evict_vm(kv, clock, i, 0)
    assert sorted(m.vmi.name for m in kv.running) == ["vm00", "vm01"] and len(kv.pending) == 2
    assert store.migrations(NAMESPACE, "vm00")[0].priority == "system-maintenance"
    for i in (4, 5, 8):  # n1 two, n2 one: 5 running in all
        evict_vm(kv, clock, i, 0)
    assert len(kv.running) == 5
    evict_vm(kv, clock, 9, 1)  # a descheduler one on n2, queued
    evict_vm(kv, clock, 12, 2, from_descheduler=False)  # a drain on n3, queued after it but system-critical
    assert len(kv.running) == 5 and len(kv.pending) == 4
    assert store.migrations(NAMESPACE, "vm12")[0].priority == "system-critical"
    clock.run_until(26)  # n0's and n1's pairs share their NICs: all five end by 26 s
    assert kv.running[0].vmi.name == "vm12"  # the first freed slot went to the drain, created last


def test_kubevirt_settings_in_the_scenario():
    from app.sim.scenario import ScenarioError, parse_scenario

    base = {"nodes": [{"name": "w", "count": 2, "cpu": 8, "memoryGiB": 32}],
            "vms": [{"name": "v", "count": 2, "cpu": 1, "memoryGiB": 1}]}
    assert parse_scenario(base).kubevirt.migration_priority_queue is False  # v1.8's default
    sc = parse_scenario({**base, "kubevirt": {"migrationPriorityQueue": True, "heartbeatInterval": "30s",
                                              "heartbeatJitter": 0.5}})
    assert (sc.kubevirt.migration_priority_queue, sc.kubevirt.heartbeat_interval, sc.kubevirt.heartbeat_jitter) == \
        (True, 30, 0.5)
    for bad, message in (({"migrationPriorityQueue": "yes"}, "kubevirt.migrationPriorityQueue: true or false"),
                         ({"heartbeatInterval": 0}, "kubevirt.heartbeatInterval: must be at least 1s")):
        try:
            parse_scenario({**base, "kubevirt": bad}, "f.yaml")
        except ScenarioError as e:
            assert message in str(e)
        else:
            raise AssertionError(f"{bad} accepted")


def test_target_prefers_fewer_soft_taints_then_least_allocated_and_never_a_drained_node():
    kv, _, _ = cluster(3, 2, node_memory=64)
    n0, n1, n2 = kv.nodes
    vm = kv.vmis[0].vm
    n1.req_mem -= 8  # n1 less allocated than n2
    assert kv.choose_target(vm, n0) is n1
    n1.soft_taints, n2.soft_taints = 2, 1
    assert kv.choose_target(vm, n0) is n2
    n2.no_schedule = "ToBeDeletedByClusterAutoscaler"
    assert kv.choose_target(vm, n0) is n1  # soft-tainted is still better than nothing
    n1.cordoned = True
    assert kv.choose_target(vm, n0) is None
