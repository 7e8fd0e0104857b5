"""The discrete-event loop: one simulated cluster, one guard mode, one seed.

Time advances from event to event (load samples, descheduler cycles and
sweeps, migration ends, retry timers, drain retries), never second by second,
so a day of a 300-VM cluster is a few thousand events plus one pass over the
VMs per load sample. All times are whole seconds; events at the same second run
in a fixed order (samples, scenario events, KubeVirt, descheduler), then first
scheduled first. Randomness comes from ``random.Random`` streams seeded from the
scenario's seed and a stream name, so the same seed gives the same run, and the
workload (load walks, placement) is identical in every mode.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random

from app.cluster.store import ClusterStore
from app.sim.descheduler import CycleResult, Descheduler, node_scores, pressure
from app.sim.guards import ACTUATION, AUTOSCALER, CANCEL_INTERVAL, KUBECTL, Mode, guard_settings_for, parse_mode
from app.sim.kubevirt import KubeVirt, MigrationRun
from app.sim.model import TAINT_AUTOSCALER, VM, Node
from app.sim.prometheus import ModelledPrometheus
from app.sim.recording import ActuationPriority
from app.sim.scenario import Event, Scenario, guard_settings

PRIO_SAMPLE, PRIO_EVENT, PRIO_KUBEVIRT, PRIO_DESCHEDULER = 0, 1, 2, 3
DRAIN_RETRY = {"cordon": 5, "autoscaler": 10}  # kubectl drain retries every 5 s, cluster-autoscaler every 10 s


@dataclass
class Drain:
    node: str
    start: int
    how: str
    vms_at_start: int = 0
    done: int | None = None
    answers: Counter = field(default_factory=Counter)


@dataclass
class RunData:
    """Everything a run observed; ``metrics.summarize`` turns it into numbers."""

    mode: str
    duration: int
    vm_count: int
    sample_interval: int
    interval: int
    node_names: list[str]
    runs: list[MigrationRun] = field(default_factory=list)
    sample_times: list[int] = field(default_factory=list)
    score_std: list[float] = field(default_factory=list)  # across schedulable nodes, score points
    cpu_std: list[float] = field(default_factory=list)  # fraction of capacity
    node_cpu: list[list[float]] = field(default_factory=list)  # per node, per sample
    node_scores: list[dict[str, int]] = field(default_factory=list)  # per sample: schedulable node -> score
    high: float = 10.0  # the descheduler's threshold above the mean (points)
    drains: list[Drain] = field(default_factory=list)
    descheduler_outcomes: Counter = field(default_factory=Counter)
    answers: Counter = field(default_factory=Counter)
    lapsed: int = 0
    cached_hits: int = 0
    redirected: int = 0
    stall_seconds: int = 0
    stall_by_vm: Counter = field(default_factory=Counter)  # stall seconds each failing VM held a cache entry through
    longest_stall_seconds: int = 0  # the longest unbroken run of stalled cycles
    stall_by_node: Counter = field(default_factory=Counter)  # seconds each hot node was held by a failing leaver
    blocked_seconds: int = 0
    descheduler_cycles: int = 0
    active_cycles: int = 0
    concurrent_evacuations: int = 0
    max_leaving_per_node: int = 0
    policy_calls: int = 0
    evacuations_cancelled: int = 0


def node_load(kv: KubeVirt, now: int, overhead: float) -> list[tuple[float, float, float, float]]:
    """(CPU use, memory use, CPU pressure, memory pressure) per node at ``now``: the VMs where they run, and each
    copying migration's extra load (``overhead`` cores on both ends, the guest's memory on the target)."""
    n = len(kv.nodes)
    cpu = [0.0] * n
    mem = [0.0] * n
    for vmi in kv.vmis:
        vm = vmi.vm
        i = vmi.node.index
        cpu[i] += vm.vcpus * vm.cpu_load.value(now)
        mem[i] += vm.memory * vm.memory_load.value(now)
    for m in kv.running:
        if m.source is not None and m.target is not None and m.copy_start is not None:
            cpu[m.source.index] += overhead
            cpu[m.target.index] += overhead
            mem[m.target.index] += m.vmi.vm.memory * m.vmi.vm.memory_load.value(now)
    dims = []
    for node in kv.nodes:
        cd = cpu[node.index] / node.cpu
        md = mem[node.index] / node.memory
        dims.append((min(1.0, cd), min(1.0, md), pressure(cd), pressure(md)))
    return dims


def initial_placement(nodes: list[Node], vms: list[VM], rng: Random) -> list[int]:
    """Where the VMs start: the scheduler's least-allocated node (memory requests) for
    each VM, the VMs in a seeded random order so that load classes mix on nodes."""
    order = list(range(len(vms)))
    rng.shuffle(order)
    used = [0.0] * len(nodes)
    placement = [0] * len(vms)
    for i in order:
        vm = vms[i]
        fits = [n for n in nodes if used[n.index] + vm.memory <= n.memory]
        if not fits:
            raise ValueError(f"VM {vm.name} ({vm.memory} GiB) fits on no node: the scenario's cluster is too small")
        best = min(fits, key=lambda n: (used[n.index] / n.memory, n.index))
        used[best.index] += vm.memory
        placement[i] = best.index
    return placement


class Simulation:
    """``draw`` > 0 re-seeds the streams of chance that are not the workload (the descheduler's candidate order,
    KubeVirt's failures and target ties): the same cluster and load, another roll of the dice."""

    def __init__(self, scenario: Scenario, mode: str, hours: float | None = None,
                 guard_overrides: dict | None = None, draw: int = 0, cycle_times: list[int] | None = None) -> None:
        self.sc = scenario
        # the descheduler's cycles at these seconds instead of firstRun + k x interval (a real run's, as it logged
        # them: the model then sees the states the real descheduler saw)
        self.cycle_times = None if cycle_times is None else sorted(cycle_times)
        spec = parse_mode(mode)
        self.duration = int((hours if hours is not None else scenario.hours) * 3600)
        # each run gets its own copy: profiles carry random-walk state
        self.nodes: list[Node] = copy.deepcopy(scenario.nodes)
        self.vms: list[VM] = copy.deepcopy(scenario.vms)
        seed = scenario.seed
        self.load_rng = Random(f"{seed}:load")
        self._queue: list = []
        self._seq = 0
        self._stall_run = 0  # seconds of the current unbroken stall
        self.now = 0
        self.store = ClusterStore()
        placement = scenario.placement or initial_placement(self.nodes, self.vms, Random(f"{seed}:placement"))
        chance = f"{seed}" if draw == 0 else f"{seed}:draw{draw}"
        kubevirt = dataclasses.replace(scenario.kubevirt, **dict(spec.baseline.kubevirt))
        self.kv = KubeVirt(kubevirt, self.nodes, self.vms, placement, self.store, Random(f"{chance}:kubevirt"),
                           self._kubevirt_schedule, Random(f"{chance}:heartbeat"),
                           Random(f"{chance}:evacuation-order"))
        if scenario.history_hook is not None:
            scenario.history_hook(self.kv)
        guard = None
        if spec.guard is not None:
            guard = guard_settings(guard_settings_for(spec, scenario.guard_raw, guard_overrides or {}),
                                   f"mode {mode}")
        prometheus = ModelledPrometheus(seed, scenario.sample_interval) if spec.steering else None
        self.mode = Mode(spec, self.kv, scenario.plugin, guard, prometheus)
        if scenario.history_hook is not None:
            self.mode.descheduler_restarted(0)  # a descheduler that starts now: plugin history from kept VMIMs
        ds = scenario.descheduler
        if spec.baseline.eviction_limit_node is not None:
            ds = dataclasses.replace(ds, eviction_limit_node=spec.baseline.eviction_limit_node)
        if spec.baseline.max_per_node is not None:
            ds = dataclasses.replace(ds, max_per_node=spec.baseline.max_per_node)
        self.ds = ds
        self.desched = Descheduler(ds, self.kv, self.mode.admit, self.mode.pre_filter, Random(f"{chance}:descheduler"))
        # the descheduler's query: the profile's score, or the operator's actuation priority
        self.actuation = ActuationPriority() if spec.baseline.query == ACTUATION else None
        if self.actuation is not None:
            self.desched.on_success = self.actuation.success
            self.desched.count_background = spec.baseline.count_background
            self.desched.clock = lambda: self.now
        self._cycle_generation = 0
        self.data = RunData(
            mode=mode, duration=self.duration, vm_count=len(self.vms), sample_interval=scenario.sample_interval,
            interval=ds.interval, node_names=[n.name for n in self.nodes], node_cpu=[[] for _ in self.nodes],
            high=ds.high,
        )

    # ---- the event queue -----------------------------------------------------

    def schedule(self, at: int, prio: int, fn: Callable, args: tuple = ()) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, prio, self._seq, fn, args))

    def _kubevirt_schedule(self, at: int, fn: Callable, args: tuple) -> None:
        self.schedule(at, PRIO_KUBEVIRT, fn, args)

    def run(self) -> RunData:
        ds = self.ds
        self.schedule(0, PRIO_SAMPLE, self.sample)
        if self.cycle_times is None:
            self.schedule(ds.first_run, PRIO_DESCHEDULER, self.descheduler_cycle, (0,))
        else:
            for t in self.cycle_times:
                self.schedule(t, PRIO_DESCHEDULER, self.descheduler_cycle, (0, False))
        self.schedule(ds.sweep_interval, PRIO_DESCHEDULER, self.descheduler_sweep)
        self.schedule(ds.first_run, PRIO_DESCHEDULER, self.soft_tainter)
        for e in self.sc.events:
            self.schedule(e.at, PRIO_EVENT, self.scenario_event, (e,))
        if self.mode.canceller is not None:
            self.schedule(CANCEL_INTERVAL, PRIO_KUBEVIRT, self.cancel_stuck)
        queue, end = self._queue, self.duration
        while queue and queue[0][0] <= end:
            at, _, _, fn, args = heapq.heappop(queue)
            self.now = at
            fn(at, *args)
        return self.finish()

    def finish(self) -> RunData:
        d = self.data
        d.runs = list(self.kv.finished) + self.kv.running_runs()
        d.descheduler_outcomes = Counter(self.desched.outcomes)
        d.answers = Counter(self.desched.answers)
        d.lapsed = self.desched.lapsed
        d.cached_hits = self.desched.cached_hits
        d.redirected = self.desched.redirected
        d.descheduler_cycles = self.desched.cycles
        d.active_cycles = self.desched.active_cycles
        d.concurrent_evacuations = self.kv.concurrent_evacuations
        d.max_leaving_per_node = self.kv.max_leaving_per_node
        d.policy_calls = self.mode.policy_calls
        d.evacuations_cancelled = self.mode.canceller.cancelled if self.mode.canceller is not None else 0
        return d

    # ---- recurring events ----------------------------------------------------

    def sample(self, now: int) -> None:
        """Load at this instant: node use (with migrations' extra load on both ends), the
        profile's utilisation number per node, and the spread the metrics report."""
        rng = self.load_rng
        for vm in self.vms:
            vm.cpu_load.tick(rng, now)
            vm.memory_load.tick(rng, now)
        dims = node_load(self.kv, now, self.sc.kubevirt.migration_cpu_overhead)
        cpu_use = [d[0] for d in dims]
        scores = node_scores(dims)
        read = scores if self.actuation is None else self.actuation.record(now, self.data.node_names, dims)
        self.desched.scores = dict(zip(self.data.node_names, read))
        if self.mode.prometheus is not None:
            self.mode.prometheus.record(now, self.nodes, self.kv.vmis, dims, scores)
        self._record(now, cpu_use, scores)
        self.kv.try_start(now)  # pending migrations whose target was full are retried
        if now + self.sc.sample_interval <= self.duration:
            self.schedule(now + self.sc.sample_interval, PRIO_SAMPLE, self.sample)

    def _record(self, now: int, cpu_use: list[float], scores: list[int]) -> None:
        d = self.data
        d.sample_times.append(now)
        for i, u in enumerate(cpu_use):
            d.node_cpu[i].append(u)
        live = [i for i, node in enumerate(self.nodes) if not node.cordoned and not node.no_schedule]
        d.cpu_std.append(_pstdev([cpu_use[i] for i in live]))
        d.score_std.append(_pstdev([float(scores[i]) for i in live]))
        d.node_scores.append({self.nodes[i].name: scores[i] for i in live})

    def descheduler_cycle(self, now: int, generation: int, again: bool = True) -> None:
        if generation != self._cycle_generation:
            return  # a restart replaced this schedule
        result = self.desched.cycle(now)
        self._account_stall(now, result)
        if again:
            self.schedule(now + self.ds.interval, PRIO_DESCHEDULER, self.descheduler_cycle, (generation,))

    def _account_stall(self, now: int, result: CycleResult) -> None:
        """Stall: an overutilised node, no new eviction, the limits full of in-flight
        entries, and one of them a VM whose evacuation keeps failing. Per node: an
        overutilised node that is not being drained, from which the cycle started no
        eviction while a descheduler-caused evacuation of it had failed at least once
        (the stall stays local to that node when the rest of the cluster moves on)."""
        span = min(self.ds.interval, self.duration - now)
        if result.classification.act:
            for name in result.classification.over:
                node = self.kv.node_by_name[name]
                if result.started_on[name] or node.cordoned or node.no_schedule:
                    continue
                if any(v.failures_since_success > 0 for v in self.kv.descheduler_leavers(name)):
                    self.data.stall_by_node[name] += span
        if not result.blocked_by_in_flight:
            self._stall_run = 0
            return
        self.data.blocked_seconds += span
        pods = self.kv.pods
        stuck = {pods[name].vmi.name for name in self.desched.cache
                 if name in pods and pods[name].vmi.failures_since_success > 0}
        if stuck:
            self.data.stall_seconds += span
            for vm in stuck:
                self.data.stall_by_vm[vm] += span
            self._stall_run += span
            self.data.longest_stall_seconds = max(self.data.longest_stall_seconds, self._stall_run)
        else:
            self._stall_run = 0

    def cancel_stuck(self, now: int) -> None:
        assert self.mode.canceller is not None
        self.mode.canceller.run(now)
        self.schedule(now + CANCEL_INTERVAL, PRIO_KUBEVIRT, self.cancel_stuck)

    def descheduler_sweep(self, now: int) -> None:
        self.desched.sweep(now)
        self.schedule(now + self.ds.sweep_interval, PRIO_DESCHEDULER, self.descheduler_sweep)

    def soft_tainter(self, now: int) -> None:
        if self.desched.soft_taint(now):
            self.kv.try_start(now)
        self.schedule(now + self.ds.soft_tainter_interval, PRIO_DESCHEDULER, self.soft_tainter)

    # ---- scenario events -----------------------------------------------------

    def restart_descheduler(self, now: int) -> None:
        """A new descheduler process: empty cache refilled by its informer's list, the
        plugin's history re-seeded, and a cycle at once."""
        self.desched.restart(now)
        self.mode.descheduler_restarted(now)
        self._cycle_generation += 1
        self.schedule(now, PRIO_DESCHEDULER, self.descheduler_cycle, (self._cycle_generation,))

    def scenario_event(self, now: int, e: Event) -> None:
        if e.kind == "deschedulerRestart":
            self.restart_descheduler(now)
        elif e.kind == "drain":
            node = self.kv.node_by_name[e.node]
            if e.how == "autoscaler":
                self.kv.set_no_schedule(node, TAINT_AUTOSCALER, now)
            else:
                self.kv.set_cordoned(node, True, now)
            drain = Drain(node=e.node, start=now, how=e.how,
                          vms_at_start=sum(1 for v in self.kv.vmis if v.node is node))
            self.data.drains.append(drain)
            self.drain_tick(now, drain, e)

    def drain_tick(self, now: int, drain: Drain, e: Event) -> None:
        """Evict every pod left on the node; retry refusals (kubectl every 5 s, the
        autoscaler every 10 s)."""
        pods = list(self.kv.pods_on[drain.node].values())
        if not pods:
            drain.done = now
            if e.uncordon_after:
                self.schedule(now + e.uncordon_after, PRIO_EVENT, self._undrain, (drain,))
            return
        client = AUTOSCALER if drain.how == "autoscaler" else KUBECTL
        for pod in pods:
            if pod.name in self.kv.pods:  # an earlier eviction in this pass may have changed things
                drain.answers[self.mode.admit(pod, now, client).reason] += 1
        self.schedule(now + DRAIN_RETRY[drain.how], PRIO_EVENT, self.drain_tick, (drain, e))

    def _undrain(self, now: int, drain: Drain) -> None:
        node = self.kv.node_by_name[drain.node]
        if drain.how == "autoscaler":
            self.kv.set_no_schedule(node, "", now)
        else:
            self.kv.set_cordoned(node, False, now)


def _pstdev(xs: list[float]) -> float:
    if not xs:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def simulate(scenario: Scenario, mode: str, hours: float | None = None, guard_overrides: dict | None = None,
             draw: int = 0, cycle_times: list[int] | None = None) -> RunData:
    return Simulation(scenario, mode, hours, guard_overrides, draw, cycle_times).run()
