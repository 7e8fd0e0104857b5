"""The counter of finished migrations, by cause (``app/policy/cause.py``: the VMIM's ``spec.priority`` where
KubeVirt sets one, else the guard's own record of an evacuation's cause, else the annotations KubeVirt writes).

``migrations_total{cause,outcome}`` counts VMIMs *as this process sees them
finish*: a VMIM the store held unfinished that arrives Succeeded or Failed (by a
watch event, or by a relist after a broken watch). VMIMs already final when first
seen, as at start-up, are not counted: they finished before this process was
watching (a counter must not jump on every restart; ``rate()`` and ``increase()``
over replicas and restarts stay right). Each VMIM uid counts once per process.
The guard records an evacuation's cause while it runs, so the VMIM carries it when it finishes.
"""

from __future__ import annotations

from collections import OrderedDict

from app.domain.records import MigrationRecord
from app.metrics import Metrics
from app.policy.cause import cause_of

MAX_REMEMBERED = 100_000  # uids already counted; a VMIM finishes once, this only guards odd replays


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
