"""The simulated KubeVirt against hand-computed cases: duration, retries, retention, limits, targets."""

from __future__ import annotations

from app.sim.kubevirt import NAMESPACE, KubeVirt, Migration, migration_duration, retry_backoff
from tests.sim_helpers import S, cluster


def evict_vm(kv: KubeVirt, vm_index: int, now: int, from_descheduler: bool = True):
    vmi = kv.vmis[vm_index]
    assert vmi.pod is not None
    return kv.admit_eviction(vmi.pod.name, now, from_descheduler)


# ---- duration ------------------------------------------------------------------


def test_duration_is_setup_plus_memory_over_bandwidth_minus_dirty_rate():
    # 8 GiB at 0.5 GiB/s with 0.25 GiB/s dirtied: 8 / 0.25 = 32 s, plus 10 s setup
    assert migration_duration(8, 0.25, S) == (42, False)
    # nothing dirtied: 4 / 0.5 = 8 s
    assert migration_duration(4, 0.0, S) == (18, False)


def test_completion_timeout_aborts_a_migration_that_converges_too_slowly():
    # 1 GiB, 0.5 - 0.4999 GiB/s net: 10000 s needed, the timeout is 150 s x 1 GiB
    assert migration_duration(1, 0.4999, S) == (10 + 150, True)
    # 64 GiB at 0.5 - 0.49 net: 6400 s, under the 9600 s timeout: completes
    assert migration_duration(64, 0.49, S) == (6410, False)


def test_no_progress_aborts_150s_after_the_first_pass_when_dirty_rate_exceeds_bandwidth():
    # 4 GiB first pass 8 s, then 150 s without progress
    assert migration_duration(4, 0.6, S) == (10 + 8 + 150, True)
    # the completion timeout wins when shorter: 0.5 GiB -> 75 s < 1 s + 150 s
    assert migration_duration(0.5, 0.6, S) == (10 + 75, True)


# ---- retry backoff and retention -------------------------------------------------


def _vmim(phase: str, failed: bool = False) -> Migration:
    return Migration(seq=0, name="m", uid="u", vmi=None, created=0, eligible_at=0, priority=0,  # type: ignore[arg-type]
                     evacuation_node="n0", phase=phase, failed=failed)


def test_backoff_doubles_from_20s_per_consecutive_failure_since_the_last_success():
    ok, bad = _vmim("Succeeded"), _vmim("Failed", failed=True)
    assert retry_backoff([], 20) == 0
    assert retry_backoff([ok], 20) == 0
    assert retry_backoff([bad], 20) == 20
    assert retry_backoff([ok, bad, bad], 20) == 40
    assert retry_backoff([bad, bad, ok, bad, bad, bad], 20) == 80
    assert retry_backoff([bad, bad, bad, bad, bad], 20) == 320


def test_a_failing_evacuation_retries_with_backoff_capped_by_retention_of_five():
    # dirty rate above bandwidth: every attempt aborts after 10 s setup + 4 s first pass + 150 s = 164 s
    kv, clock, store = cluster(2, 1, memory=2.0, dirty_mib=1024)
    answer = evict_vm(kv, 0, 0)
    assert answer.background and answer.reason == "kubevirt_evacuation"
    clock.run_until(20_000)
    vmi = kv.vmis[0]
    starts = [r.start for r in kv.finished]
    # attempt 1 at 0; each next one starts at the previous end (+164) plus 20, 40, 80, 160, 320, 320 ...
    expected, t, backoff = [0], 0, 20
    for _ in range(len(starts) - 1):
        t = t + 164 + backoff
        expected.append(t)
        backoff = min(backoff * 2, 320)
    assert starts == expected and len(starts) > 10
    assert all(r.failed for r in kv.finished)
    assert vmi.evacuation_node == "n0"  # stays marked while it keeps failing
    # only the 5 newest finished VMIMs are kept, plus the pending retry
    kept = store.migrations(NAMESPACE, vmi.name)
    assert sum(1 for m in kept if m.finished) == 5
    assert sum(1 for m in kept if not m.finished) == 1


def test_success_clears_the_mark_and_moves_the_pod():
    kv, clock, store = cluster(2, 1)
    old_pod = kv.vmis[0].pod.name
    evict_vm(kv, 0, 100)
    assert store.vmi(NAMESPACE, "vm00").migration.in_flight
    clock.run_until(1000)
    (run,) = kv.finished
    assert (run.start, run.end, run.failed, run.source, run.target) == (100, 118, False, "n0", "n1")
    vmi = store.vmi(NAMESPACE, "vm00")
    assert vmi.node == "n1" and vmi.evacuation_node == "" and not vmi.migration.in_flight
    assert store.pod(NAMESPACE, old_pod) is None
    new_pod = store.pod(NAMESPACE, kv.vmis[0].pod.name)
    assert new_pod.node == "n1" and not new_pod.eviction_in_progress


def test_a_second_eviction_of_a_marked_vmi_is_background_without_a_new_migration():
    kv, clock, _ = cluster(2, 1)
    evict_vm(kv, 0, 0)
    again = evict_vm(kv, 0, 1)
    assert again.background and again.reason == "kubevirt_evacuation_in_progress"
    assert len(kv.vmis[0].vmims) == 1


def test_eviction_of_a_migration_target_pod_is_refused_without_background_text():
    kv, clock, _ = cluster(2, 1)
    evict_vm(kv, 0, 0)
    target = kv.running[0].target_pod
    answer = kv.admit_eviction(target.name, 1, True)
    assert not answer.allowed and not answer.background and answer.reason == "kubevirt_target_pod"


# ---- limits, priority, targets --------------------------------------------------------


def test_two_outbound_per_node_and_five_per_cluster_and_drains_first():
    kv, clock, _ = cluster(4, 4, node_memory=256)
    for i in range(4):  # four from n0: two run, two wait
        evict_vm(kv, i, 0)
    assert sorted(m.vmi.name for m in kv.running) == ["vm00", "vm01"]
    for i in (4, 5, 8):  # n1 two, n2 one: 5 running in all
        evict_vm(kv, i, 0)
    assert len(kv.running) == 5
    evict_vm(kv, 9, 1)  # a descheduler one on n2, queued
    evict_vm(kv, 12, 2, from_descheduler=False)  # a drain on n3, queued after it but higher priority
    assert len(kv.running) == 5 and len(kv.pending) == 4
    clock.run_until(18)  # all five (started at 0, 18 s each) finish, one after the other
    # the first freed slot goes to the drain, created last; then the oldest
    assert [m.vmi.name for m in kv.running] == ["vm12", "vm02", "vm03", "vm09"]


def test_target_prefers_untainted_nodes_then_least_allocated():
    kv, _, _ = cluster(3, 2, node_memory=64)
    n0, n1, n2 = kv.nodes
    vm = kv.vmis[0].vm
    n1.req_mem -= 8  # n1 less allocated than n2
    assert kv.choose_target(vm, n0) is n1
    n1.soft_tainted = True
    assert kv.choose_target(vm, n0) is n2
    n2.cordoned = True
    assert kv.choose_target(vm, n0) is n1  # tainted is still better than nothing
    n1.req_mem = 62  # does not fit any more
    assert kv.choose_target(vm, n0) is None
