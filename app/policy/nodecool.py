"""Node cooldowns : how long a node rests after the descheduler moved a VM off it or onto it.

The state is the node's finished, Succeeded VMIMs (the view's ``moves_from`` /
``moves_to``), so every replica and every restart reads the same numbers. Only
descheduler-caused moves count: the VMIM's ``spec.priority`` is
``system-maintenance`` (KubeVirt >= 1.7 with its ``MigrationPriorityQueue`` gate); a VMIM
without a priority counts when its VMI carries ``kubevirt.io/eviction-source:
descheduler`` and that annotation is not stale (``policy.source``: KubeVirt never
clears it after a cancel). A priority that names another cause (a drain's
``system-critical``, a user's ``user-triggered``) is trusted over the annotation.
Without a priority, the cause the guard recorded on the evacuation VMIM while it ran
(``policy.cause``) counts: KubeVirt removes the VMI's annotation when the move succeeds,
so after the move it is the only evidence left.

The length scales like a VM's cooldown: base = max(floor, duration of the
last move), doubled for each further descheduler move of the node within
``nodeCooldownWindow``, capped at ``maxNodeCooldown``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.records import DESCHEDULER_PRIORITY, DESCHEDULER_SOURCE, MigrationRecord
from app.domain.view import ClusterView
from app.policy.cause import DESCHEDULER, RECORDABLE
from app.policy.cooldown import scaled_cooldown
from app.policy.source import stale_eviction_source

LEFT, ARRIVED = "left", "arrived"


@dataclass(slots=True, frozen=True)
class NodeCooldown:
    node: str
    direction: str  # LEFT (`node_cooldown`) or ARRIVED (`target_node_cooldown`)
    last: MigrationRecord  # the newest descheduler move that set it
    count: int  # descheduler moves of this node, this direction, within the window (at least 1)
    cooldown: float
    remaining: float

    @property
    def active(self) -> bool:
        return self.remaining > 0


def descheduler_caused(m: MigrationRecord, view: ClusterView) -> bool:
    if m.priority:
        return m.priority == DESCHEDULER_PRIORITY
    if m.evacuation_node and m.recorded_cause in RECORDABLE:
        return m.recorded_cause == DESCHEDULER
    vmi = view.vmi(m.namespace, m.vmi_name)
    return (vmi is not None and vmi.eviction_source == DESCHEDULER_SOURCE
            and not stale_eviction_source(vmi, view.migrations(vmi.namespace, vmi.name)))


def node_cooldown(node: str, direction: str, moves: Sequence[MigrationRecord], view: ClusterView, now: float,
                  floor: float, window: float, cap: float) -> NodeCooldown | None:
    """The node's cooldown from ``moves`` (newest end first), or None when off or without a descheduler move."""
    if floor <= 0:
        return None
    ours = [m for m in moves if m.end is not None and m.end <= now and descheduler_caused(m, view)]
    if not ours:
        return None
    last = max(ours, key=lambda m: m.end or 0.0)
    assert last.end is not None
    duration = last.end - last.start if last.start is not None and last.start <= last.end else None
    count = sum(1 for m in ours if m.end is not None and m.end > now - window) if window > 0 else 1
    cooldown = scaled_cooldown(floor, cap, duration, count)
    return NodeCooldown(node, direction, last, max(count, 1), cooldown, last.end + cooldown - now)
