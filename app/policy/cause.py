"""Who caused a migration: one word per VMIM, read the same way by ``report``, ``explain``,
``migrations_total{cause}``, the history annotation and the node cooldowns (``node_cooldown``,
``target_node_cooldown``).

The evidence, strongest first:

- ``spec.priority`` (KubeVirt 1.9; 1.7 and 1.8 with the ``MigrationPriorityQueue`` gate), kept on
  finished VMIMs: ``system-maintenance`` the descheduler, ``system-critical`` any other evacuation
  (a drain, an admin's eviction), ``user-triggered`` a VMIM a user created;
- ``kubevirt.io/workloadUpdateMigration``: the workload updater (KubeVirt upgrades);
- the guard's own ``kubevirt-eviction-guard.io/cause`` on an evacuation VMIM (``recorded_evacuation_cause``
  below, written by ``app/effects/cause.py`` while the evacuation runs): without a priority (KubeVirt 1.7
  and 1.8 defaults) nothing else tells the descheduler's evacuation from a drain's once it ended, because
  virt-handler removes ``kubevirt.io/eviction-source`` from the VMI when the migration succeeds;
- ``kubevirt.io/evacuationMigration`` alone: an evacuation whose cause was not recorded;
- none of these: a VMIM created through the API (``virtctl migrate``, a user's manifest).
"""

from __future__ import annotations

from app.domain.history import CAUSES
from app.domain.records import DESCHEDULER_SOURCE, MigrationRecord, NodeRecord, VMIRecord

DESCHEDULER, DRAIN, USER, WORKLOAD_UPDATE, UNKNOWN = CAUSES
BY_PRIORITY = {"system-maintenance": DESCHEDULER, "system-critical": DRAIN, "user-triggered": USER}
RECORDABLE = (DESCHEDULER, DRAIN)  # the values the guard writes; anything else in the annotation is ignored


def cause_of(m: MigrationRecord) -> str:
    """One word for who moved the VM: descheduler | evacuation | user | workload-update | unknown."""
    if m.workload_update:
        return WORKLOAD_UPDATE
    if m.priority:
        return BY_PRIORITY.get(m.priority, UNKNOWN)
    if m.evacuation_node:
        return m.recorded_cause if m.recorded_cause in RECORDABLE else DRAIN
    return USER  # no priority, no annotation KubeVirt's controllers write: created through the API


def describe_cause(m: MigrationRecord) -> str:
    """The cause with its evidence, for people: "descheduler (recorded by the guard, evacuating node-a)"."""
    evidence = [e for e in (
        m.priority,
        "recorded by the guard" if not m.priority and m.evacuation_node and m.recorded_cause in RECORDABLE else "",
        f"evacuating {m.evacuation_node}" if m.evacuation_node else "",
        "workload update" if m.workload_update else "",
        "created through the API" if cause_of(m) == USER and not m.priority else "",
    ) if e]
    return cause_of(m) + (f" ({', '.join(evidence)})" if evidence else "")


def needs_recorded_cause(m: MigrationRecord) -> bool:
    """An evacuation VMIM whose cause only the guard can keep: no priority, not recorded yet, still running
    (the evidence, the VMI's mark and eviction source, goes when the migration succeeds)."""
    return (bool(m.evacuation_node) and not m.priority and not m.workload_update and not m.finished
            and m.recorded_cause not in RECORDABLE)


def recorded_evacuation_cause(m: MigrationRecord, vmi: VMIRecord | None, node: NodeRecord | None) -> str | None:
    """What to record on the evacuation VMIM ``m``, from the VMI as read now; None while the evidence is gone.

    virt-api writes ``kubevirt.io/eviction-source: descheduler`` in the same patch as the mark
    (``status.evacuationNodeName``) when it admits a descheduler eviction, and nothing for other evictions;
    virt-handler removes both in the one update that completes the migration. So while the VMI is still marked
    from the node this VMIM evacuates, the annotation's presence says who caused it. A node being drained is a
    drain's whatever the annotation says (one left behind by a cancelled descheduler evacuation is stale)."""
    if vmi is None or not m.evacuation_node or vmi.evacuation_node != m.evacuation_node:
        return None
    if node is not None and node.draining:
        return DRAIN
    return DESCHEDULER if vmi.eviction_source == DESCHEDULER_SOURCE else DRAIN
