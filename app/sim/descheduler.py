"""The descheduler running LowNodeUtilization on the profile's score, and the soft-tainter.

One cycle (every ``interval`` seconds, start to start; at once after a restart):
1. classify nodes by one utilisation number each (``node_scores``): the mean of
   the integer percents; a schedulable node at or below mean - low is
   underutilised, a node above mean + high overutilised;
2. nothing happens unless some node is under- and some overutilised and not
   every node is underutilised;
3. overutilised nodes, highest first, without re-checking them: take pods, in
   seeded random order (equal priority and QoS), until a limit refuses, checked
   in the descheduler's order (v0.36): LowNodeUtilization's ``evictionLimits.node``
   counts this cycle's evictions from the node only (``evicted >= limit`` stops
   the node); a pod already in the in-flight cache is not sent again and passes
   no other limit, but counts as evicted there; for a pod to be sent, the pod
   evictor checks ``sent this cycle + in flight + 1 > limit`` for
   ``maxNoOfPodsToEvictTotal`` (stops the cycle) and ``maxNoOfPodsToEvictPerNode``
   (stops the node). So with ``evictionLimits.node: 1`` a node with one VM in
   flight still gives up one more per cycle, up to ``maxNoOfPodsToEvictPerNode``.
   A pod the filter (plugin) skips is passed over.

The in-flight cache (EvictionsInBackground):
- *assumed*: a 429 whose text contains ``Eviction triggered evacuation`` adds the
  pod (it carries ``request-evict-only``);
- *observed*: the pod informer adds every pod carrying ``request-evict-only`` and
  ``eviction-in-progress``, whoever evicted it, at its add or update event; the
  add is a no-op for a pod already in the cache;
- an assumed entry lapses 10 minutes after it was assumed, swept every 10
  minutes, even while the pod is still annotated (a lapse is an ``error``);
- an entry goes when its pod loses the annotation or is deleted.
Answers are read as the descheduler reads them: background (above), allowed
(evicted), anything else an error -> the next candidate.

The soft-tainter is its own controller with its own period: PreferNoSchedule
taints, two on overutilised nodes and one on appropriately utilised ones.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.sim.kubevirt import Answer, KubeVirt, Pod
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
class Entry:
    """One pod in the in-flight cache."""

    node: str
    since: int
    assumed: bool  # True: from a background answer (lapses); False: observed by the informer


@dataclass(slots=True)
class CycleResult:
    classification: Classification
    sent: int = 0  # eviction requests sent
    started: int = 0  # answered allowed or background (a new eviction)
    started_on: Counter = field(default_factory=Counter)  # new evictions per node
    blocked_by_in_flight: bool = False  # an overutilised node, nothing evicted, limits full of in-flight entries


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
        self.cache: dict[str, Entry] = {}
        self.scores: dict[str, int] = {}  # latest utilisation per node, set by the metrics sampler
        self.answers: Counter[str] = Counter()  # allowed / background / error, as the descheduler reads them
        self.outcomes: Counter[str] = Counter()  # every answer's reason, and the filter's skips
        self.lapsed = 0  # assumed entries dropped by the sweep
        self.cached_hits = 0  # candidates already in flight: counted as evicted, nothing sent
        self.redirected = 0  # evictions that went to another pod after a refusal or a skip on that node
        self.cycles = 0
        self.active_cycles = 0
        # descheduler_pods_evicted_total{result="success"} as it counts: each success's node, to ``on_success``
        self.on_success: Callable[[int, str], None] | None = None
        self.count_background = False  # what-if: a finished background eviction counts when its pod goes
        self.clock: Callable[[], int] = lambda: 0  # the simulation's time, for events without one
        kubevirt.pod_listeners.append(self.pod_event)
        kubevirt.pod_delete_listeners.append(self.pod_deleted)

    # ---- the in-flight cache -------------------------------------------------

    def pod_event(self, pod: Pod, now: int) -> None:
        """The pod informer's add or update event."""
        if pod.eviction_in_progress:
            if pod.name not in self.cache:
                self.cache[pod.name] = Entry(pod.node.name, now, assumed=False)
        else:
            self.cache.pop(pod.name, None)

    def pod_deleted(self, pod: Pod) -> None:
        """The pod is gone. v0.36 counts an assumed entry's pod deleted from the cache as a success; a migrated
        VM's source pod turns Succeeded first, which removes its entry uncounted (app/sim/recording.py)."""
        entry = self.cache.pop(pod.name, None)
        if entry is not None and entry.assumed and self.count_background and self.on_success is not None:
            self.on_success(self.clock(), entry.node)

    def sweep(self, now: int) -> None:
        """Every 10 minutes: assumed entries older than 10 minutes lapse, annotation or not."""
        for name in [n for n, e in self.cache.items() if e.assumed and now - e.since >= self.s.assumption_timeout]:
            del self.cache[name]
            self.lapsed += 1

    def restart(self, now: int) -> None:
        """A new descheduler process: the cache is empty, then its informer's initial list
        adds every pod that carries both annotations."""
        self.cache = {}
        for pod in self.kv.pods.values():
            self.pod_event(pod, now)

    def in_flight(self) -> Counter[str]:
        return Counter(e.node for e in self.cache.values())

    # ---- one cycle -------------------------------------------------------------

    def classify_now(self) -> Classification:
        schedulable = {n.name for n in self.kv.nodes if not n.cordoned}
        return classify(self.scores, schedulable, self.s.low, self.s.high)

    def cycle(self, now: int) -> CycleResult:
        self.cycles += 1
        c = self.classify_now()
        result = CycleResult(c)
        if not c.act:
            return result
        self.active_cycles += 1
        in_flight = self.in_flight()
        state = {"total": 0, "in_flight_total": sum(in_flight.values()), "limit_hit": False}
        tolerated = any(not self.kv.node_by_name[n].no_schedule for n in c.under)
        if not tolerated:
            return result  # no pod tolerates the taints of an underutilised node
        for node in c.over:
            if not self.evict_from(node, in_flight[node], state, result, now):
                break
        result.blocked_by_in_flight = result.started == 0 and state["limit_hit"] and state["in_flight_total"] > 0
        return result

    def evict_from(self, node: str, in_flight_here: int, state: dict, result: CycleResult, now: int) -> bool:
        """Take pods from one overutilised node until a limit refuses; False once the
        total limit is reached (the cycle stops)."""
        s = self.s
        candidates = sorted(self.kv.pods_on[node])
        self.rng.shuffle(candidates)  # equal priority and QoS: arbitrary order
        evicted = 0  # LowNodeUtilization's count for evictionLimits.node: cached candidates included
        sent = 0  # new evictions from this node (the pod evictor's, beside the in-flight entries)
        passed_over = False
        for name in candidates:
            pod = self.kv.pods.get(name)
            if pod is None:
                continue
            if evicted >= s.eviction_limit_node:
                state["limit_hit"] = True
                return True
            skip = self.pre_filter(pod, now)
            if skip is not None:
                self.outcomes[skip] += 1
                passed_over = True
                continue
            if name in self.cache:
                self.cached_hits += 1  # already in flight: success without a request (and without a limit check)
                evicted += 1
                continue
            if state["total"] + state["in_flight_total"] + 1 > s.max_total:
                state["limit_hit"] = True
                return False
            if sent + in_flight_here + 1 > s.max_per_node:
                state["limit_hit"] = True
                return True
            result.sent += 1
            answer = self.admit(pod, now)
            self.outcomes[answer.reason] += 1
            if answer.background:
                self.answers["background"] += 1
                self.cache[name] = Entry(node, now, assumed=True)
            elif answer.allowed:
                self.answers["allowed"] += 1
                if self.on_success is not None:
                    self.on_success(now, node)
            else:
                self.answers["error"] += 1
                passed_over = True
                continue
            evicted += 1
            sent += 1
            state["total"] += 1
            result.started += 1
            result.started_on[node] += 1
            if passed_over:
                self.redirected += 1
                passed_over = False
        return True

    # ---- the soft-tainter ----------------------------------------------------

    def soft_taint(self, now: int = 0) -> bool:
        """PreferNoSchedule: 2 on overutilised nodes, 1 on appropriately utilised ones,
        none on underutilised ones (each change a Node update at ``now``). True if any node's taints changed."""
        c = self.classify_now()
        under, over = set(c.under), set(c.over)
        changed = False
        for n in self.kv.nodes:
            want = 0 if n.name in under else 2 if n.name in over else 1
            if n.soft_taints != want:
                n.soft_taints = want
                self.kv.node_updated(n, now)
                changed = True
        return changed
