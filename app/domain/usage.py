"""Measured usage from Prometheus, as one immutable snapshot: the descheduler's node
scores and their four inputs, node capacities, and each VM's usage.

The poller (app/metricsource) builds a new snapshot every interval and replaces the
old one in one assignment; policy reads whichever it is handed and never waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(slots=True, frozen=True)
class NodeUsage:
    """One node as the descheduler's recording rules see it (fractions, 0..1)."""

    cpu: float  # descheduler:nodeutilization:cpu:avg1m
    memory: float  # descheduler:nodeutilization:memory:avg1m
    cpu_pressure: float = 0.0  # descheduler:nodepressure:cpu:avg1m (0 when absent)
    memory_pressure: float = 0.0  # descheduler:nodepressure:memory:avg1m
    score: float | None = None  # the profile's score, 0..1, as Prometheus recorded it
    cpu_cores: float | None = None  # capacity, for turning a VM's usage into a fraction
    memory_bytes: float | None = None

    @property
    def dims(self) -> tuple[float, float, float, float]:
        return (self.cpu, self.memory, self.cpu_pressure, self.memory_pressure)


@dataclass(slots=True, frozen=True)
class VMUsage:
    """One VM's measured usage: CPU in cores (rate of the usage counter), memory in bytes."""

    node: str
    cpu_cores: float
    memory_bytes: float


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(slots=True, frozen=True)
class UsageSnapshot:
    """What the guard knows about usage. ``taken_at`` None: nothing fetched yet.

    ``max_age``: older than this (seconds, against the decision's ``now``), the data
    is not used and steering fails open.
    """

    taken_at: float | None = None  # epoch seconds the oldest node score describes
    max_age: float = 90.0
    nodes: Mapping[str, NodeUsage] = field(default_factory=_empty)
    vms: Mapping[tuple[str, str], VMUsage] = field(default_factory=_empty)  # (namespace, VMI name)
    averages: tuple[float, float, float, float] | None = None  # the workers' averages of NodeUsage.dims
    error: str = ""  # the last fetch's problem, for the fail-open message

    def age(self, now: float) -> float | None:
        return None if self.taken_at is None else max(0.0, now - self.taken_at)

    def usable(self, now: float) -> bool:
        age = self.age(now)
        return age is not None and age <= self.max_age and bool(self.nodes)

    def vms_on(self, node: str) -> list[tuple[tuple[str, str], VMUsage]]:
        return sorted((k, v) for k, v in self.vms.items() if v.node == node)


def indexed(snapshot: UsageSnapshot) -> UsageSnapshot:
    """The same snapshot, answering ``vms_on`` from a per-node index (built once per round,
    so that a decision reads the node's VMs, not every VM in the cluster)."""
    by_node: dict[str, list] = {}
    for key, vm in snapshot.vms.items():
        by_node.setdefault(vm.node, []).append((key, vm))
    return _Indexed(snapshot.taken_at, snapshot.max_age, snapshot.nodes, snapshot.vms, snapshot.averages,
                    snapshot.error, MappingProxyType({n: tuple(sorted(v)) for n, v in by_node.items()}))


@dataclass(slots=True, frozen=True)
class _Indexed(UsageSnapshot):
    by_node: Mapping[str, tuple] = field(default_factory=_empty)

    def vms_on(self, node: str) -> list[tuple[tuple[str, str], VMUsage]]:
        return list(self.by_node.get(node, ()))
