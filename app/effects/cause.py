"""The cause recorder: writes ``kubevirt-eviction-guard.io/cause`` (``descheduler`` or ``evacuation``) on each
evacuation VMIM that carries no ``spec.priority``, while the evacuation runs.

Why: on KubeVirt 1.7 and 1.8 defaults (``MigrationPriorityQueue`` off) an evacuation VMIM says only which node it
empties. Who caused it is on the VMI, ``kubevirt.io/eviction-source: descheduler`` beside the mark, and
virt-handler removes both when the migration succeeds: afterwards the descheduler's move and a drain's look the
same to ``report``, ``migrations_total{cause}``, the history annotation and the node cooldowns. The VMIM outlives
that evidence (KubeVirt keeps the last 5 per VMI, the history annotation copies the cause from it), and virt-api's
update admitter lets its annotations change (only the spec and, in flight, the selector label are fixed). What is
written is read from the cluster, never from an AdmissionReview (``app.policy.cause.recorded_evacuation_cause``),
so a forged review cannot make the guard write a cause, and every replica and restart writes the same value.

When: off the request path, on the store's hook when an evacuation VMIM without a cause appears or changes while
unfinished, and for every such VMIM after a relist. How: the job re-checks the store, reads the VMI from the API
server (the store's copy may lag behind the mark), decides, and adds the annotation with a JSON patch of the VMIM
(``patch virtualmachineinstancemigrations``, the chart's RBAC with the history annotation). A VMIM whose VMI is no
longer marked from its node gets nothing: the evidence is gone, and it counts as ``evacuation`` as before.
"""

from __future__ import annotations

import logging
from typing import Any

from app.domain.kinds import VMI, VMIM
from app.domain.records import CAUSE_ANNOTATION, MigrationRecord
from app.effects.annotate import json_pointer_token
from app.effects.kubeapi import EffectsApi, NotFound, read_vmi_afresh
from app.effects.queue import EffectQueue
from app.policy.cause import needs_recorded_cause, recorded_evacuation_cause

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "cause"
APPLIED, NOT_NEEDED, NO_EVIDENCE = "applied", "not_needed", "no_evidence"


def cause_patch(cause: str) -> list[dict[str, Any]]:
    """Evacuation VMIMs always carry annotations (``kubevirt.io/evacuationMigration``), so an ``add`` of the key."""
    return [{"op": "add", "path": f"/metadata/annotations/{json_pointer_token(CAUSE_ANNOTATION)}", "value": cause}]


class CauseJob:
    """Record one evacuation VMIM's cause, if the store still shows it unrecorded and the VMI still shows why."""

    kind = KIND

    def __init__(self, view, api: EffectsApi, namespace: str, vmim: str, vmi: str) -> None:
        self.view, self.api = view, api
        self.namespace, self.vmim, self.vmi = namespace, vmim, vmi
        self.key = (KIND, namespace, vmim)

    def _stored(self) -> MigrationRecord | None:
        return next((m for m in self.view.migrations(self.namespace, self.vmi) if m.name == self.vmim), None)

    def run(self) -> str:
        m = self._stored()
        if m is None or not needs_recorded_cause(m):
            return NOT_NEEDED
        fresh = read_vmi_afresh(self.api, self.namespace, self.vmi)
        if fresh is None:
            return NOT_NEEDED
        vmi, _ = fresh
        cause = recorded_evacuation_cause(m, vmi, self.view.node(m.evacuation_node))
        if cause is None:
            log.info("evacuation cause not recorded: the VMI is no longer marked from the node", extra={
                "namespace": self.namespace, "vmim": self.vmim, "vmi": self.vmi, "node": m.evacuation_node})
            return NO_EVIDENCE
        try:
            self.api.patch_vmim(self.namespace, self.vmim, cause_patch(cause))
        except NotFound:
            return NOT_NEEDED
        log.info("recorded the cause of an evacuation on its VMIM", extra={
            "namespace": self.namespace, "vmim": self.vmim, "vmi": self.vmi, "cause": cause})
        return APPLIED


class CauseRecorder:
    """Queues a ``CauseJob`` for each evacuation VMIM the store shows without a cause while it runs."""

    def __init__(self, view, api: EffectsApi, queue: EffectQueue) -> None:
        self.view, self.api, self.queue = view, api, queue

    def submit(self, m: MigrationRecord) -> bool:
        return self.queue.submit(CauseJob(self.view, self.api, m.namespace, m.name, m.vmi_name))

    def on_change(self, kind: str, old: Any, new: Any) -> None:
        """The store's hook (a watch thread: cheap checks and a queue append only)."""
        if new is None:  # a (re)list replaced the kind: every running evacuation not recorded yet
            if kind in (VMI, VMIM):
                for vmi in self.view.vmis():
                    for m in self.view.migrations(vmi.namespace, vmi.name):
                        if needs_recorded_cause(m):
                            self.submit(m)
            return
        if kind == VMIM and needs_recorded_cause(new):
            self.submit(new)
