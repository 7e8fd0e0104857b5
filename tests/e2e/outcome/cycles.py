"""The real descheduler's cycles, read back from its log (``--v 3``) and checked against the simulator's rules.

The run's totals depend on luck (which VMs the descheduler happens to pick); whether each cycle did what the model's
descheduler would have done *in the same state* does not. From the log: every cycle's overutilised nodes in order,
per node how many evictions it started (``Eviction in background assumed``), how many candidates it found already in
flight (``already requested``), how many were refused (``error when evicting pod``), and why it stopped (the
pod evictor's node or total limit, LowNodeUtilization's ``evictionLimits.node``, or no candidate left); and the
in-flight cache as the descheduler's informer and its own answers changed it. A node is consistent with the model
(``app.sim.descheduler``) when its counts respect the three limits with the in-flight entries the cache held at each
eviction, and it stopped exactly where the model would stop. The cache as it was at each eviction, not at the
cycle's start: the pod evictor reads it per eviction (``PodEvictor.EvictPod``), and the informer changes it while a
cycle runs (a migration KubeVirt ended in the second the cycle began, whose source pod the descheduler learns of a
few milliseconds into the cycle); the model runs the events of a second before its cycle in that second, so it sees
that entry gone too. The lapse of assumed entries is logged only at ``--v 4``: over a 12-minute run none is old
enough to lapse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.sim.scenario import DeschedulerSettings

_POD = re.compile(r'pod="[^/"]*/([^"]+)"')
_NODE = re.compile(r'node="([^"]+)"')
_REMOVABLE = re.compile(r"removablePods=(\d+)")
_ERROR_POD = re.compile(r'error when evicting pod \(ignoring\) \\"([^\\"]+)\\"')


@dataclass
class NodeBlock:
    node: str
    removable: int = 0
    started: int = 0  # new evictions (answered "in the background", or allowed)
    cached: int = 0  # candidates already in flight: no request
    refused: int = 0
    stop: str = ""  # node_limit (maxNoOfPodsToEvictPerNode), total_limit, plugin_limit (evictionLimits.node), ""
    in_flight: int = 0  # the cache's entries on this node when the cycle started
    # the cache's entries on this node, and in all, just before each eviction the node sent, and when a limit of the
    # pod evictor stopped it (the counts the pod evictor compares with its limits)
    node_at_send: list[int] = field(default_factory=list)
    total_at_send: list[int] = field(default_factory=list)
    node_at_stop: int = 0
    total_at_stop: int = 0
    changed: bool = False  # an entry of another pod on this node came or went between the cycle's start and a send


@dataclass
class Cycle:
    in_flight_total: int = 0
    blocks: list[NodeBlock] = field(default_factory=list)


def parse(log: str) -> list[Cycle]:
    cycles: list[Cycle] = []
    cache: dict[str, str] = {}  # pod -> node
    where: dict[str, str] = {}  # pod -> node, from any line naming it inside a node's block
    block: NodeBlock | None = None
    for line in log.splitlines():
        if "Resetting pod evictor counters" in line:
            cycles.append(Cycle(in_flight_total=len(cache)))
            cycles[-1].start_cache = dict(cache)  # type: ignore[attr-defined]
            block = None
        elif '"Evicting pods from node"' in line and cycles:
            node = _NODE.search(line).group(1)  # type: ignore[union-attr]
            start = cycles[-1].start_cache  # type: ignore[attr-defined]
            block = NodeBlock(node, in_flight=sum(1 for n in start.values() if n == node))
            cycles[-1].blocks.append(block)
        elif '"Pods on node"' in line and block is not None:
            block.removable = int(_REMOVABLE.search(line).group(1))  # type: ignore[union-attr]
        elif '"Eviction in background assumed"' in line and block is not None:
            pod = _POD.search(line).group(1)  # type: ignore[union-attr]
            # the pod itself may be in already: the informer saw KubeVirt's annotation before the answer came
            # (the pod evictor checked its limits before it sent the request)
            others = {k: n for k, n in cache.items() if k != pod}
            on_node = sum(1 for n in others.values() if n == block.node)
            if on_node - block.started != block.in_flight:
                block.changed = True
            block.node_at_send.append(on_node)
            block.total_at_send.append(len(others))
            block.started += 1
            cache[pod] = where[pod] = block.node
        elif "Eviction in background already requested" in line and block is not None:
            block.cached += 1
            pod = _POD.search(line).group(1)  # type: ignore[union-attr]
            if cache.get(pod) == "?":  # an entry the informer added (evicted by someone else): it is on this node
                cache[pod] = where[pod] = block.node
        elif "maximum number of evicted pods per node reached" in line and block is not None:
            block.stop = "node_limit"
            block.node_at_stop = sum(1 for n in cache.values() if n == block.node)
        elif "maximum number of evicted pods per a descheduling cycle reached" in line and block is not None:
            block.stop = "total_limit"
            block.total_at_stop = len(cache)
        elif "Max number of evictions per node per plugin reached" in line and block is not None:
            block.stop = "plugin_limit"
        elif '"eviction failed"' in line and block is not None:
            m = _ERROR_POD.search(line)
            block.refused += 1
            if m:
                where[m.group(1)] = block.node
        elif "Adding pod to the cache" in line or "Updating the cache" in line:
            pod = _POD.search(line).group(1)  # type: ignore[union-attr]
            cache.setdefault(pod, where.get(pod, "?"))
        elif "Removing pod from the cache" in line:
            cache.pop(_POD.search(line).group(1), None)  # type: ignore[union-attr]
    return cycles


def check(cycles: list[Cycle], s: DeschedulerSettings) -> dict:
    """How many node visits the simulator's rules reproduce, and the first that they do not."""
    visits, wrong = 0, []
    for i, c in enumerate(cycles):
        for b in c.blocks:
            visits += 1
            problems = []
            if b.started + b.cached > s.eviction_limit_node:
                problems.append("over evictionLimits.node")
            # the pod evictor sends when the cache's entries (this cycle's own included) + 1 are within the limit
            if any(n + 1 > s.max_per_node for n in b.node_at_send):
                problems.append("over maxNoOfPodsToEvictPerNode with the in-flight entries")
            if any(n + 1 > s.max_total for n in b.total_at_send):
                problems.append("over maxNoOfPodsToEvictTotal with the in-flight entries")
            expected = {
                "node_limit": b.node_at_stop + 1 > s.max_per_node,
                "total_limit": b.total_at_stop + 1 > s.max_total,
                "plugin_limit": b.started + b.cached == s.eviction_limit_node,
                "": b.started + b.cached + b.refused == b.removable,
            }[b.stop]
            if not expected:
                problems.append(f"stopped ({b.stop or 'no candidate left'}) where the model would not")
            if problems:
                wrong.append({"cycle": i, "node": b.node, "problems": problems, "started": b.started,
                              "cached": b.cached, "refused": b.refused, "in_flight": b.in_flight,
                              "in_flight_total": c.in_flight_total, "removable": b.removable, "stop": b.stop,
                              "node_at_send": b.node_at_send, "node_at_stop": b.node_at_stop})
    held = [b for c in cycles for b in c.blocks if b.in_flight]
    return {"cycles": len(cycles), "node_visits": visits, "consistent": visits - len(wrong), "inconsistent": wrong[:5],
            "inconsistent_count": len(wrong),
            # visits where the node's in-flight entries changed while the cycle ran (read at the cycle's start,
            # these would look like a limit broken or stopped short)
            "changed_mid_cycle": sum(1 for c in cycles for b in c.blocks if b.changed),
            # visits of a node with a VM in flight: another VM sent, or the in-flight pod met first (the
            # candidate order among equal pods is Go's map order over the pod index, not a fresh shuffle)
            "with_in_flight": {"visits": len(held), "sent_another": sum(1 for b in held if b.started),
                               "in_flight_pod_first": sum(1 for b in held if b.cached and not b.started),
                               "node_full": sum(1 for b in held if b.stop == "node_limit" and not b.started)}}
