"""Mode BASELINE+steer: the guard with rule 10, fed by the modelled Prometheus (app/sim/prometheus.py)."""

from __future__ import annotations

from app.policy.model import PolicySettings, Reason
from app.sim.descheduler import node_scores, pressure
from app.sim.guards import Mode, parse_mode
from app.sim.kubevirt import EPOCH, NAMESPACE
from app.sim.model import Steady
from app.sim.prometheus import QUERY_INTERVAL, ModelledPrometheus
from tests.sim_helpers import cluster

SETTINGS = PolicySettings()


def sample(kv, prom: ModelledPrometheus, now: int) -> list[int]:
    """What the engine's sample() hands the modelled Prometheus (no migrations running)."""
    cpu = [0.0] * len(kv.nodes)
    mem = [0.0] * len(kv.nodes)
    for vmi in kv.vmis:
        cpu[vmi.node.index] += vmi.vm.vcpus * vmi.vm.cpu_load.value(now)
        mem[vmi.node.index] += vmi.vm.memory * vmi.vm.memory_load.value(now)
    dims = [(min(1, c / n.cpu), min(1, m / n.memory), pressure(c / n.cpu), pressure(m / n.memory))
            for c, m, n in zip(cpu, mem, kv.nodes)]
    scores = node_scores(dims)
    prom.record(now, kv.nodes, kv.vmis, dims, scores)
    return scores


def hot_cluster():
    """n0 runs vm00..vm03 with CPU loads 0.2, 0.9, 0.9, 0.9 of 2 vCPUs on 16 cores (n1 and n2 idle-ish)."""
    kv, clock, store = cluster(3, 4)
    for vmi, level in zip(kv.vmis[:4], (0.2, 0.9, 0.9, 0.9)):
        vmi.vm.cpu_load = Steady(level)
    for vmi in kv.vmis[4:]:
        vmi.vm.cpu_load = Steady(0.05)
    kv.nodes[0].cpu = 4  # make n0 hot: 5.8 cores of demand on 4
    return kv


def test_the_guard_at_its_defaults_steers_where_the_descheduler_reads_prometheus():
    spec = parse_mode("profile+steer")  # the older name
    assert spec.baseline.plugin and spec.guard is not None and spec.steering
    assert all(parse_mode(f"{b}+guard").steering for b in ("ocp", "ocp-node1-kv19", "upstream", "node-limit-1"))
    assert not parse_mode("ocp+guard-nosteer").steering and parse_mode("ocp+guard-nosteer").guard.cancel
    assert not parse_mode("ocp").steering


def test_the_guard_holds_the_sample_of_its_last_poll():
    kv = hot_cluster()
    prom = ModelledPrometheus(seed=1, sample_interval=60)
    assert prom.snapshot(0).taken_at is None  # nothing yet: fails open
    sample(kv, prom, 0)
    sample(kv, prom, 60)
    last_poll_before_60 = 60 - ((60 - prom.phase) % QUERY_INTERVAL)
    expected = EPOCH + (60 if last_poll_before_60 >= 60 else 0)
    assert prom.snapshot(60).taken_at == expected
    assert prom.snapshot(60 + QUERY_INTERVAL).taken_at == EPOCH + 60
    for now in range(60, 120):
        assert now - (prom.snapshot(now).taken_at - EPOCH) <= 60 + QUERY_INTERVAL


def test_per_vm_usage_is_noisy_and_seeded():
    kv = hot_cluster()
    a, b = ModelledPrometheus(seed=1, sample_interval=60), ModelledPrometheus(seed=1, sample_interval=60)
    sample(kv, a, 0)
    sample(kv, b, 0)
    seen = [a.samples[-1][1].vms[(NAMESPACE, v.name)].cpu_cores for v in kv.vmis[:4]]
    assert seen == [b.samples[-1][1].vms[(NAMESPACE, v.name)].cpu_cores for v in kv.vmis[:4]]
    true = [v.vm.vcpus * v.vm.cpu_load.value(0) for v in kv.vmis[:4]]
    assert seen != true and all(0.5 < s / t < 2 for s, t in zip(seen, true))


def test_the_guard_lets_the_vm_whose_move_helps_most_go_first():
    kv = hot_cluster()
    prom = ModelledPrometheus(seed=1, sample_interval=60)
    guard = Mode(parse_mode("upstream+steer"), kv, SETTINGS, SETTINGS, prom)
    sample(kv, prom, 0)
    sample(kv, prom, 60)
    now = 60 + QUERY_INTERVAL
    small = guard.admit(kv.vmis[0].pod, now)  # 0.4 cores: its move barely helps
    assert (small.allowed, small.reason) == (False, Reason.BETTER_CANDIDATE), small.message
    big = guard.admit(kv.vmis[int(small.message.split("vms/vm")[1][:2])].pod, now)  # the one it names
    assert big.reason == "kubevirt_evacuation"


def test_no_gain_when_the_node_is_not_hot():
    kv, _, _ = cluster(3, 2)  # everything level: every score 0
    prom = ModelledPrometheus(seed=1, sample_interval=60)
    guard = Mode(parse_mode("profile+steer"), kv, SETTINGS, SETTINGS, prom)
    sample(kv, prom, 0)
    answer = guard.admit(kv.vmis[0].pod, QUERY_INTERVAL * 3)
    assert answer.reason == Reason.NO_GAIN


def test_without_data_steering_fails_open():
    kv = hot_cluster()
    prom = ModelledPrometheus(seed=1, sample_interval=60)
    guard = Mode(parse_mode("profile+steer"), kv, SETTINGS, SETTINGS, prom)
    assert guard.admit(kv.vmis[0].pod, 0).reason == "kubevirt_evacuation"  # metrics_unavailable: allowed
