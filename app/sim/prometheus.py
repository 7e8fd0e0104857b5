"""A modelled Prometheus for the steering guard (mode ``BASELINE+steer``).

What the guard would read, with the errors it would have in a cluster:

- **age**: the guard polls every ``QUERY_INTERVAL`` (its default, 30 s) at a seeded
  phase; at a decision it holds the latest load sample taken at or before its last
  poll, so its data is the descheduler's or one sample older (up to one sample
  interval plus one query interval);
- **noisy per-VM usage**: each VM's CPU and memory as the guard sees them are the
  true values times a log-normal factor (sigma ``CPU_NOISE``, ``MEMORY_NOISE``),
  drawn afresh at every sample (a 2-minute rate of a counter and a gauge against the
  node's 1-minute averages);
- **PSI not predicted**: node pressure is handed over as measured; the guard's
  prediction keeps it while use stays above 70% and drops it below (steering.py),
  whereas the model's pressure follows demand;
- node use, pressures and scores are the sample's own (what the recording rules
  would have recorded); the workers' averages are the mean over all nodes, as the
  model's score takes them.

The noise levels are assumptions, not measurements; docs/steering.md says so.
"""

from __future__ import annotations

import math
from random import Random
from types import MappingProxyType

from app.domain.usage import NodeUsage, UsageSnapshot, VMUsage, indexed
from app.sim.kubevirt import EPOCH, NAMESPACE

QUERY_INTERVAL = 30
CPU_NOISE, MEMORY_NOISE = 0.15, 0.05
GIB = float(1 << 30)


class ModelledPrometheus:
    def __init__(self, seed: int, sample_interval: int) -> None:
        self.rng = Random(f"{seed}:prometheus")
        self.phase = self.rng.randrange(QUERY_INTERVAL)
        self.max_age = float(sample_interval + 2 * QUERY_INTERVAL)  # never fails open here: staleness is not what is measured
        self.samples: list[tuple[int, UsageSnapshot]] = []  # the last two

    def record(self, now: int, nodes, vmis, dims, scores) -> None:
        """One load sample: ``dims`` per node (cpu use, memory use, cpu pressure, memory pressure), ``scores`` in points."""
        node_usage = {
            n.name: NodeUsage(cpu=d[0], memory=d[1], cpu_pressure=d[2], memory_pressure=d[3], score=s / 100.0,
                              cpu_cores=float(n.cpu), memory_bytes=n.memory * GIB)
            for n, d, s in zip(nodes, dims, scores)
        }
        vms = {}
        for vmi in vmis:
            vm = vmi.vm
            cpu = vm.vcpus * vm.cpu_load.value(now) * math.exp(self.rng.gauss(0.0, CPU_NOISE))
            mem = vm.memory * vm.memory_load.value(now) * GIB * math.exp(self.rng.gauss(0.0, MEMORY_NOISE))
            vms[(NAMESPACE, vmi.name)] = VMUsage(vmi.node.name, cpu, mem)
        k = len(dims) or 1
        averages = tuple(sum(d[i] for d in dims) / k for i in range(4))
        snap = indexed(UsageSnapshot(taken_at=float(EPOCH + now), max_age=self.max_age,
                                     nodes=MappingProxyType(node_usage), vms=MappingProxyType(vms),
                                     averages=averages))  # type: ignore[arg-type]
        self.samples = [*self.samples[-1:], (now, snap)]

    def snapshot(self, now: int) -> UsageSnapshot:
        """What the guard holds at ``now``: the latest sample at or before its last poll."""
        last_poll = now - ((now - self.phase) % QUERY_INTERVAL)
        for at, snap in reversed(self.samples):
            if at <= last_poll:
                return snap
        return UsageSnapshot(max_age=self.max_age)
