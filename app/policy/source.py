"""Whether a VMI's ``kubevirt.io/eviction-source: descheduler`` still speaks for an evacuation.

Pure: the effect that removes a stale one (``app/effects/source.py``) and the rules that read the annotation
(``decide.is_descheduler_caused`` through the episode, ``nodecool.descheduler_caused``) ask this.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.records import DESCHEDULER_SOURCE, MigrationRecord, VMIRecord
from app.policy.cooldown import relevant_migrations


def stale_eviction_source(vmi: VMIRecord, migrations: Sequence[MigrationRecord]) -> bool:
    """The VMI's ``kubevirt.io/eviction-source: descheduler`` describes no evacuation any more.

    virt-api writes it in the same patch as the mark (``status.evacuationNodeName``), for descheduler evictions
    only, and never clears it; KubeVirt removes it only when a migration of the VM succeeds. After an
    ``evacuate/cancel`` (the guard's or a user's) it stays, and a later evacuation that the descheduler did not
    cause (a user's eviction, an autoscaler's) would look descheduler-caused. It is live while the VMI is marked,
    while a migration of it is in flight or while a VMIM of this incarnation is unfinished (a retry queued before
    a cancel still runs, and its success removes the annotation); otherwise it is stale. ``migrations``: the
    VMI's VMIMs (any incarnation: the older ones are dropped here)."""
    if vmi.eviction_source != DESCHEDULER_SOURCE or vmi.evacuation_node:
        return False
    if vmi.migration is not None and vmi.migration.in_flight:
        return False
    return all(m.finished for m in relevant_migrations(vmi, migrations))
