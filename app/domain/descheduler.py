"""The KubeDescheduler (operator.openshift.io/v1, the OpenShift descheduler operator's CR) as the guard reads it.

What matters to the guard is how many VMs the descheduler lets leave one node at once, and whether it
runs evictions in the background. The operator decides both from the CR (cluster-kube-descheduler-operator,
``setEvictionsLimits`` and ``hasKubeVirtRelieveAndMigrateProfile``, June 2026):

- for the KubeVirt profiles it sets ``maxNoOfPodsToEvictPerNode: 2`` and ``maxNoOfPodsToEvictTotal: 5``, and
  puts ``evictionLimits.node: 2`` into LowNodeUtilization's own args;
- ``spec.evictionLimits.node``, when set, replaces ``maxNoOfPodsToEvictPerNode`` and LowNodeUtilization's
  ``evictionLimits.node`` alike; ``spec.evictionLimits.total`` replaces the total;
- background evictions are on with a KubeVirt profile or ``profileCustomizations.devEnableEvictionsInBackground``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KIND = "KubeDescheduler"
# the profiles for which the operator turns EvictionsInBackground on by itself, and which carry the
# KubevirtMigrationAware evictor plugin (DevKubeVirtRelieveAndMigrate: deprecated in 4.20, same profile)
KUBEVIRT_PROFILES = ("KubeVirtRelieveAndMigrate", "DevKubeVirtRelieveAndMigrate")
# the operator's limits for those profiles when spec.evictionLimits leaves them unset
# (KubeVirt's parallelMigrationsPerCluster and parallelOutboundMigrationsPerNode defaults)
KUBEVIRT_LIMIT_TOTAL, KUBEVIRT_LIMIT_NODE = 5, 2
NODE_LIMIT_FROM_SPEC = "spec.evictionLimits.node (maxNoOfPodsToEvictPerNode and LowNodeUtilization's evictionLimits.node)"
NODE_LIMIT_FROM_PROFILE = ("the profile's default (maxNoOfPodsToEvictPerNode 2 and LowNodeUtilization's "
                           "evictionLimits.node 2)")


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class DeschedulerRecord:
    namespace: str
    name: str
    profiles: tuple[str, ...] = ()
    mode: str = "Predictive"  # the CRD's default: evict nothing
    interval_seconds: int | None = None
    eviction_limit_node: int | None = None  # None: no per-node limit
    eviction_limit_node_from: str = ""  # where that limit comes from (NODE_LIMIT_FROM_*)
    eviction_limit_total: int | None = None
    background_by: str = ""  # "profile", "flag", "profile+flag" or "" (off)
    migration_cooldown: str = ""  # the plugin's tuning as written ("" = the plugin's default)
    max_migration_cooldown: str = ""
    migration_history_window: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def kubevirt_profile(self) -> bool:
        return any(p in KUBEVIRT_PROFILES for p in self.profiles)


def descheduler_from_object(obj: Any) -> DeschedulerRecord:
    """The CR's settings as the operator applies them; a malformed field reads as unset."""
    meta = _d(_d(obj).get("metadata"))
    spec = _d(_d(obj).get("spec"))
    raw_profiles = spec.get("profiles")
    profiles = tuple(p for p in raw_profiles if isinstance(p, str)) if isinstance(raw_profiles, list) else ()
    custom = _d(spec.get("profileCustomizations"))
    kubevirt = any(p in KUBEVIRT_PROFILES for p in profiles)
    limits = _d(spec.get("evictionLimits"))
    node, total = _int(limits.get("node")), _int(limits.get("total"))
    node_from = NODE_LIMIT_FROM_SPEC if node is not None else ""
    if node is None and kubevirt:
        node, node_from = KUBEVIRT_LIMIT_NODE, NODE_LIMIT_FROM_PROFILE
    if total is None and kubevirt:
        total = KUBEVIRT_LIMIT_TOTAL
    by = (["profile"] if kubevirt else []) + (["flag"] if custom.get("devEnableEvictionsInBackground") is True else [])
    mode = spec.get("mode")

    def text(value: Any) -> str:
        return value if isinstance(value, str) else ""

    return DeschedulerRecord(
        namespace=text(meta.get("namespace")), name=text(meta.get("name")), profiles=profiles,
        mode=mode if isinstance(mode, str) and mode else "Predictive",
        interval_seconds=_int(spec.get("deschedulingIntervalSeconds")),
        eviction_limit_node=node, eviction_limit_node_from=node_from, eviction_limit_total=total,
        background_by="+".join(by),
        migration_cooldown=text(custom.get("devMigrationCooldown")),
        max_migration_cooldown=text(custom.get("devMaxMigrationCooldown")),
        migration_history_window=text(custom.get("devMigrationHistoryWindow")),
    )


def node_limit_mismatch(descheduler: DeschedulerRecord | None, outbound_per_node: int | None) -> bool | None:
    """True when the descheduler lets more VMs leave a node per cycle than KubeVirt migrates from a node at
    once (the rest wait in KubeVirt's queue, marked); no per-node limit is no limit. None when either side
    is unknown."""
    if descheduler is None or outbound_per_node is None:
        return None
    return descheduler.eviction_limit_node is None or descheduler.eviction_limit_node > outbound_per_node
