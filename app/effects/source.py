"""The stale-source cleaner: removes ``kubevirt.io/eviction-source: descheduler`` from a VMI once it speaks for no
evacuation (``app.policy.source.stale_eviction_source``).

Why: KubeVirt's virt-api writes the annotation with the mark when it admits a descheduler eviction and never
clears it; only a successful migration removes it (virt-handler's ``ackMigrationCompletion``). After an
``evacuate/cancel``, the guard's canceller's or a user's, it stays. A later evacuation the descheduler did not
cause (a user's eviction, an autoscaler's) then looks descheduler-caused: to the guard (its failed attempts make
it "stuck" for `evacuation_stuck` and the canceller, which would cancel it) and to KubeVirt itself (with its
``MigrationPriorityQueue`` gate the evacuation controller gives the new VMIM the descheduler's priority). The
guard cannot tell the two evacuations apart later from the VMI alone, so it removes the annotation as soon as it
is stale: the VMI is not marked, nothing of it is migrating, every VMIM of it is finished. What it writes lives
in the VMI, so every replica and every restart reads the same; two replicas may both try, the second finds
nothing to do or is refused by the ``test`` of the resourceVersion.

When: off the request path, on the store's hook (a VMI changed, a VMIM of it finished) and after each relist of
VMIs or VMIMs. How: the job re-checks against the store, reads the VMI from the API server, re-checks it, and
sends a JSON patch that tests ``/metadata/resourceVersion`` and the annotation's value, then removes it; a
refused patch is retried from a new read. The chart's ``patch virtualmachineinstances`` (the history
annotation's) is the only right it needs.
"""

from __future__ import annotations

import logging
from typing import Any

from app.domain.kinds import VMI, VMIM
from app.domain.records import DESCHEDULER_SOURCE, EVICTION_SOURCE
from app.effects.annotate import json_pointer_token
from app.effects.history import HistoryView
from app.effects.kubeapi import Conflict, EffectsApi, NotFound, read_vmi_afresh
from app.effects.queue import EffectQueue, Retry
from app.policy.source import stale_eviction_source

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "eviction_source"
APPLIED, NOT_NEEDED = "applied", "not_needed"


def source_patch(resource_version: str) -> list[dict[str, Any]]:
    path = f"/metadata/annotations/{json_pointer_token(EVICTION_SOURCE)}"
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "test", "path": path, "value": DESCHEDULER_SOURCE},
            {"op": "remove", "path": path}]


class StaleSourceJob:
    """Remove one VMI's stale eviction-source annotation, if the store and then the API server say it is stale."""

    kind = KIND

    def __init__(self, view: HistoryView, api: EffectsApi, namespace: str, name: str) -> None:
        self.view, self.api, self.namespace, self.name = view, api, namespace, name
        self.key = (KIND, namespace, name)

    def run(self) -> str:
        stored = self.view.vmi(self.namespace, self.name)
        migrations = self.view.migrations(self.namespace, self.name)
        if stored is None or not stale_eviction_source(stored, migrations):
            return NOT_NEEDED
        read = read_vmi_afresh(self.api, self.namespace, self.name)
        if read is None:
            return NOT_NEEDED
        fresh, obj = read
        resource_version = (obj.get("metadata") or {}).get("resourceVersion")
        if (fresh.uid != stored.uid or not isinstance(resource_version, str) or not resource_version
                or not stale_eviction_source(fresh, migrations)):
            return NOT_NEEDED  # marked again (or migrating) since the store's version, or another incarnation
        try:
            self.api.patch_vmi(self.namespace, self.name, source_patch(resource_version))
        except Conflict:
            raise Retry(f"VMI changed after resourceVersion {resource_version}; reading it again") from None
        except NotFound:
            return NOT_NEEDED
        log.info("removed a stale eviction-source annotation from VMI", extra={
            "namespace": self.namespace, "vmi": self.name, "resource_version": resource_version})
        return APPLIED


class StaleSourceCleaner:
    """Queues a ``StaleSourceJob`` for each VMI the store shows with a stale annotation."""

    def __init__(self, view: HistoryView, api: EffectsApi, queue: EffectQueue) -> None:
        self.view, self.api, self.queue = view, api, queue

    def submit(self, namespace: str, name: str) -> bool:
        return self.queue.submit(StaleSourceJob(self.view, self.api, namespace, name))

    def _check(self, namespace: str, name: str) -> None:
        vmi = self.view.vmi(namespace, name)
        if vmi is not None and stale_eviction_source(vmi, self.view.migrations(namespace, name)):
            self.submit(namespace, name)

    def on_change(self, kind: str, old: Any, new: Any) -> None:
        """The store's hook (a watch thread: cheap checks and a queue append only)."""
        if new is None:  # a (re)list replaced the kind: look at every annotated VMI (few carry it)
            if kind in (VMI, VMIM):
                for vmi in self.view.vmis():
                    if vmi.eviction_source == DESCHEDULER_SOURCE:
                        self._check(vmi.namespace, vmi.name)
            return
        if kind == VMI:
            if new.eviction_source == DESCHEDULER_SOURCE:
                self._check(new.namespace, new.name)
        elif kind == VMIM and new.finished and (old is None or not old.finished):
            self._check(new.namespace, new.vmi_name)
