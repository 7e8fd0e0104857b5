"""What policy may ask of the cluster, and how far the answers can be trusted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from app.domain.records import KubeVirtRecord, LauncherPod, MigrationRecord, NodeRecord, VMIRecord


@dataclass(slots=True, frozen=True)
class CacheHealth:
    """Which kinds of cluster state cannot be trusted right now."""

    not_synced: frozenset[str] = frozenset()  # never listed yet: readiness false
    stale: frozenset[str] = frozenset()  # watch broken for longer than the threshold

    @property
    def ready(self) -> bool:
        return not self.not_synced


HEALTHY = CacheHealth()


class ClusterView(Protocol):
    """The questions policy asks of the cluster (ClusterStore answers them)."""

    def pod(self, namespace: str, name: str) -> LauncherPod | None: ...

    def vmi(self, namespace: str, name: str) -> VMIRecord | None: ...

    def node(self, name: str) -> NodeRecord | None: ...

    def migrations(self, namespace: str, vmi_name: str) -> Sequence[MigrationRecord]: ...

    def unfinished_migration(self, uid: str) -> MigrationRecord | None: ...

    def leaving_candidates(self, node: str) -> Sequence[VMIRecord]: ...

    def moves_from(self, node: str) -> Sequence[MigrationRecord]:
        """Succeeded VMIMs that moved a VM away from ``node``, newest end first (a bounded recent few)."""
        ...

    def moves_to(self, node: str) -> Sequence[MigrationRecord]:
        """Succeeded VMIMs that moved a VM onto ``node``, newest end first (a bounded recent few)."""
        ...

    def kubevirt(self) -> KubeVirtRecord | None:
        """The KubeVirt CR's settings; None when unknown (not readable, not listed yet): rules fail open."""
        ...
