"""Which VM's move lowers a hot node's score the most: the prediction behind steering.

The descheduler's score for a node (the KubeVirtRelieveAndMigrate profile's
recording rule) is 3 x the Euclidean norm of the node's positive deviations from
the workers' average in four dimensions (CPU use, memory use, CPU pressure,
memory pressure), capped at 1. Pressure counts only while use is above 70%.

For a VM on the hot node, the move is predicted by taking its measured usage off
the hot node and putting it on the likely target (the node with the lowest score),
both as fractions of the node's capacity. What cannot be predicted is said so:
PSI is kept as measured while use stays above 70% and dropped to 0 below it (a
target pushed over 70% gets no predicted pressure); the workers' averages are
kept as they are (a move between workers leaves the mean use unchanged when the
nodes are of one size). Scores are in percentage points, as the descheduler logs
them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.domain.usage import NodeUsage, VMUsage

AMPLIFICATION = 3.0
PRESSURE_FROM = 0.7  # the recording rule counts pressure only above 70% use


def score(dims: Iterable[float], averages: Iterable[float]) -> float:
    """The profile's score in percentage points (0..100), not truncated."""
    sq = 0.0
    for d, a in zip(dims, averages):
        dev = d - a
        if dev > 0:
            sq += dev * dev
    return min(1.0, AMPLIFICATION * math.sqrt(sq)) * 100.0


def workers_average(nodes: Mapping[str, NodeUsage]) -> tuple[float, float, float, float]:
    n = len(nodes) or 1
    return tuple(sum(u.dims[i] for u in nodes.values()) / n for i in range(4))  # type: ignore[return-value]


def _gate(use: float, pressure: float) -> float:
    return pressure if use > PRESSURE_FROM else 0.0


def shifted(node: NodeUsage, vm: VMUsage, sign: float) -> tuple[float, float, float, float] | None:
    """``node``'s four inputs with ``vm`` taken off (sign -1) or put on (+1); None without capacities."""
    if not node.cpu_cores or not node.memory_bytes:
        return None
    cpu = min(1.0, max(0.0, node.cpu + sign * vm.cpu_cores / node.cpu_cores))
    mem = min(1.0, max(0.0, node.memory + sign * vm.memory_bytes / node.memory_bytes))
    return (cpu, mem, _gate(cpu, node.cpu_pressure), _gate(mem, node.memory_pressure))


@dataclass(slots=True, frozen=True)
class Candidate:
    key: tuple[str, str]  # (namespace, VMI name)
    gain: float  # points by which the higher of (hot, target) scores drops
    hot_after: float
    target_after: float
    cpu_cores: float
    memory_bytes: float

    @property
    def name(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


@dataclass(slots=True, frozen=True)
class Ranking:
    hot: str
    hot_score: float  # predicted by the formula from the inputs (what gains are measured against)
    measured_score: float | None  # the recording rule's own value, points
    target: str
    target_score: float
    candidates: tuple[Candidate, ...]  # best first

    def of(self, key: tuple[str, str]) -> Candidate | None:
        return next((c for c in self.candidates if c.key == key), None)

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None


def likely_target(nodes: Mapping[str, NodeUsage], averages, hot: str, excluded: frozenset[str] | set[str]) -> str | None:
    """The node a migration is judged against: the highest-scoring node at or below the nodes' mean score
    (the descheduler's underutilised nodes, where its soft-tainter lets the scheduler place the VM; which of
    them the scheduler picks the guard cannot tell, so it assumes the least favourable), then lowest CPU use,
    then name."""
    scored = [(score(u.dims, averages), u.cpu, name) for name, u in nodes.items()
              if name != hot and name not in excluded and u.cpu_cores and u.memory_bytes]
    if not scored:
        return None
    mean = sum(score(u.dims, averages) for u in nodes.values()) / len(nodes)
    under = [k for k in scored if k[0] <= mean + 1e-9] or [min(scored)]
    return min(under, key=lambda k: (-k[0], k[1], k[2]))[2]


def rank(
    nodes: Mapping[str, NodeUsage],
    averages: tuple[float, float, float, float] | None,
    hot: str,
    vms: Iterable[tuple[tuple[str, str], VMUsage]],
    excluded: frozenset[str] | set[str] = frozenset(),
) -> Ranking | None:
    """The VMs in ``vms`` ranked by how much their move would lower max(hot score, target score).

    None when the hot node or a target has no data to predict with.
    """
    node = nodes.get(hot)
    avg = averages if averages is not None else workers_average(nodes)
    if node is None:
        return None
    target_name = likely_target(nodes, avg, hot, excluded)
    if target_name is None:
        return None
    target = nodes[target_name]
    hot_now, target_now = score(node.dims, avg), score(target.dims, avg)
    before = max(hot_now, target_now)
    out = []
    for key, vm in vms:
        h, t = shifted(node, vm, -1.0), shifted(target, vm, +1.0)
        if h is None or t is None:
            return None
        ha, ta = score(h, avg), score(t, avg)
        out.append(Candidate(key, before - max(ha, ta), ha, ta, vm.cpu_cores, vm.memory_bytes))
    out.sort(key=lambda c: (-c.gain, c.key))
    measured = node.score * 100.0 if node.score is not None else None
    return Ranking(hot, hot_now, measured, target_name, target_now, tuple(out))
