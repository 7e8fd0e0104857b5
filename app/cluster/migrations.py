"""Why a VM moved, and the counter of finished migrations.

KubeVirt with its MigrationPriorityQueue feature gate (GA in 1.9; in 1.7 and 1.8 off
unless enabled) gives every VMIM a ``spec.priority`` that says who asked for it, and
keeps it on finished VMIMs (the 5 most recent per VMI), so the cause of each recent
migration can be read back from the API at any time:

- ``system-maintenance``: an evacuation whose VMI carried
  ``kubevirt.io/eviction-source: descheduler``, i.e. the descheduler;
- ``system-critical``: any other evacuation, i.e. a drain (kubectl drain, a
  maintenance operator, cluster-autoscaler) or another eviction;
- ``user-triggered``: a VMIM a user created (``virtctl migrate``).

The annotations refine it: ``kubevirt.io/workloadUpdateMigration`` marks the
workload updater's migrations (KubeVirt upgrades); ``kubevirt.io/evacuationMigration``
names the node an evacuation empties, which is all there is without the gate (KubeVirt 1.8's
default): a descheduler's evacuation then counts as ``evacuation``.

``migrations_total{cause,outcome}`` counts VMIMs *as this process sees them
finish*: a VMIM the store held unfinished that arrives Succeeded or Failed (by a
watch event, or by a relist after a broken watch). VMIMs already final when first
seen, as at start-up, are not counted: they finished before this process was
watching (a counter must not jump on every restart; ``rate()`` and ``increase()``
over replicas and restarts stay right). Each VMIM uid counts once per process.
"""

from __future__ import annotations

from collections import OrderedDict

from app.domain.records import MigrationRecord
from app.metrics import Metrics

DESCHEDULER, DRAIN, USER, WORKLOAD_UPDATE, UNKNOWN = "descheduler", "evacuation", "user", "workload-update", "unknown"
BY_PRIORITY = {"system-maintenance": DESCHEDULER, "system-critical": DRAIN, "user-triggered": USER}
MAX_REMEMBERED = 100_000  # uids already counted; a VMIM finishes once, this only guards odd replays


def cause_of(m: MigrationRecord) -> str:
    """One word for who moved the VM: descheduler | evacuation | user | workload-update | unknown."""
    if m.workload_update:
        return WORKLOAD_UPDATE
    if m.priority in BY_PRIORITY:
        return BY_PRIORITY[m.priority]
    if m.evacuation_node:  # no priority (gate off): an evacuation; descheduler or drain cannot be told apart
        return DRAIN
    return UNKNOWN


def describe_cause(m: MigrationRecord) -> str:
    """The cause with its evidence, for people: "descheduler (system-maintenance, evacuating node-a)"."""
    evidence = [e for e in (
        m.priority,
        f"evacuating {m.evacuation_node}" if m.evacuation_node else "",
        "workload update" if m.workload_update else "",
    ) if e]
    return cause_of(m) + (f" ({', '.join(evidence)})" if evidence else "")


class MigrationCounter:
    """The store's hook: called with each VMIM it saw turn final."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._counted: OrderedDict[str, None] = OrderedDict()

    def __call__(self, m: MigrationRecord) -> None:
        if m.uid:
            if m.uid in self._counted:
                return
            self._counted[m.uid] = None
            while len(self._counted) > MAX_REMEMBERED:
                self._counted.popitem(last=False)
        self.metrics.migrations.labels(cause_of(m), m.phase.lower()).inc()
