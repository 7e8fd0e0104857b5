"""The scenario's load, served to Prometheus the way the KubeVirt profile's recording rules consume it.

Every ``sampleInterval`` the load model (``app.sim.model`` profiles, ticked from the same seeded stream in the same
order as the simulator's engine) gives each VM's CPU and memory use; per node that becomes CPU use, memory use and
their pressures, following the VMs where they run now (and a running migration's extra load on both ends), exactly
as the simulator's sample. The exporter serves those four numbers per node, labelled ``instance`` = node name;
Prometheus's rules (``tests/e2e/outcome/prometheus.py``) turn them into the profile's score, which the real
descheduler queries. The exporter also serves the simulator's own score for the same sample
(``kubevirt_actor_node_model_score``), so a run can check that Prometheus computes what the model computes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from app.sim.descheduler import node_scores, pressure

DIMENSIONS = ("cpu_utilisation", "memory_utilisation", "cpu_pressure", "memory_pressure")


def node_dims(kv, now: int, overhead: float) -> list[tuple[float, float, float, float]]:
    """(CPU use, memory use, CPU pressure, memory pressure) per node at ``now``: the simulator's sample."""
    n = len(kv.nodes)
    cpu, mem = [0.0] * n, [0.0] * n
    for vmi in kv.vmis:
        vm, i = vmi.vm, vmi.node.index
        cpu[i] += vm.vcpus * vm.cpu_load.value(now)
        mem[i] += vm.memory * vm.memory_load.value(now)
    for m in kv.running:
        if m.source is not None and m.target is not None and m.copy_start is not None:
            cpu[m.source.index] += overhead
            cpu[m.target.index] += overhead
            mem[m.target.index] += m.vmi.vm.memory * m.vmi.vm.memory_load.value(now)
    out = []
    for node in kv.nodes:
        cd, md = cpu[node.index] / node.cpu, mem[node.index] / node.memory
        out.append((min(1.0, cd), min(1.0, md), pressure(cd), pressure(md)))
    return out


class Exporter:
    def __init__(self, node_names: list[str]) -> None:
        self.registry = CollectorRegistry()
        self.nodes = node_names
        self.gauges = [Gauge(f"kubevirt_actor_node_{d}", f"node {d.replace('_', ' ')} (0-1) from the load model",
                             ["instance"], registry=self.registry) for d in DIMENSIONS]
        self.model_score = Gauge("kubevirt_actor_node_model_score", "the simulator's node score for this sample (0-1)",
                                 ["instance"], registry=self.registry)
        self.sample_time = Gauge("kubevirt_actor_sample_seconds", "run time of the latest load sample",
                                 registry=self.registry)
        self.port = 0

    def serve(self) -> int:
        server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = server.server_address[1]
        return self.port

    def update(self, now: int, dims: list[tuple[float, float, float, float]]) -> list[int]:
        scores = node_scores(dims)
        for name, d, score in zip(self.nodes, dims, scores):
            for gauge, value in zip(self.gauges, d):
                gauge.labels(instance=name).set(value)
            self.model_score.labels(instance=name).set(score / 100)
        self.sample_time.set(now)
        return scores
