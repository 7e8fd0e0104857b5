"""The scenario's load, served to Prometheus the way the KubeVirt profile's recording rules consume it.

Every ``sampleInterval`` the load model (``app.sim.model`` profiles, ticked from the same seeded stream in the same
order as the simulator's engine) gives each VM's CPU and memory use; per node that becomes CPU use, memory use and
their pressures, following the VMs where they run now (and a running migration's extra load on both ends): the
simulator's own ``app.sim.engine.node_load``. The exporter serves those four numbers per node, labelled ``instance``
= node name; Prometheus's rules (``tests/e2e/outcome/prometheus.py``) turn them into the profile's score, which the
real descheduler queries. The exporter also serves the simulator's own score for the same sample
(``kubevirt_actor_node_model_score``), so a run can check that Prometheus computes what the model computes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from app.sim.descheduler import node_scores

DIMENSIONS = ("cpu_utilisation", "memory_utilisation", "cpu_pressure", "memory_pressure")


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
