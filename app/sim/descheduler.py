"""The descheduler running the KubeVirtRelieveAndMigrate profile, and its soft-tainter.

One cycle (every ``interval`` seconds, start to start):
1. forget background evictions that are over (pod gone, annotation removed);
2. classify nodes by one utilisation number each (``node_scores``): the mean of
   the integer percents; a schedulable node at or below mean - low is
   underutilised, a node above mean + high overutilised;
3. the soft-tainter marks every node that is not underutilised PreferNoSchedule;
4. nothing more happens unless some node is under- and some overutilised and
   not every node is underutilised;
5. overutilised nodes, highest first: take ``evictionLimits.node`` pods from
   each, never more than ``maxNoOfPodsToEvictPerNode`` on a node or
   ``maxNoOfPodsToEvictTotal`` in all, counting background evictions still in
   flight from earlier cycles. Pods of equal priority come in arbitrary
   (seeded random) order; the pre-eviction filter may skip one.

Answers are read as the descheduler reads them: a 429 whose text contains
``Eviction triggered evacuation`` is an eviction running in the background
(tracked, counted); any other refusal -> the next candidate; allowed -> evicted.
A tracked eviction is an assumption that lapses after 10 minutes (swept every
10 minutes) unless the pod carries ``eviction-in-progress``; then it is
tracked until the annotation goes away or the pod is gone.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.sim.kubevirt import Answer, KubeVirt, Pod
from app.sim.model import Node
from app.sim.scenario import DeschedulerSettings

PRESSURE_FROM = 0.7  # pressure only counts above 70% use


def pressure(demand: float) -> float:
    """PSI-like pressure of a resource asked for ``demand`` x its capacity.

    A simplification: 0 up to 70% use, then rising linearly to 1 at 130% demand
    (tasks queue for the CPU once it is saturated)."""
    if demand <= PRESSURE_FROM:
        return 0.0
    return min(1.0, (demand - PRESSURE_FROM) / 0.6)


def node_scores(dims: Sequence[Sequence[float]]) -> list[int]:
    """The profile's recording rule: per node, the Euclidean norm of its positive
    deviations from the average of all workers in each dimension (CPU use, memory
    use, CPU pressure, memory pressure), times 3, capped at 1, as a truncated
    integer percent."""
    if not dims:
        return []
    k = len(dims[0])
    avg = [sum(d[i] for d in dims) / len(dims) for i in range(k)]
    out = []
    for d in dims:
        sq = 0.0
        for i in range(k):
            dev = d[i] - avg[i]
            if dev > 0:
                sq += dev * dev
        out.append(int(min(1.0, 3 * math.sqrt(sq)) * 100 + 1e-9))
    return out


@dataclass(frozen=True, slots=True)
class Classification:
    mean: float
    under: tuple[str, ...]
    over: tuple[str, ...]  # highest value first
    act: bool  # some under, some over, not all under


def classify(scores: dict[str, int], schedulable: set[str], low: float, high: float) -> Classification:
    if not scores:
        return Classification(0.0, (), (), False)
    mean = sum(scores.values()) / len(scores)
    under = tuple(n for n in scores if n in schedulable and scores[n] <= mean - low)
    over = tuple(sorted((n for n in scores if scores[n] > mean + high), key=lambda n: (-scores[n], n)))
    act = bool(under) and bool(over) and len(under) < len(scores)
    return Classification(mean, under, over, act)


@dataclass(slots=True)
class Tracked:
    node: str
    since: int
    confirmed: bool = False  # the pod was seen with eviction-in-progress


class Descheduler:
    """``admit(pod, now) -> Answer`` is the API server's answer to an eviction (webhooks
    and KubeVirt); ``pre_filter(pod, now) -> reason or None`` the evictor plugin's filter."""

    def __init__(
        self,
        settings: DeschedulerSettings,
        kubevirt: KubeVirt,
        admit: Callable[[Pod, int], Answer],
        pre_filter: Callable[[Pod, int], str | None],
        rng: random.Random,
    ) -> None:
        self.s = settings
        self.kv = kubevirt
        self.admit = admit
        self.pre_filter = pre_filter
        self.rng = rng
        self.tracked: dict[str, Tracked] = {}
        self.scores: dict[str, int] = {}  # latest utilisation per node, set by the metrics sampler
        self.attempts = 0  # eviction requests sent
        self.background = 0  # of which counted as running in the background
        self.outcomes: Counter[str] = Counter()  # every answer's reason, and the filter's skips
        self.cycles = 0
        self.active_cycles = 0

    # ---- background evictions in flight -------------------------------------

    def refresh(self) -> None:
        """What the pod informer tells: pods gone, annotations added or removed."""
        pods = self.kv.pods
        for name in list(self.tracked):
            t = self.tracked[name]
            pod = pods.get(name)
            if pod is None or (t.confirmed and not pod.eviction_in_progress):
                del self.tracked[name]
            elif pod.eviction_in_progress:
                t.confirmed = True

    def sweep(self, now: int) -> None:
        """Every 10 minutes: assumptions older than 10 minutes lapse unless confirmed."""
        self.refresh()
        for name in [n for n, t in self.tracked.items() if not t.confirmed and now - t.since > self.s.assumption_timeout]:
            del self.tracked[name]

    def restart(self) -> None:
        """A new descheduler process: its assumptions are gone; pods still annotated
        ``eviction-in-progress`` are found again by its informer."""
        self.tracked = {
            p.name: Tracked(p.node.name, 0, confirmed=True) for p in self.kv.pods.values() if p.eviction_in_progress
        }

    def in_flight(self) -> Counter[str]:
        return Counter(t.node for t in self.tracked.values())

    # ---- one cycle -------------------------------------------------------------

    def cycle(self, now: int) -> Classification:
        self.cycles += 1
        self.refresh()
        nodes = self.kv.nodes
        schedulable = {n.name for n in nodes if not n.cordoned}
        c = classify(self.scores, schedulable, self.s.low, self.s.high)
        self.taint(nodes, set(c.under))
        if not c.act:
            return c
        self.active_cycles += 1
        in_flight = self.in_flight()
        total = sum(in_flight.values())
        for node in c.over:
            if total >= self.s.max_total:
                break
            total += self.evict_from(node, in_flight[node], self.s.max_total - total, now)
        return c

    def taint(self, nodes: list[Node], under: set[str]) -> None:
        """The soft-tainter: PreferNoSchedule on every node that is not underutilised."""
        for n in nodes:
            n.soft_tainted = bool(under) and n.name not in under

    def evict_from(self, node: str, in_flight_here: int, total_left: int, now: int) -> int:
        """Evict up to evictionLimits.node pods from one overutilised node; returns how many."""
        budget = min(self.s.eviction_limit_node, self.s.max_per_node - in_flight_here, total_left)
        if budget <= 0:
            return 0
        candidates = sorted(p for p in self.kv.pods_on[node] if p not in self.tracked)
        self.rng.shuffle(candidates)  # equal priority and QoS: arbitrary order
        evicted = 0
        for name in candidates:
            if evicted >= budget:
                break
            pod = self.kv.pods[name]
            skip = self.pre_filter(pod, now)
            if skip is not None:
                self.outcomes[skip] += 1
                continue
            self.attempts += 1
            answer = self.admit(pod, now)
            self.outcomes[answer.reason] += 1
            if answer.background:
                self.background += 1
                self.tracked[name] = Tracked(node, now, confirmed=pod.eviction_in_progress)
                evicted += 1
            elif answer.allowed:
                evicted += 1  # a plain eviction (not a migratable VM pod): not modelled further
        return evicted
