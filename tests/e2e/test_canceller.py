"""The canceller against KubeVirt's aggregated API, through the real aggregation layer, on a played KubeVirt.

Why played: the state that matters here, a stuck descheduler evacuation on a node with KubeVirt's drain taint beside
a stuck one elsewhere, takes real KubeVirt three failed attempts each (minutes of virt-controller's backoff and
virt-handler's heartbeat) to reach; here the VMIs and their failed VMIMs are written by the test, and the virt-api
stand-in serves ``evacuate/cancel``. Against KubeVirt's own virt-api: the guard's cancel of a stuck evacuation
(tests/e2e/test_real_kubevirt.py), virt-api's 400 on a drain-tainted node and its 401 for an identity without the
chart's second rule (tests/e2e/test_real_side_effects.py).

The session's virt-api stand-in (tests/e2e/virtapi.py, fixture ``virt_api``) serves ``subresources.kubevirt.io/v1``
as an APIService, Available before the guard started. So the guard's probe finds ``virtualmachineinstances/evacuate/
cancel`` in discovery and both SelfSubjectAccessReviews allowed, and turns the canceller on. A stuck
descheduler-caused evacuation is then cancelled by a real ``PUT .../evacuate/cancel``: kube-apiserver authorizes it
(``update virtualmachineinstances/evacuate``, the chart's first rule) and proxies it with its front-proxy client
certificate and ``X-Remote-*`` headers; virt-api's SubjectAccessReview of the guard (``update
virtualmachineinstances/evacuate/cancel``, the chart's second rule) passes, and virt-api's own patch clears the
VMI's mark. A node with KubeVirt's own drain taint is being drained: the guard never asks to cancel there, and
virt-api would refuse it (400), as KubeVirt does.
"""

from __future__ import annotations

import ssl

import httpx
import pytest
from kubernetes import client

from tests.e2e.cluster import eventually
from tests.e2e.objects import migration_state
from tests.e2e.virtapi import DRAIN_TAINT_KEY, GROUP, SERVICE_ACCOUNT
from tests.e2e.virtapi import NAMESPACE as KUBEVIRT_NS

CANCELLER = "kubevirt_eviction_guard_evacuation_canceller_info"
DESCHEDULER = {"kubevirt.io/eviction-source": "descheduler"}


def stuck_vm(cluster, namespace: str, name: str, node: str, target: str):
    """A VM the descheduler's eviction marked, whose three migration attempts failed (KubeVirt retries for ever)."""
    vm = cluster.vm(namespace, name, node, evacuation_node=node, annotations=DESCHEDULER)
    for i in range(3):
        cluster.objects.vmim(namespace, f"{name}-{i}", name, "Failed", evacuation_node=node,
                             priority="system-maintenance",
                             migration=migration_state(node, target, started=9 - 3 * i, ended=8 - 3 * i, failed=True))
    return vm


def cancel_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/v1/namespaces/{namespace}/virtualmachineinstances/{name}/evacuate/cancel"


def put_cancel(cp, token: str, namespace: str, name: str, node: str) -> httpx.Response:
    """The call the guard makes, with another bearer token."""
    trust = ssl.create_default_context(cafile=str(cp.ca_path))
    with httpx.Client(base_url=cp.url, verify=trust, timeout=10) as http:
        return http.put(cancel_path(namespace, name), json={"evacuationNodeName": node},
                        headers={"Authorization": f"Bearer {token}"})


def audited(cp, user: str | None, verb: str, resource: str, namespace: str, name: str, sub: str = "") -> list[dict]:
    return [e for e in cp.audit_events(user) if e["verb"] == verb and e.get("objectRef", {}).get("resource") == resource
            and e["objectRef"].get("subresource", "") == sub and e["objectRef"].get("namespace") == namespace
            and e["objectRef"].get("name") == name]


