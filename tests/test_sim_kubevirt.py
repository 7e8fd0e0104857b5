"""The simulated KubeVirt (v1.7+) against hand-computed cases: admitter, durations on a shared
NIC, failures, retries, retention, limits and priorities, targets."""

from __future__ import annotations

from dataclasses import replace

from app.sim.kubevirt import NAMESPACE, KubeVirt, migration_duration, retry_backoff
from tests.sim_helpers import S, cluster


def evict_vm(kv: KubeVirt, vm_index: int, now: int, from_descheduler: bool = True):
    vmi = kv.vmis[vm_index]
    assert vmi.pod is not None
    return kv.admit_eviction(vmi.pod.name, now, from_descheduler)


# ---- the admitter ------------------------------------------------------------------


def test_admitter_checks_the_mark_first_then_the_target_pod_then_marks():
    kv, clock, store = cluster(2, 1)
    first = evict_vm(kv, 0, 0)
    assert first.background and first.reason == "kubevirt_evacuation"
    assert first.message == 'Eviction triggered evacuation of VMI "vms/vm00"'
    again = evict_vm(kv, 0, 1)
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
    evict_vm(kv, 0, 0)
    assert not store.pod(NAMESPACE, pod.name).eviction_in_progress  # virt-controller has not run yet
    clock.run_until(1)
    assert store.pod(NAMESPACE, pod.name).eviction_in_progress
    clock.run_until(2000)
    assert kv.finished and all(r.failed for r in kv.finished)
    assert store.pod(NAMESPACE, pod.name).eviction_in_progress and kv.vmis[0].evacuation_node == "n0"


def test_vmim_priority_maintenance_for_the_descheduler_critical_for_drains():
    kv, _, store = cluster(2, 2)
    evict_vm(kv, 0, 0, from_descheduler=True)
    evict_vm(kv, 2, 0, from_descheduler=False)
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
    evict_vm(kv, 0, 0)  # copy from 10 s, alone: 0.5 GiB/s
    evict_vm(kv, 1, 4)  # copy from 14 s: both at 0.25 GiB/s
    evict_vm(kv, 2, 0)  # from n1: its own NIC
    clock.run_until(100)
    ends = {r.vm: r.end for r in kv.finished}
    # vm00: 2 GiB by 14 s, 2 GiB left at 0.25 -> 22 s; vm01: 2 GiB by 22 s, then alone 2 / 0.5 -> 26 s
    assert ends == {"vm00": 22, "vm01": 26, "vm02": 18}


def test_two_never_converging_vms_share_a_nic_and_are_aborted_by_no_progress():
    kv, clock, _ = cluster(2, 2, memory=2.0, dirty_mib=400)  # 0.39 GiB/s: converges alone, not when sharing
    evict_vm(kv, 0, 0)
    evict_vm(kv, 1, 0)
    clock.run_until(10 + 8 + 150)  # first pass 2 GiB at 0.25 -> 8 s, then 150 s without progress
    assert [(r.vm, r.end, r.failure) for r in kv.finished] == [("vm00", 168, "no-progress"),
                                                                ("vm01", 168, "no-progress")]


def test_a_target_that_cannot_schedule_fails_the_vmim_after_five_minutes():
    kv, clock, _ = cluster(2, 1)
    kv.vmis[0].vm.target_unschedulable = True
    evict_vm(kv, 0, 0)
    clock.run_until(300)
    (run,) = kv.finished
    assert (run.end, run.failed, run.failure, run.target) == (300, True, "unschedulable", "")


def test_transient_failure_rate_fails_attempts_and_they_are_retried():
    kv, clock, _ = cluster(2, 1, settings=replace(S, failure_probability=1.0))
    evict_vm(kv, 0, 0)
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


def test_a_failing_evacuation_retries_forever_held_back_at_most_320s():
    # dirty rate above bandwidth: every attempt aborts after 10 s setup + 4 s first pass + 150 s = 164 s;
    # the garbage collector keeps 5 finished VMIMs, so at most 5 failures count: 20 s x 2^4 = 320 s
    kv, clock, store = cluster(2, 1, memory=2.0, dirty_mib=1024)
    evict_vm(kv, 0, 0)
    clock.run_until(30_000)
    starts = [r.start for r in kv.finished]
    expected, t = [0], 0
    for n in range(1, len(starts)):
        t = t + 164 + min(20 * 2 ** (n - 1), 320)
        expected.append(t)
    assert starts == expected and len(starts) >= 20
    assert kv.vmis[0].evacuation_node == "n0"
    kept = store.migrations(NAMESPACE, "vm00")
    assert sum(1 for m in kept if m.finished) == 5 and sum(1 for m in kept if not m.finished) == 1
    assert all(m.name.startswith("kubevirt-evacuation-") and len(m.name) == 25 for m in kept)


def test_the_backoff_runs_from_the_previous_failure_and_a_success_resets_it():
    kv, clock, _ = cluster(2, 1, memory=2.0, dirty_mib=1024)
    vmi = kv.vmis[0]
    evict_vm(kv, 0, 0)
    clock.run_until(164 + 20 + 164 + 1)  # two failures: the third attempt waits 40 s from the second's end
    pending = vmi.vmims[-1]
    assert [m.phase for m in vmi.vmims] == ["Failed", "Failed", "Pending"]
    assert pending.eligible_at == kv.finished[-1].end + 40
    vmi.vm.dirty_rate = 0.0  # the next attempt succeeds: nothing older than it counts any more
    clock.run_until(2000)
    assert kv.finished[-1].failed is False and vmi.evacuation_node == ""
    assert retry_backoff([m.phase for m in vmi.vmims], 20) == 0


def test_success_clears_the_mark_and_moves_the_pod():
    kv, clock, store = cluster(2, 1)
    old_pod = kv.vmis[0].pod.name
    evict_vm(kv, 0, 100)
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


def test_two_outbound_per_node_and_five_per_cluster_taken_by_priority():
    kv, clock, _ = cluster(4, 4, node_memory=256)
    for i in range(4):  # four from n0: two run, two wait
        evict_vm(kv, i, 0)
    assert sorted(m.vmi.name for m in kv.running) == ["vm00", "vm01"]
    for i in (4, 5, 8):  # n1 two, n2 one: 5 running in all
        evict_vm(kv, i, 0)
    assert len(kv.running) == 5
    evict_vm(kv, 9, 1)  # a descheduler one on n2, queued
    evict_vm(kv, 12, 2, from_descheduler=False)  # a drain on n3, queued after it but system-critical
    assert len(kv.running) == 5 and len(kv.pending) == 4
    clock.run_until(26)  # n0's and n1's pairs share their NICs: all five end by 26 s
    assert kv.running[0].vmi.name == "vm12"  # the first freed slot went to the drain, created last


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
