"""The cluster-wide settings both views show: the KubeVirt CR's migration limits, the descheduler's node
limit, and the warnings that follow from them (by their upstream names, so they can be looked up)."""

from __future__ import annotations

from typing import Any

from app.cluster.store import ClusterStore
from app.domain.descheduler import node_limit_mismatch
from app.policy.decide import HeldNode, fix_for, held_node
from app.policy.model import PolicySettings
from app.timefmt import format_duration

MAX_NAMED = 5


def kubevirt_fields(store: ClusterStore) -> dict[str, Any]:
    """The KubeVirt CR's settings the guard reads, with KubeVirt's defaults where it leaves them unset
    (``defaulted`` names those); all None when no KubeVirt CR is known (not in the snapshot, or not readable)."""
    kv = store.kubevirt()
    if kv is None:
        return {"object": None, "parallelOutboundMigrationsPerNode": None, "parallelMigrationsPerCluster": None,
                "evictionStrategy": None, "defaulted": []}
    defaulted = [name for name, value in (("parallelOutboundMigrationsPerNode", kv.parallel_outbound_per_node),
                                          ("parallelMigrationsPerCluster", kv.parallel_per_cluster),
                                          ("evictionStrategy", kv.eviction_strategy or None)) if value is None]
    return {"object": f"{kv.namespace}/{kv.name}" if kv.namespace else kv.name,
            "parallelOutboundMigrationsPerNode": kv.effective_outbound_per_node,
            "parallelMigrationsPerCluster": kv.effective_per_cluster,
            "evictionStrategy": kv.effective_eviction_strategy, "defaulted": defaulted}


def descheduler_fields(store: ClusterStore) -> dict[str, Any]:
    """The KubeDescheduler's limits as the operator applies them; all None when it is not known."""
    d = store.descheduler()
    if d is None:
        return {"object": None, "profiles": [], "evictionLimitNode": None, "evictionLimitNodeFrom": None,
                "evictionLimitTotal": None, "backgroundEvictions": None}
    return {"object": f"{d.namespace}/{d.name}", "profiles": list(d.profiles),
            "evictionLimitNode": d.eviction_limit_node, "evictionLimitNodeFrom": d.eviction_limit_node_from or None,
            "evictionLimitTotal": d.eviction_limit_total,
            "backgroundEvictions": "enabled" if d.background_by else "disabled"}


def held_nodes(store: ClusterStore, now: float, settings: PolicySettings) -> list[HeldNode]:
    return [h for n in sorted(store.nodes(), key=lambda n: n.name)
            if (h := held_node(n, store, now, settings)) is not None]


def named(items: list[str]) -> str:
    return ", ".join(items[:MAX_NAMED]) + (", ..." if len(items) > MAX_NAMED else "")


def cluster_warnings(store: ClusterStore, now: float, settings: PolicySettings,
                     pinned: list[str]) -> list[dict[str, str]]:
    """What the cluster-wide settings and the held nodes say, as ``{"reason", "message"}``."""
    out = []
    kv, d = store.kubevirt(), store.descheduler()
    outbound = kv.effective_outbound_per_node if kv is not None else None
    if node_limit_mismatch(d, outbound):
        assert d is not None and kv is not None
        limit = "no per-node limit" if d.eviction_limit_node is None else (
            f"evictionLimits.node {d.eviction_limit_node}, from {d.eviction_limit_node_from}")
        out.append({"reason": "descheduler_node_limit_above_kubevirt", "message": (
            f"the descheduler lets more VMs leave a node per cycle ({limit}) than KubeVirt migrates from a node at "
            f"once (parallelOutboundMigrationsPerNode {outbound}): the rest wait marked in KubeVirt's queue. "
            f"Set spec.evictionLimits.node in KubeDescheduler {d.namespace}/{d.name} to {outbound}")})
    budget = settings.pending_evacuations_per_node
    if outbound is not None and budget > outbound:
        out.append({"reason": "guard_budget_above_kubevirt", "message": (
            f"pendingEvacuationsPerNode {budget} lets more VMs leave a node than KubeVirt migrates from it at once "
            f"(parallelOutboundMigrationsPerNode {outbound})")})
    for h in held_nodes(store, now, settings):
        holders = "; ".join(f"{x.ref}" + (f" ({x.state})" if x.state else "") + f": {fix_for(x)}" for x in h.holders)
        out.append({"reason": "node_held", "message": (
            f'node "{h.node}" has been held for {format_duration(h.held_for)} (longer than evacuationStaleAfter '
            f"{format_duration(settings.evacuation_stale_after)}): the descheduler cannot relieve it while {holders}")})
    if pinned:
        out.append({"reason": "pinned", "message": (
            f"{len(pinned)} VM(s) pinned to their node by the launcher pod's kubernetes.io/hostname nodeSelector or "
            f"required node affinity ({named(pinned)}): the descheduler's node-fit check skips them, so balancing "
            "leaves them where they are")})
    return out
