"""The canceller's judgement: which evacuations the guard may cancel (``--cancel-stuck-evacuations``).

Pure, like ``decide``: the effect (``app/effects/cancel.py``) and the simulator
ask this and only carry the answer out through KubeVirt's ``evacuate/cancel``.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.domain.records import DRAIN_PRIORITY, VMIRecord
from app.domain.view import ClusterView
from app.policy.cooldown import relevant_migrations
from app.policy.decide import StuckEvacuation, stuck_evacuation
from app.policy.model import PolicySettings


def evacuations_to_cancel(vmis: Iterable[VMIRecord], view: ClusterView, now: float,
                          settings: PolicySettings) -> list[StuckEvacuation]:
    """Every marked VMI whose evacuation is stuck (``stuck_evacuation``: descheduler-caused,
    failing) and safe to cancel: the node being left is known and not being drained
    (cordoned or drain-tainted), and no VMIM of the VMI carries ``system-critical`` (a
    drain's or an admin's evacuation must keep its persistence). Sorted by namespace, name."""
    out = []
    for vmi in vmis:
        if not vmi.evacuation_node:
            continue  # only a mark can be cancelled
        node = view.node(vmi.evacuation_node)
        if node is None or node.draining:
            continue  # never cancel what may be a drain; an unknown node is not known not to be one
        migrations = relevant_migrations(vmi, view.migrations(vmi.namespace, vmi.name))
        if any(m.priority == DRAIN_PRIORITY for m in migrations if not m.finished):
            continue
        stuck = stuck_evacuation(vmi, migrations, node, now, settings)
        if stuck is not None:
            out.append(stuck)
    out.sort(key=lambda s: (s.namespace, s.name))
    return out
