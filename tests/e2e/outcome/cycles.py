"""The real descheduler's cycles, read back from its log (``--v 3``) and checked against the simulator's rules.

The run's totals depend on luck (which VMs the descheduler happens to pick); whether each cycle did what the model's
descheduler would have done *in the same state* does not. From the log: every cycle's overutilised nodes in order,
per node how many evictions it started (``Eviction in background assumed``), how many candidates it found already in
flight (``already requested``), how many were refused (``error when evicting pod``), and why it stopped (the
pod evictor's node or total limit, LowNodeUtilization's ``evictionLimits.node``, or no candidate left); and the
in-flight cache as the descheduler's informer and its own answers changed it. A node is consistent with the model
(``app.sim.descheduler``) when its counts respect the three limits with the in-flight entries the cache held when
the cycle started, and it stopped exactly where the model would stop. The lapse of assumed entries is logged only
at ``--v 4``: over a 12-minute run none is old enough to lapse.
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
            block.started += 1
            cache[pod] = where[pod] = block.node
        elif "Eviction in background already requested" in line and block is not None:
            block.cached += 1
        elif "maximum number of evicted pods per node reached" in line and block is not None:
            block.stop = "node_limit"
        elif "maximum number of evicted pods per a descheduling cycle reached" in line and block is not None:
            block.stop = "total_limit"
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
        sent_total = 0
        for b in c.blocks:
            visits += 1
            sent_total += b.started
            problems = []
            if b.started + b.cached > s.eviction_limit_node:
                problems.append("over evictionLimits.node")
            if b.started + b.in_flight > s.max_per_node:
                problems.append("over maxNoOfPodsToEvictPerNode with the in-flight entries")
            if sent_total + c.in_flight_total > s.max_total:
                problems.append("over maxNoOfPodsToEvictTotal with the in-flight entries")
            expected = {
                "node_limit": b.started + b.in_flight == s.max_per_node,
                "total_limit": sent_total + c.in_flight_total == s.max_total,
                "plugin_limit": b.started + b.cached == s.eviction_limit_node,
                "": b.started + b.cached + b.refused == b.removable,
            }[b.stop]
            if not expected:
                problems.append(f"stopped ({b.stop or 'no candidate left'}) where the model would not")
            if problems:
                wrong.append({"cycle": i, "node": b.node, "problems": problems, "started": b.started,
                              "cached": b.cached, "refused": b.refused, "in_flight": b.in_flight,
                              "in_flight_total": c.in_flight_total, "removable": b.removable, "stop": b.stop})
    held = [b for c in cycles for b in c.blocks if b.in_flight]
    return {"cycles": len(cycles), "node_visits": visits, "consistent": visits - len(wrong), "inconsistent": wrong[:5],
            "inconsistent_count": len(wrong),
            # visits of a node with a VM in flight: another VM sent, or the in-flight pod met first (the
            # candidate order among equal pods is Go's map order over the pod index, not a fresh shuffle)
            "with_in_flight": {"visits": len(held), "sent_another": sum(1 for b in held if b.started),
                               "in_flight_pod_first": sum(1 for b in held if b.cached and not b.started),
                               "node_full": sum(1 for b in held if b.stop == "node_limit" and not b.started)}}
