"""What a decision writes, written by the real API server, on a played KubeVirt: dry runs and the
eviction-in-progress patch.

The guard's writes go through the API server with the chart ServiceAccount's token, so each one also passes the
real RBAC authorizer and the real admission chain; the audit log shows who wrote what and what the server answered.

Why played: both need a VM marked for evacuation whose ready pod lacks ``eviction-in-progress``. KubeVirt v1.8's
virt-controller puts the annotation on a marked VM's pod itself as soon as virt-api marks it (and removes it from an
unmarked one), so against real KubeVirt the guard's patch is never needed (tests/e2e/test_real_side_effects.py
shows that, and the Events, against KubeVirt's own virt-api and virt-controller); the patch is for KubeVirt before
1.7, whose virt-controller removed the annotation after a failed attempt while the VM stayed marked. The VMIs, VMIMs
and pods here are written through the API server by the test.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from app.domain.records import EVICTION_IN_PROGRESS, pod_from_object
from app.effects.annotate import APPLIED, AnnotateJob, annotation_patch
from app.effects.kubeapi import Conflict, KubeEffectsApi
from app.effects.queue import Retry
from tests.builders import store_of
from tests.e2e.cluster import eventually

BACKGROUND = 'Evacuation in progress: Eviction triggered evacuation of VMI "{ns}/{vm}"'


def guard_writes(cp, inst, verb: str, resource: str, namespace: str, name: str | None = None) -> list[dict]:
    """The guard's own ``verb`` requests on ``resource`` in ``namespace`` (audit log)."""
    return [e for e in cp.audit_events(inst.username) if e.get("verb") == verb
            and e.get("objectRef", {}).get("resource") == resource and not e["objectRef"].get("subresource")
            and e["objectRef"].get("namespace") == namespace and (name is None or e["objectRef"].get("name") == name)]


def events_of(cluster, namespace: str, vmi: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in cluster.core.list_namespaced_event(namespace).items
            if e.involved_object.name == vmi and e.reason == reason]


@pytest.mark.check("dry-run eviction")
def test_dry_run_evictions_are_judged_and_change_nothing(cluster, guard, installation, detail):
    """Every dry-run shape reaches the guard (``sideEffects: NoneOnDryRun``), gets the real answer, and writes
    nothing: no annotation, no Event, no deletion. The real denial afterwards is the signal that the guard's queue
    has run everything before it."""
    ns = cluster.fresh_namespace("dry")
    node = cluster.fresh_node()
    marked = cluster.vm(ns, "marked", node, evacuation_node=node)
    quiet = cluster.vm(ns, "quiet", cluster.fresh_node())  # not on the marked VM's node: that one is busy
    cluster.sync()
    hook = installation.webhook_name
    expected = (f'admission webhook "{hook}" denied the request: ' + BACKGROUND.format(ns=ns, vm="marked") +
                f': VMI is marked for evacuation from node "{node}", its migration is pending')
    shapes = {
        "client-go deleteOptions.dryRun": lambda pod: cluster.evict(ns, pod, dry_run=True, descheduler=True),
        "kubectl --dry-run=server body": lambda pod: cluster.evict_raw(ns, pod, dry_run=True),
        "?dryRun=All": lambda pod: cluster.evict_raw(ns, pod, query_dry_run=True),
    }
    applied_before = guard.metric("kubevirt_eviction_guard_side_effects_total", kind="annotation", outcome="applied")
    for what, send in shapes.items():
        for vm, code in ((marked, 429), (quiet, 201)):
            n = cluster.evictions_audited(ns, vm.pod_name)
            got, body = send(vm.pod_name)
            assert got == code, (what, got, body)
            if code == 429:
                assert body["message"] == expected, (what, body["message"])
            audit = cluster.audit_of_eviction(ns, vm.pod_name, after=n)
            assert audit["annotations"][f"{hook}/dry-run"] == "true", (what, audit["annotations"])
            assert audit["annotations"][f"{hook}/reason"] == ("evacuation_pending" if code == 429 else "allowed")
    # kubectl drain --dry-run=server goes through the same path (tests/e2e/test_evictions.py)
    pod = cluster.objects.get_pod(ns, marked.pod_name)
    assert EVICTION_IN_PROGRESS not in pod["metadata"]["annotations"]
    assert cluster.objects.get_pod(ns, quiet.pod_name)["metadata"].get("deletionTimestamp") is None
    # the signal: one real denial; its Event and annotation are the first and only ones
    code, _ = cluster.evict(ns, marked.pod_name, descheduler=True)
    assert code == 429
    eventually(lambda: events_of(cluster, ns, "marked", "EvictionBlocked"), 15, "the real denial's Event")
    eventually(lambda: EVICTION_IN_PROGRESS in cluster.objects.get_pod(ns, marked.pod_name)["metadata"]["annotations"],
               15, "the real denial's annotation")
    (event,) = events_of(cluster, ns, "marked", "EvictionBlocked")
    assert event.count == 1, event
    assert not events_of(cluster, ns, "quiet", "EvictionAllowed")  # dry-run allowed: no Event either
    assert guard.metric("kubevirt_eviction_guard_side_effects_total", kind="annotation",
                        outcome="applied") == applied_before + 1
    assert len(guard_writes(cluster.cp, installation, "patch", "pods", ns)) == 1
    detail["detail"] = ("deleteOptions.dryRun (client-go), kubectl's --dry-run=server body and ?dryRun=All: denied "
                        "429 / allowed 201 with dry-run audit annotations; no annotation, Event or deletion until a "
                        "real denial, whose Event has count 1")


