"""Small simulated clusters for the simulator's unit tests."""

from __future__ import annotations

import heapq
from random import Random

from app.cluster.store import ClusterStore
from app.sim.kubevirt import KubeVirt
from app.sim.model import VM, Node, Steady
from app.sim.scenario import KubeVirtSettings

# a 0.5 GiB/s NIC per node: a 4 GiB VM alone takes 10 s setup + 8 s copy
S = KubeVirtSettings(network=0.5, setup_seconds=10, completion_timeout_per_gib=150, progress_timeout=150)


class Clock:
    """A minimal event queue driving KubeVirt's timers the way the engine does."""

    def __init__(self) -> None:
        self.queue: list = []
        self.seq = 0
        self.now = 0

    def schedule(self, at, fn, args) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at, self.seq, fn, args))

    def run_until(self, end: int) -> None:
        while self.queue and self.queue[0][0] <= end:
            at, _, fn, args = heapq.heappop(self.queue)
            self.now = at
            fn(at, *args)
        self.now = max(self.now, end)


def cluster(nodes: int, vms_per_node: int, settings=S, memory=4.0, dirty_mib=0.0, node_memory=64.0):
    """``nodes`` nodes n0.. with ``vms_per_node`` VMs each (vm00.. in node order)."""
    ns = [Node(index=i, name=f"n{i}", cpu=16, memory=node_memory) for i in range(nodes)]
    vms = [VM(index=i, name=f"vm{i:02d}", group="g", vcpus=2, memory=memory, dirty_rate=dirty_mib / 1024,
              cpu_load=Steady(0.5), memory_load=Steady(0.5)) for i in range(nodes * vms_per_node)]
    placement = [i // vms_per_node for i in range(len(vms))]
    clock = Clock()
    store = ClusterStore()
    kv = KubeVirt(settings, ns, vms, placement, store, Random("test"), clock.schedule, Random("heartbeat"),
                  Random("order"))
    return kv, clock, store


def descheduler(kv, admit=None, pre_filter=None, seed="d", **settings):
    from app.sim.descheduler import Descheduler
    from app.sim.scenario import DeschedulerSettings

    return Descheduler(
        DeschedulerSettings(**settings), kv,
        admit or (lambda pod, now: kv.admit_eviction(pod.name, now, True)),
        pre_filter or (lambda pod, now: None),
        Random(seed),
    )
