"""The scenario's hardware, for the actor's virt-handler: where a migration's target pod can go, how long its copy
takes and how it ends. Nothing here is KubeVirt's control logic (which migration starts when, retries, limits,
marks: real virt-controller decides those); it is what the nodes, NICs and guests of the scenario would do.

The same physics as the simulator's: the copy's steps are ``app.sim.kubevirt``'s (``advance_copy``, ``copy_end``,
``transient_failure_at``); this module holds the copies under way and the scheduler's pick:

- the scheduler's pick (``choose_target``): a node that fits the VM's memory request, not the source, the least
  allocated (cpu and memory requests) first, ties at random; a VM whose target never schedules (affinity, devices)
  gets none;
- the copy (``Copies``): pre-copy over the source node's NIC, split evenly among the node's copying migrations,
  while the guest dirties pages: with share B and dirty rate D < B the memory left shrinks at B - D; with D >= B
  the first pass (M / B) makes progress and then nothing does; the migration is aborted by virt-launcher's monitor
  at ``completionTimeoutPerGiB`` x memory after the copy began, or ``progressTimeout`` seconds without progress
  (both from the KubeVirt CR, the values the scenario set there); a transient failure strikes with the scenario's
  probability, at a seeded point of the copy. Alone on its NIC, a copy ends when ``app.sim.kubevirt.
  migration_duration`` says (without the target's set-up, which the actor spends before the copy begins).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from random import Random

from app.sim.kubevirt import advance_copy, copy_end, transient_failure_at
from app.sim.model import VM, Node
from app.sim.scenario import KubeVirtSettings


def choose_target(vm: VM, source: str, nodes: list[Node], requests: dict[str, tuple[float, float]],
                  rng: Random) -> Node | None:
    """``requests``: per node, the (cpu, memory) its live launcher pods request (the VM's vCPUs / the allocation
    ratio, its memory), as the scheduler's cache holds them."""
    if vm.target_unschedulable:
        return None
    best: list[Node] = []
    best_key = None
    for n in nodes:
        cpu, mem = requests.get(n.name, (0.0, 0.0))
        if n.name == source or mem + vm.memory > n.memory:
            continue
        key = round((1 - cpu / n.cpu) + (1 - mem / n.memory), 9)
        if best_key is None or key > best_key:
            best, best_key = [n], key
        elif key == best_key:
            best.append(n)
    if not best:
        return None
    return best[0] if len(best) == 1 else rng.choice(best)


@dataclass
class Copy:
    vm: VM
    source: str
    target: str
    start: float
    remaining: float
    first_pass: float
    updated: float
    share: float = 0.0
    stalled_since: float | None = None
    fail_at: float | None = None
    end_at: float = math.inf
    why: str = ""


class Copies:
    """The copies under way, by the migration's uid; times are seconds of the run."""

    def __init__(self, settings: KubeVirtSettings, nodes: list[Node], rng: Random) -> None:
        self.s = settings
        self.nodes = {n.name: n for n in nodes}
        self.rng = rng
        self.copies: dict[str, Copy] = {}

    def network(self, node: str) -> float:
        n = self.nodes.get(node)
        return self.s.network if n is None or n.network is None else n.network

    def failure_probability(self, vm: VM, source: str) -> float:
        if vm.failure_probability is not None:
            return vm.failure_probability
        n = self.nodes.get(source)
        return self.s.failure_probability if n is None or n.failure_probability is None else n.failure_probability

    def start(self, uid: str, vm: VM, source: str, target: str, now: float) -> None:
        c = Copy(vm, source, target, now, vm.memory, vm.memory, now)
        if self.rng.random() < self.failure_probability(vm, source):
            c.fail_at = transient_failure_at(vm, self.network(source), now, self.rng)
        self.copies[uid] = c
        self._reshare(source, now)

    def outcome(self, uid: str, now: float) -> tuple[bool, str] | None:
        """(failed, why) once the copy has ended at ``now``, else None."""
        c = self.copies.get(uid)
        if c is None or now < c.end_at:
            return None
        return bool(c.why), c.why

    def stop(self, uid: str, now: float) -> None:
        c = self.copies.pop(uid, None)
        if c is not None:
            self._reshare(c.source, now)

    def active(self) -> list[Copy]:
        return list(self.copies.values())

    def _reshare(self, source: str, now: float) -> None:
        active = [c for c in self.copies.values() if c.source == source]
        if not active:
            return
        share = self.network(source) / len(active)
        for c in active:
            advance_copy(c, c.vm.dirty_rate, now)
            c.share = share
            self._plan(c, now)

    def _plan(self, c: Copy, now: float) -> None:
        c.end_at, c.why = copy_end(c, c.start, c.vm, c.fail_at, self.s, now)


class Hardware:
    """The scenario's machines for the actor (``node.Nodes.hardware``): the VMs by VMI name, the target's start-up
    time, the scheduler's pick and the copies. ``seed``: the scenario's; the pick's ties and the failures each draw
    from their own stream."""

    def __init__(self, settings: KubeVirtSettings, nodes: list[Node], vms: list[VM], seed: int) -> None:
        self.s = settings
        self.nodes = nodes
        self.vms = {vm.name: vm for vm in vms}
        self.setup = float(settings.setup_seconds)
        self._ties = Random(f"{seed}:scheduler")
        self.copies = Copies(settings, nodes, Random(f"{seed}:failures"))

    def vm(self, name: str) -> VM:
        return self.vms[name]

    def requests(self, vmi_name: str) -> tuple[float, float]:
        vm = self.vms.get(vmi_name)
        return (0.0, 0.0) if vm is None else (vm.vcpus / self.s.cpu_allocation_ratio, vm.memory)

    def choose(self, vmi_name: str, source: str, requests: dict[str, tuple[float, float]]) -> str | None:
        vm = self.vms.get(vmi_name)
        if vm is None:
            return None
        n = choose_target(vm, source, self.nodes, requests, self._ties)
        return None if n is None else n.name