@pytest.mark.check("annotation patch")
def test_eviction_in_progress_patch_applied_by_the_api_server(cluster, guard, installation, detail):
    """A rule-7 denial of a marked VM's source pod: the guard reads the VMI from the API server, then JSON-patches
    the pod (``test`` of the resourceVersion it saw, ``add`` of the annotation) with its own token."""
    ns = cluster.fresh_namespace("annot")
    node = cluster.fresh_node()
    vm = cluster.vm(ns, "marked", node, evacuation_node=node)
    rv = vm.pod["metadata"]["resourceVersion"]
    cluster.sync()
    code, body = cluster.evict(ns, vm.pod_name, descheduler=True)
    assert code == 429, body
    pod = eventually(lambda: (p := cluster.objects.get_pod(ns, vm.pod_name))["metadata"]["annotations"].get(
        EVICTION_IN_PROGRESS) and p, 15, "the eviction-in-progress annotation")
    assert pod["metadata"]["annotations"][EVICTION_IN_PROGRESS] == "true"
    assert pod["metadata"]["resourceVersion"] != rv
    (patch,) = guard_writes(cluster.cp, installation, "patch", "pods", ns, vm.pod_name)
    assert patch["responseStatus"]["code"] == 200
    reads = guard_writes(cluster.cp, installation, "get", "virtualmachineinstances", ns, "marked")
    assert reads and reads[-1]["requestReceivedTimestamp"] <= patch["requestReceivedTimestamp"]

    # the resourceVersion test, on the real server: the same patch from a record of an older version is refused
    # (422) and writes nothing; the guard's job then waits for its store instead of patching blindly
    other = cluster.vm(ns, "marked2", node, evacuation_node=node)
    stale = pod_from_object(other.pod)
    cluster.objects.core.patch_namespaced_pod(other.pod_name, ns, {"metadata": {"labels": {"touched": "yes"}}})
    api = KubeEffectsApi(client.ApiClient(_guard_configuration(guard)))
    with pytest.raises(Conflict, match="422"):
        api.patch_pod(ns, other.pod_name, annotation_patch(stale))
    assert EVICTION_IN_PROGRESS not in cluster.objects.get_pod(ns, other.pod_name)["metadata"]["annotations"]
    job = AnnotateJob(store_of(other.vmi, other.pod), api, ns, other.pod_name)
    with pytest.raises(Retry):
        job.run()
    fresh = cluster.objects.get_pod(ns, other.pod_name)
    assert EVICTION_IN_PROGRESS not in fresh["metadata"]["annotations"]
    job = AnnotateJob(store_of(other.vmi, fresh), api, ns, other.pod_name)
    assert job.run() == APPLIED
    assert cluster.objects.get_pod(ns, other.pod_name)["metadata"]["annotations"][EVICTION_IN_PROGRESS] == "true"
    detail["detail"] = ("rule-7 denial -> guard GET vmi, JSON patch (test resourceVersion, add annotation) 200, "
                        "annotation \"true\"; a patch from an older resourceVersion refused 422 and nothing written; "
                        "AnnotateJob retried, then applied from the current version")


def _guard_configuration(guard) -> client.Configuration:
    """The guard's own client configuration (its kubeconfig: the chart ServiceAccount's token)."""
    from app.cluster.kube import kube_configuration

    return kube_configuration(str(guard.kubeconfig))