@pytest.mark.check("canceller through the aggregated api")
def test_stuck_descheduler_evacuation_cancelled_through_virt_api(cluster, guard, installation, control_plane, virt_api,
                                                                 detail):
    cp, user = control_plane, installation.username
    # on, because KubeVirt serves evacuate/cancel and the guard may call it (both asked of the real server)
    eventually(lambda: guard.metric(CANCELLER, enabled="true", reason="enabled") == 1, 10, "the canceller to be on")
    probes = [e for e in cp.audit_events(user) if e.get("objectRef", {}).get("resource") == "selfsubjectaccessreviews"]
    assert len(probes) >= 2 and all(e["responseStatus"]["code"] == 201 for e in probes), probes
    assert any(e["requestURI"] == f"/apis/{GROUP}/v1" and e["responseStatus"]["code"] == 200
               for e in cp.audit_events(user)), "the guard's discovery of subresources.kubevirt.io/v1"

    ns = cluster.fresh_namespace("cancel")
    drained = cluster.fresh_node()  # KubeVirt's drain taint: virt-controller evacuates it, virt-api keeps it so
    cluster.core.patch_node(drained, {"spec": {"taints": [{"key": DRAIN_TAINT_KEY, "effect": "NoSchedule"}]}})
    cluster.sync()  # the guard knows the taint before the VM on that node exists
    node, target = cluster.fresh_node(), cluster.fresh_node()
    stuck = stuck_vm(cluster, ns, "stuck", node, target)
    kept = stuck_vm(cluster, ns, "kept", drained, target)

    # the guard's PUT, through kube-apiserver's authorizer and proxy, to virt-api, which cleared the mark
    vmi = eventually(lambda: (v := cluster.objects.get_vmi(ns, "stuck"))["status"].get("evacuationNodeName") is None
                     and v, 30, "virt-api to clear the VMI's evacuationNodeName")
    # the audit event is written once the response has gone out: a moment after virt-api's patch is visible
    (put,) = eventually(lambda: audited(cp, user, "update", "virtualmachineinstances", ns, "stuck", "evacuate"), 10,
                        "the audit event of the guard's PUT")
    assert put["requestURI"] == cancel_path(ns, "stuck") and put["objectRef"]["apiGroup"] == GROUP
    assert put["annotations"]["authorization.k8s.io/decision"] == "allow", put["annotations"]
    assert f'ClusterRole "{installation.fullname}"' in put["annotations"]["authorization.k8s.io/reason"]
    assert put["responseStatus"]["code"] == 200, put["responseStatus"]
    # virt-api's own review of the guard, and its own patch of the VMI
    (review,) = [r for r in virt_api.reviews_of(user) if r.attributes["namespace"] == ns
                 and r.attributes["name"] == "stuck"]
    assert review.allowed, review
    assert review.attributes == {"namespace": ns, "verb": "update", "group": GROUP, "version": "v1",
                                 "resource": "virtualmachineinstances", "subresource": "evacuate/cancel",
                                 "name": "stuck"}, review.attributes
    assert f"system:serviceaccounts:{installation.namespace}" in review.groups, review.groups
    (request,) = virt_api.requests_of("PUT", f"/{ns}/virtualmachineinstances/stuck/evacuate/cancel")
    assert request.user == user and request.body == {"evacuationNodeName": node} and request.code == 200, request
    (patch,) = audited(cp, virt_api.user, "patch", "virtualmachineinstances", ns, "stuck")
    assert patch["responseStatus"]["code"] == 200
    assert vmi["status"]["nodeName"] == node  # only the mark is gone
    # what the guard tells about it
    (event,) = eventually(lambda: [e for e in cluster.core.list_namespaced_event(ns).items
                                   if e.reason == "EvacuationCancelled" and e.involved_object.name == "stuck"], 15,
                          "the EvacuationCancelled Event")
    assert event.type == "Warning" and f'from node "{node}"' in event.message, event.message
    assert guard.metric("kubevirt_eviction_guard_evacuation_cancels_total", outcome="cancelled", node=node,
                        namespace=ns) == 1

    # KubeVirt's drain taint (kubevirt.io/drain) is a drain: the canceller never asks there. Two of its passes after
    # the one that cancelled "stuck" (the signal its work is done, not a sleep): no PUT for "kept"
    passes = guard.metric("kubevirt_eviction_guard_background_passes_total", loop="canceller")
    eventually(lambda: guard.metric("kubevirt_eviction_guard_background_passes_total", loop="canceller") >= passes + 2,
               15, "two more canceller passes")
    assert audited(cp, user, "update", "virtualmachineinstances", ns, "kept", "evacuate") == []
    assert not [r for r in virt_api.requests_of("PUT") if r.path.endswith(f"/{ns}/virtualmachineinstances/kept/evacuate/cancel")]
    assert cluster.objects.get_vmi(ns, "kept")["status"]["evacuationNodeName"] == drained
    refusal = (f'Node "{drained}" has NodeDrainTaintKey '
               f'"&Taint{{Key:{DRAIN_TAINT_KEY},Value:,Effect:NoSchedule,TimeAdded:<nil>,}}"')
    # ... and the same refusal for the guard's identity asking by hand
    token = cp.service_account_token(installation.namespace, installation.service_account, seconds=600)
    r = put_cancel(cp, token, ns, "kept", drained)
    assert r.status_code == 400 and r.json()["message"] == refusal, r.text

    # the chart's second rule is the one virt-api needs: without it the API server lets the call through and virt-api
    # refuses it (401 with its review's reason); the mark stays
    half = _half_token(cp)
    r = put_cancel(cp, half, ns, "kept", drained)
    assert r.status_code == 401, (r.status_code, r.text)
    (denied,) = [x for x in virt_api.reviews if x.user == "system:serviceaccount:default:half-canceller"]
    assert not denied.allowed and denied.attributes["subresource"] == "evacuate/cancel", denied
    (passed,) = audited(cp, "system:serviceaccount:default:half-canceller", "update", "virtualmachineinstances", ns,
                        "kept", "evacuate")
    assert passed["annotations"]["authorization.k8s.io/decision"] == "allow", passed["annotations"]
    assert cluster.objects.get_vmi(ns, "kept")["status"]["evacuationNodeName"] == drained
    assert not virt_api.errors, virt_api.errors
    cluster.objects.custom.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", "kept")
    detail["detail"] = (
        f"canceller on (discovery of {GROUP}/v1 and 2 SelfSubjectAccessReviews allowed); stuck descheduler "
        f"evacuation {ns}/stuck cancelled: the guard's PUT authorized by kube-apiserver as update "
        f"virtualmachineinstances/evacuate ({put['annotations']['authorization.k8s.io/reason']}), proxied through the "
        f"aggregator (endpoint {virt_api.address}:{virt_api.port}) to virt-api, whose SubjectAccessReview of "
        f"{user} for update virtualmachineinstances/evacuate/cancel was allowed and whose own patch "
        f"({SERVICE_ACCOUNT} in {KUBEVIRT_NS}) cleared status.evacuationNodeName; EvacuationCancelled Event, "
        f"cancels_total{{outcome=cancelled}} 1. A stuck evacuation from a node with {DRAIN_TAINT_KEY}:NoSchedule "
        f"(a drain): never asked by the guard over two canceller passes; asked by hand with its token, refused 400 "
        f"by virt-api ({refusal}), mark kept. An identity with only the first rule: allowed by "
        "kube-apiserver, refused 401 by virt-api's review")


def _half_token(cp) -> str:
    """A ServiceAccount with the chart's first evacuate rule only (what kube-apiserver checks), not the second."""
    api = cp.api_client()
    rbac, core = client.RbacAuthorizationV1Api(api), client.CoreV1Api(api)
    core.create_namespaced_service_account("default", {"metadata": {"name": "half-canceller"}})
    rbac.create_cluster_role({"metadata": {"name": "e2e-half-canceller"}, "rules": [
        {"apiGroups": [GROUP], "resources": ["virtualmachineinstances/evacuate"], "verbs": ["update"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": "e2e-half-canceller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-half-canceller"},
        "subjects": [{"kind": "ServiceAccount", "name": "half-canceller", "namespace": "default"}]})
    return cp.service_account_token("default", "half-canceller", seconds=600)
