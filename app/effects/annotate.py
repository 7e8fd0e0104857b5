"""The ``descheduler.alpha.kubernetes.io/eviction-in-progress`` annotation.

Since v1.7 KubeVirt's virt-controller reconciles this annotation to exactly
"the VMI is marked for evacuation" (``status.evacuationNodeName`` set), with
value ``"true"``, on the ready source pod only (kubevirt-facts.md). The guard
adds it early, when it has just told the descheduler "eviction running in the
background" (`migration_in_progress` and `evacuation_pending`), so the descheduler sees the eviction as in
progress without waiting for virt-controller's next reconcile. It writes only
what virt-controller would write itself, so the two never disagree:

- value ``"true"``;
- only while the VMI is marked for evacuation from the pod's node: for an
  unmarked VMI the guard writes nothing, so it can never re-add an
  annotation virt-controller removed when the mark was cleared;
- only on the VMI's current source pod: on the VMI's node
  (``status.nodeName``), not the target of an unfinished migration, Ready.

It never removes it: KubeVirt owns removal, and a guard that removed it would
fight the controller.

Before v1.7 virt-controller wrote ``"kubevirt"`` and removed the annotation
after a failed migration while the VMI stayed marked. The guard then re-adds
``"true"`` on the next denied eviction of that pod (the VMI is still marked,
so the state justifies it), which keeps the descheduler counting the VM as in
flight while KubeVirt's evacuation controller retries: that is the v1.7
behaviour, and what stops the descheduler from evicting a second VM from the
node (docs/operations.md, "The eviction-in-progress annotation").

Trust: the AdmissionReview only names the pod. When the job runs, it re-reads
pod, VMI and migrations from the store and writes only if *they* justify the
annotation, so neither a forged AdmissionReview nor a decision that has gone
stale in the queue can make the guard write something untrue.

The store's pods and VMIs come from two independent watches, so the store can
hold the pod after virt-controller removed the annotation and the VMI from
before its mark was cleared. A write then would re-add what virt-controller
just removed. So before patching, the job reads the VMI itself from the API
server (one GET, only for the rare pod that still lacks the annotation) and
writes only if the live VMI still justifies it.

JSON patch cannot test for a key's absence, so the patch tests
``/metadata/resourceVersion`` against the version the store last saw: if the
pod changed since, the API server rejects the patch (422) and the job
re-checks from the store once the store has caught up, instead of retrying the
same write blindly.
"""

from __future__ import annotations

import logging
from typing import Any

from app.domain.records import EVICTION_IN_PROGRESS, LauncherPod, RecordError, VMIRecord, vmi_from_object
from app.domain.view import ClusterView
from app.effects.kubeapi import Conflict, EffectsApi, NotFound
from app.effects.queue import Later, Retry
from app.policy.decide import is_vm_pod
from app.policy.model import Decision

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "annotation"
APPLIED, NOT_NEEDED = "applied", "not_needed"
STORE_WAITS = 2  # retries spent waiting for the store after a conflict before patching again


def json_pointer_token(key: str) -> str:
    """RFC 6901 escaping of one JSON-pointer token (``/`` in annotation keys)."""
    return key.replace("~", "~0").replace("/", "~1")


def annotation_patch(pod: LauncherPod) -> list[dict[str, Any]]:
    """The JSON patch: test the resourceVersion the store saw, then add the annotation
    (or the whole annotations map when the pod has none: ``add`` needs the parent)."""
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}
    if pod.has_annotations:
        add = {"op": "add", "path": f"/metadata/annotations/{json_pointer_token(EVICTION_IN_PROGRESS)}", "value": "true"}
    else:
        add = {"op": "add", "path": "/metadata/annotations", "value": {EVICTION_IN_PROGRESS: "true"}}
    return [test, add]


def why_not(pod: LauncherPod | None, vmi: VMIRecord | None, view: ClusterView | None = None) -> str:
    """"" when the cluster state justifies adding the annotation (what virt-controller >= 1.7
    would write itself), else why not. ``view``: also refuse targets of unfinished migrations."""
    if pod is None or not is_vm_pod(pod):
        return "pod is gone or not a running virt-launcher pod"
    if pod.eviction_in_progress:
        return "pod already has the annotation"
    if vmi is None:
        return "VMI not found"
    if not vmi.evacuation_node:
        return "VMI is not marked for evacuation"
    if vmi.evacuation_node != pod.node:
        return f"VMI is marked for evacuation from {vmi.evacuation_node}, not from the pod's node {pod.node or '-'}"
    if vmi.node != pod.node:
        return f"pod is not the source pod: the VMI runs on {vmi.node or '-'}, the pod on {pod.node or '-'}"
    if view is not None and pod.migration_job_uid and view.unfinished_migration(pod.migration_job_uid) is not None:
        return "pod is the target of an unfinished migration"
    if not pod.ready:
        return "pod is not ready"
    if not pod.resource_version:
        return "pod has no resourceVersion to guard the patch with"
    return ""


def wanted(decision: Decision) -> bool:
    """Cheap pre-check on the request path: a `migration_in_progress` or `evacuation_pending` denial whose records (read from
    the store by policy) justify the annotation. The job re-checks when it runs."""
    return decision.denied and decision.background and not decision.dry_run and not why_not(decision.pod, decision.vmi)


class AnnotateJob:
    """Add the annotation to one pod, if the store (not the request) still justifies it."""

    kind = KIND

    def __init__(self, view: ClusterView, api: EffectsApi, namespace: str, name: str) -> None:
        self.view = view
        self.api = api
        self.namespace = namespace
        self.name = name
        self.key = (KIND, namespace, name)
        self.conflicted_version = ""  # the resourceVersion a patch was refused at
        self.waits = 0  # attempts spent waiting for the store to move past it

    def run(self) -> str:
        pod = self.view.pod(self.namespace, self.name)
        vmi = self.view.vmi(pod.namespace, pod.vmi_name) if pod is not None else None
        reason = why_not(pod, vmi, self.view)
        if reason:
            log.debug("annotation not needed", extra={"namespace": self.namespace, "pod": self.name, "why": reason})
            return NOT_NEEDED
        assert pod is not None and vmi is not None
        if pod.resource_version == self.conflicted_version and self.waits < STORE_WAITS:
            # The API server has a newer pod than the store: give the watch time to catch up.
            # If it brings nothing new (the conflict was the API server's own), try again:
            # the ``test`` op keeps a repeated patch from writing over anything.
            self.waits += 1
            raise Later(f"pod changed after resourceVersion {pod.resource_version}; waiting for the store")
        try:
            live = self.api.read_vmi(vmi.namespace, vmi.name)
            reason = why_not(pod, vmi_from_object(live), self.view) if live is not None else ""
        except NotFound:
            reason = "VMI is gone"
        except RecordError:
            reason = "the API server's VMI is unreadable"
        if reason:
            log.debug("annotation not needed (the store was behind)",
                      extra={"namespace": self.namespace, "pod": self.name, "why": reason})
            return NOT_NEEDED
        try:
            self.api.patch_pod(pod.namespace, pod.name, annotation_patch(pod))
        except Conflict:
            self.conflicted_version, self.waits = pod.resource_version, 0
            raise Retry(f"pod changed after resourceVersion {pod.resource_version}; re-checking from the store") from None
        except NotFound:
            return NOT_NEEDED
        log.info("annotated pod eviction-in-progress", extra={
            "namespace": pod.namespace, "pod": pod.name, "vmi": vmi.name, "node": pod.node,
            "resource_version": pod.resource_version,
        })
        return APPLIED
