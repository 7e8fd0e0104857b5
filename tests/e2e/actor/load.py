"""The scenario's load, served to Prometheus the way a cluster's exporters serve it.

Every ``sampleInterval`` the load model (``app.sim.model`` profiles, ticked from the same seeded stream in the same
order as the simulator's engine) gives each VM's CPU and memory use; per node that becomes CPU use, memory use and
their pressures, following the VMs where they run now (and a running migration's extra load on both ends): the
simulator's own ``app.sim.engine.node_load``. The exporter serves those four numbers per node, labelled ``instance``
= node name; Prometheus's rules (``tests/e2e/outcome/prometheus.py``) turn them into the profile's score, which the
real descheduler queries. The exporter also serves the simulator's own score for the same sample
(``kubevirt_actor_node_model_score``), so a run can check that Prometheus computes what the model computes.

Beside them, what a cluster's own exporters serve about the same VMs and nodes, with their names, labels and units,
for the guard's steering to read (``app/metricsource/prometheus.py``):

- virt-handler (KubeVirt v1.8.3's domain stats, ``pkg/monitoring/metrics/virt-handler/domainstats``), per VMI with
  the labels ``node`` (the VMI's ``status.nodeName``), ``namespace``, ``name`` and the VMI's labels as
  ``kubernetes_vmi_label_*`` (virt-controller sets ``kubevirt.io/nodeName``): ``kubevirt_vmi_cpu_usage_seconds_total``
  (a counter of the domain's CPU seconds; a new domain, on the target after a migration, counts from 0),
  ``kubevirt_vmi_memory_available_bytes`` (the guest's memory) and ``kubevirt_vmi_memory_usable_bytes`` (what the
  guest could still use, ``MemAvailable``). KubeVirt's ``kubevirt_vmi_memory_used_bytes`` is not exported by
  virt-handler: it is a recording rule of virt-operator's PrometheusRule (available - usable), which the run's
  Prometheus records as KubeVirt's does;
- kube-state-metrics: ``kube_node_status_capacity{node, resource="cpu", unit="core"}`` and
  ``{resource="memory", unit="byte"}``, from the Node objects' capacity.

Counters advance continuously between samples (a VM's CPU seconds grow at its current use in cores), as a domain's
do, so Prometheus's ``rate()`` over them is what it would be in a cluster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from app.sim.descheduler import node_scores

DIMENSIONS = ("cpu_utilisation", "memory_utilisation", "cpu_pressure", "memory_pressure")
GIB = float(1 << 30)
VMI_LABELS = ("node", "namespace", "name", "kubernetes_vmi_label_kubevirt_io_nodeName")


class ClusterExporters:
    """virt-handler's per-VMI metrics and kube-state-metrics' node capacity, as a prometheus_client collector.

    ``update`` takes each VM's use at a sample; ``where`` (called at each scrape) says on which node each VMI runs
    now, as its ``status.nodeName``."""

    def __init__(self, namespace: str, capacity: dict[str, tuple[float, float]],
                 where: Callable[[], dict[tuple[str, str], str]], clock: Callable[[], float] = time.monotonic) -> None:
        self.namespace = namespace
        self.capacity = capacity  # node -> (cores, bytes)
        self.where, self.clock = where, clock
        self.lock = threading.Lock()
        # VMI -> [node, CPU seconds at `since`, since, cores now, memory bytes, used bytes]
        self.vms: dict[str, list] = {}

    def _advance(self, name: str, node: str, now: float) -> list:
        state = self.vms[name]
        if state[0] != node:  # the domain now runs on another node: a new process, a new counter
            state[0], state[1] = node, 0.0
        else:
            state[1] += state[3] * (now - state[2])
        state[2] = now
        return state

    def update(self, use: dict[str, tuple[float, float, float]]) -> None:
        """``use``: VMI name -> (CPU cores in use, guest memory bytes, memory bytes in use), from this sample on."""
        now = self.clock()
        nodes = self.where()
        with self.lock:
            for name, (cores, memory, used) in use.items():
                node = nodes.get((self.namespace, name), "")
                if name not in self.vms:
                    self.vms[name] = [node, 0.0, now, cores, memory, used]
                state = self._advance(name, node, now)
                state[3], state[4], state[5] = cores, memory, used

    def collect(self):
        now = self.clock()
        nodes = self.where()
        cpu = CounterMetricFamily("kubevirt_vmi_cpu_usage_seconds", "Total CPU time spent in all modes (sum of both "
                                  "vcpu and hypervisor usage).", labels=VMI_LABELS)
        available = GaugeMetricFamily("kubevirt_vmi_memory_available_bytes", "Amount of usable memory as seen by "
                                      "the domain.", labels=VMI_LABELS)
        usable = GaugeMetricFamily("kubevirt_vmi_memory_usable_bytes", "The amount of memory which can be reclaimed "
                                   "by balloon without pushing the guest system to swap.", labels=VMI_LABELS)
        with self.lock:
            for name in sorted(self.vms):
                node = nodes.get((self.namespace, name), "")
                state = self._advance(name, node, now)
                if not node:
                    continue  # not running anywhere: no virt-handler reports it
                labels = [node, self.namespace, name, node]
                cpu.add_metric(labels, state[1])
                available.add_metric(labels, state[4])
                usable.add_metric(labels, max(0.0, state[4] - state[5]))
        capacity = GaugeMetricFamily("kube_node_status_capacity", "The capacity for different resources of a node.",
                                     labels=("node", "resource", "unit"))
        for node, (cores, memory) in sorted(self.capacity.items()):
            capacity.add_metric([node, "cpu", "core"], cores)
            capacity.add_metric([node, "memory", "byte"], memory)
        yield from (cpu, available, usable, capacity)


class Exporter:
    def __init__(self, node_names: list[str], cluster: ClusterExporters | None = None) -> None:
        self.registry = CollectorRegistry()
        self.nodes = node_names
        self.gauges = [Gauge(f"kubevirt_actor_node_{d}", f"node {d.replace('_', ' ')} (0-1) from the load model",
                             ["instance"], registry=self.registry) for d in DIMENSIONS]
        self.model_score = Gauge("kubevirt_actor_node_model_score", "the simulator's node score for this sample (0-1)",
                                 ["instance"], registry=self.registry)
        self.sample_time = Gauge("kubevirt_actor_sample_seconds", "run time of the latest load sample",
                                 registry=self.registry)
        self.cluster = cluster
        if cluster is not None:
            self.registry.register(cluster)
        self.port = 0

    def serve(self) -> int:
        server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = server.server_address[1]
        return self.port

    def update(self, now: int, dims: list[tuple[float, float, float, float]],
               vm_use: dict[str, tuple[float, float, float]] | None = None) -> list[int]:
        scores = node_scores(dims)
        for name, d, score in zip(self.nodes, dims, scores):
            for gauge, value in zip(self.gauges, d):
                gauge.labels(instance=name).set(value)
            self.model_score.labels(instance=name).set(score / 100)
        if self.cluster is not None and vm_use is not None:
            self.cluster.update(vm_use)
        self.sample_time.set(now)
        return scores
