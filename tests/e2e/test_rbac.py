"""The chart's RBAC, judged by the real authorizer: the guard's own calls allowed, nothing more.

The guard runs with a token of the chart's ServiceAccount, so the API server's audit log holds every request its
code made in this session, each with the authorizer's decision. Three questions, answered from data, not from the
chart's text:

1. Every request the guard made was allowed (a rule the chart lacks shows up as a ``forbid``).
2. Every kind of call the guard's code makes (``GUARD_CALLS``, each with the code that makes it) was made here, so
   (1) covered it; and a SubjectAccessReview of each says allowed.
3. Every verb the chart grants is one of those calls (``get`` beside ``list`` counts as used: a list reveals the
   same), and what the guard must never do is refused (``FORBIDDEN``, by SubjectAccessReview).

The guard's own calls are those made with its token (the audit event's ``credential-id``), not every request of its
ServiceAccount: the admission-policy check sends forbidden requests with another token of the same account.

KubeVirt's ``evacuate/cancel`` is a PUT on ``.../virtualmachineinstances/NAME/evacuate/cancel`` in the aggregated
group ``subresources.kubevirt.io`` (served here by the virt-api stand-in, tests/e2e/virtapi.py). The API server's
request-info resolver (k8s.io/apiserver ``pkg/endpoints/request/requestinfo.go``) takes the resource, the name, and
the first segment after the name as the subresource: PUT -> verb ``update``, resource ``virtualmachineinstances``,
subresource ``evacuate``; ``cancel`` is not part of its authorization (virt-api's own SubjectAccessReview names it:
tests/e2e/test_canceller.py). The check reads exactly that from the audit event of the guard's own cancel call, and
shows that the same call by an identity without the rule is refused before it reaches virt-api.

Discovery of a group/version (``GET /apis/GROUP/VERSION``) is a non-resource request: the audit event has no
``objectRef``, RBAC grants it to every authenticated user (``system:discovery``); ``GUARD_DISCOVERY`` lists those
the guard makes.
"""

from __future__ import annotations

import ssl

import httpx
import pytest
from kubernetes import client

from app.domain.records import EVICTION_IN_PROGRESS
from tests.e2e.cluster import eventually
from tests.e2e.objects import migration_state

DESCHEDULER_NS = "openshift-kube-descheduler-operator"  # the chart's deschedulerCheck.namespace default

# (verb, group, resource, subresource, namespaced): the calls the guard's code makes, and where.
GUARD_CALLS = {
    ("list", "kubevirt.io", "virtualmachineinstances", "", False): "app/cluster/informer.py SPECS[VMI] (list)",
    ("watch", "kubevirt.io", "virtualmachineinstances", "", False): "app/cluster/informer.py SPECS[VMI] (watch)",
    ("list", "kubevirt.io", "virtualmachineinstancemigrations", "", False): "app/cluster/informer.py SPECS[VMIM]",
    ("watch", "kubevirt.io", "virtualmachineinstancemigrations", "", False): "app/cluster/informer.py SPECS[VMIM]",
    ("list", "", "pods", "", False): "app/cluster/informer.py SPECS[POD] (launcher label selector)",
    ("watch", "", "pods", "", False): "app/cluster/informer.py SPECS[POD]",
    ("list", "", "nodes", "", False): "app/cluster/informer.py SPECS[NODE]",
    ("watch", "", "nodes", "", False): "app/cluster/informer.py SPECS[NODE]",
    ("get", "kubevirt.io", "virtualmachineinstances", "", True): "app/effects/kubeapi.py read_vmi (annotate, history)",
    ("patch", "", "pods", "", True): "app/effects/annotate.py eviction-in-progress",
    ("patch", "kubevirt.io", "virtualmachineinstances", "", True): "app/effects/history.py migration history",
    ("patch", "kubevirt.io", "virtualmachineinstancemigrations", "", True): "app/effects/cause.py evacuation cause",
    ("create", "", "events", "", True): "app/effects/events.py EvictionBlocked/EvictionAllowed",
    ("patch", "", "events", "", True): "app/effects/events.py aggregation (count)",
    ("update", "subresources.kubevirt.io", "virtualmachineinstances", "evacuate", True):
        "app/effects/kubeapi.py cancel_evacuation (PUT .../evacuate/cancel)",
    ("list", "operator.openshift.io", "kubedeschedulers", "", True): "app/cluster/descheduler.py (list)",
    ("watch", "operator.openshift.io", "kubedeschedulers", "", True): "app/cluster/descheduler.py (watch)",
    ("list", "kubevirt.io", "kubevirts", "", False): "app/cluster/informer.py SPECS[KUBEVIRT] (list)",
    ("watch", "kubevirt.io", "kubevirts", "", False): "app/cluster/informer.py SPECS[KUBEVIRT] (watch)",
    ("create", "authorization.k8s.io", "selfsubjectaccessreviews", "", False):
        "app/effects/kubeapi.py allowed (the canceller's probe: may it call evacuate/cancel)",
    ("get", "", "configmaps", "", True): "app/metricsource/discovery.py discover (the descheduler's policy, by name)",
}

# (verb, group, resource, subresource): what KubeVirt's virt-api asks the API server, by SubjectAccessReview, about the
# guard's own calls to it before it serves them (virt-api rest/authorizer.go: the whole path after the name).
VIRT_API_REVIEWS = {
    ("update", "subresources.kubevirt.io", "virtualmachineinstances", "evacuate/cancel"):
        "virt-api's review of the guard's PUT .../evacuate/cancel",
}

# (verb, path): the guard's non-resource requests (discovery), and where.
GUARD_DISCOVERY = {
    ("get", "/apis/subresources.kubevirt.io/v1"): "app/effects/kubeapi.py serves (the canceller's probe)",
    ("get", "/apis/operator.openshift.io/v1"): "app/cluster/descheduler.py (is KubeDescheduler served)",
}

# (verb, group, resource, subresource, namespace or None for cluster-wide): what the guard must never be allowed.
FORBIDDEN = [
    ("delete", "", "pods", "", None), ("delete", "", "pods", "", "vms"), ("update", "", "pods", "", "vms"),
    ("create", "", "pods", "", "vms"), ("create", "", "pods", "eviction", "vms"),
    ("get", "", "secrets", "", None), ("list", "", "secrets", "", None), ("get", "", "secrets", "", "OWN"),
    ("list", "", "secrets", "", "OWN"), ("watch", "", "secrets", "", "OWN"),
    ("get", "", "configmaps", "", "vms"), ("list", "", "configmaps", "", "kube-system"),  # the policy: by name only
    ("patch", "", "nodes", "", None), ("update", "", "nodes", "", None), ("delete", "", "nodes", "", None),
    ("update", "", "nodes", "status", None),
    ("update", "kubevirt.io", "virtualmachineinstances", "", "vms"),
    ("delete", "kubevirt.io", "virtualmachineinstances", "", "vms"),
    ("create", "kubevirt.io", "virtualmachineinstancemigrations", "", "vms"),
    ("delete", "kubevirt.io", "virtualmachineinstancemigrations", "", "vms"),
    ("update", "subresources.kubevirt.io", "virtualmachineinstances", "migrate", "vms"),
    ("update", "subresources.kubevirt.io", "virtualmachines", "stop", "vms"),
    ("patch", "kubevirt.io", "kubevirts", "", "kubevirt"),
    ("update", "operator.openshift.io", "kubedeschedulers", "", DESCHEDULER_NS),
    ("delete", "", "events", "", "vms"), ("patch", "", "configmaps", "", "OWN"),
    ("create", "", "serviceaccounts", "token", "OWN"), ("impersonate", "", "users", "", None),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", None),
    ("escalate", "rbac.authorization.k8s.io", "clusterroles", "", None),
    ("bind", "rbac.authorization.k8s.io", "clusterroles", "", None),
    ("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", None),
    ("delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", None),
]


def sar(api: client.ApiClient, user: str, groups: list[str], verb: str, group: str, resource: str, sub: str,
        namespace: str | None, name: str | None = None) -> client.V1SubjectAccessReviewStatus:
    attrs = client.V1ResourceAttributes(verb=verb, group=group, resource=resource, subresource=sub or None,
                                        namespace=namespace, name=name)
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=groups, resource_attributes=attrs))
    return client.AuthorizationV1Api(api).create_subject_access_review(review).status


def non_resource_sar(api: client.ApiClient, user: str, groups: list[str], verb: str,
                     path: str) -> client.V1SubjectAccessReviewStatus:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=groups, non_resource_attributes=client.V1NonResourceAttributes(verb=verb, path=path)))
    return client.AuthorizationV1Api(api).create_subject_access_review(review).status


def key_of(ev: dict) -> tuple[str, str, str, str, bool]:
    ref = ev.get("objectRef", {})
    return (ev["verb"], ref.get("apiGroup", ""), ref.get("resource", ""), ref.get("subresource", ""),
            bool(ref.get("namespace")))


def exercise_every_call(cluster, guard) -> str:
    """Make the guard make each of its calls now (the session's other tests may not have): a finished migration
    (history patch), a running evacuation without a priority (the cause patch), a rule-7 denial twice (VMI get, pod patch, Event create, then an Event patch), a stuck
    descheduler evacuation (the canceller's PUT). Returns the namespace it used."""
    ns = cluster.fresh_namespace("rbac")
    node, other = cluster.fresh_node(), cluster.fresh_node()
    cluster.vm(ns, "moved", node, migration=migration_state(other, node, started=9, ended=5))
    marked = cluster.vm(ns, "marked", node, evacuation_node=node)
    stuck_node = cluster.fresh_node()
    cluster.vm(ns, "stuck", stuck_node, evacuation_node=stuck_node,
               annotations={"kubevirt.io/eviction-source": "descheduler"})
    # an evacuation running without a priority (KubeVirt 1.8's default): the guard records its cause on the VMIM
    running_node = cluster.fresh_node()
    cluster.vm(ns, "evacuating", running_node, evacuation_node=running_node)
    cluster.objects.vmim(ns, "evacuating-0", "evacuating", "Running", evacuation_node=running_node)
    for i in range(3):
        cluster.objects.vmim(ns, f"stuck-{i}", "stuck", "Failed", evacuation_node=stuck_node,
                             priority="system-maintenance",
                             migration=migration_state(stuck_node, other, started=9 - 3 * i, ended=8 - 3 * i,
                                                       failed=True))
    cluster.sync()
    user = guard.inst.username

    def made(verb, resource, name, sub=""):
        return [e for e in cluster.cp.audit_events(user) if e["verb"] == verb
                and e.get("objectRef", {}).get("resource") == resource
                and e["objectRef"].get("subresource", "") == sub and e["objectRef"].get("namespace") == ns
                and (name is None or e["objectRef"].get("name") == name)]

    # The second denial only after the denial's Event exists: one arriving while the first flush still waits in the
    # queue is counted into that create, and no patch would ever be sent. (The canceller's Event is another create.)
    code, _ = cluster.evict(ns, marked.pod_name)
    assert code == 429
    created = eventually(lambda: [e for e in made("create", "events", None)
                                  if e["objectRef"].get("name", "").startswith("marked.")], 20, "the denial's Event")
    code, _ = cluster.evict(ns, marked.pod_name)
    assert code == 429
    eventually(lambda: made("patch", "virtualmachineinstances", "moved"), 20, "the history annotation patch")
    eventually(lambda: made("patch", "pods", marked.pod_name), 20, "the eviction-in-progress patch")
    eventually(lambda: made("patch", "events", created[0]["objectRef"]["name"]), 20, "the Event aggregation patch")
    eventually(lambda: made("update", "virtualmachineinstances", "stuck", "evacuate"), 20, "the evacuate/cancel PUT")
    eventually(lambda: made("patch", "virtualmachineinstancemigrations", "evacuating-0"), 20, "the cause patch")
    assert EVICTION_IN_PROGRESS in cluster.objects.get_pod(ns, marked.pod_name)["metadata"]["annotations"]
    return ns


@pytest.mark.check("rbac")
def test_rbac_allows_the_guards_calls_and_nothing_more(cluster, guard, installation, control_plane, virt_api,
                                                       detail):
    exercised = exercise_every_call(cluster, guard)
    user = installation.username
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{installation.namespace}", "system:authenticated"]
    mine = [e for e in control_plane.audit_events(user)
            if guard.credential_id in e["user"].get("extra", {}).get("authentication.kubernetes.io/credential-id", [])]
    events = [e for e in mine if "objectRef" in e]
    assert events, "no request of the guard in the audit log"

    # 1. every request the guard made was allowed
    forbidden = sorted({(key_of(e) if "objectRef" in e else e["requestURI"],
                         e["annotations"].get("authorization.k8s.io/reason", "")) for e in mine
                        if e.get("annotations", {}).get("authorization.k8s.io/decision") != "allow"})
    assert not forbidden, f"requests of the guard the authorizer refused: {forbidden}"
    observed = {key_of(e) for e in events}
    discovery = {(e["verb"], e["requestURI"].split("?")[0]) for e in mine if "objectRef" not in e}

    # 2. every call of the code was made, and a SubjectAccessReview agrees
    missing = {k: where for k, where in GUARD_CALLS.items() if k not in observed}
    assert not missing, f"calls of the guard's code not seen in this session: {missing}"
    api = control_plane.api_client()
    for verb, group, resource, sub, namespaced in GUARD_CALLS:
        ns = (DESCHEDULER_NS if group == "operator.openshift.io" else "vms") if namespaced else None
        name = None
        if resource == "configmaps":  # granted by name only: the upstream descheduler chart's policy
            ns, name = "kube-system", "descheduler"
        status = sar(api, user, groups, verb, group, resource, sub, ns, name)
        assert status.allowed, (verb, group, resource, sub, ns, status)
    unexpected = observed - set(GUARD_CALLS)
    assert not unexpected, f"the guard made calls GUARD_CALLS does not list (add them, with where): {unexpected}"
    missing = {k: where for k, where in GUARD_DISCOVERY.items() if k not in discovery}
    assert not missing, f"discovery requests of the guard's code not seen in this session: {missing}"
    assert discovery == set(GUARD_DISCOVERY), f"non-resource requests GUARD_DISCOVERY does not list: {discovery}"
    for verb, path in GUARD_DISCOVERY:
        assert non_resource_sar(api, user, groups, verb, path).allowed, (verb, path)

    # virt-api's reviews of the guard's calls to it were made and allowed
    reviewed = {(r.attributes["verb"], r.attributes["group"], r.attributes["resource"], r.attributes["subresource"])
                for r in virt_api.reviews_of(user) if r.allowed}
    missing = {k: why for k, why in VIRT_API_REVIEWS.items() if k not in reviewed}
    assert not missing, f"virt-api's reviews of the guard not seen allowed: {missing}"

    # 3. nothing granted that no call (or virt-api's review of one) uses, and the forbidden list refused
    used = {(v, g, r + (f"/{s}" if s else "")) for v, g, r, s, _ in GUARD_CALLS}
    used |= {(v, g, f"{r}/{s}") for v, g, r, s in VIRT_API_REVIEWS}
    granted = set()
    for doc in installation.manifests:
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                granted |= {(v, g, r) for v in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]}
    unused = {(v, g, r) for v, g, r in granted if (v, g, r) not in used and not (v == "get" and ("list", g, r) in used)}
    assert not unused, f"the chart grants what the guard never does: {sorted(unused)}"
    for verb, group, resource, sub, ns in FORBIDDEN:
        ns = installation.namespace if ns == "OWN" else ns
        status = sar(api, user, groups, verb, group, resource, sub, ns)
        assert not status.allowed, (verb, group, resource, sub, ns, status.reason)

    # the evacuate/cancel rule: as the chart writes it, as the API server resolves the real call
    (rule,) = [r for d in installation.manifests if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]
               if "subresources.kubevirt.io" in r["apiGroups"]]
    assert rule["resources"] == ["virtualmachineinstances/evacuate", "virtualmachineinstances/evacuate/cancel"] \
        and rule["verbs"] == ["update"], rule
    cancel = next(e for e in events if e["objectRef"].get("subresource") == "evacuate"
                  and e["objectRef"].get("namespace") == exercised and e["objectRef"].get("name") == "stuck")
    assert cancel["requestURI"].endswith("/evacuate/cancel"), cancel["requestURI"]
    assert cancel["objectRef"]["apiGroup"] == "subresources.kubevirt.io" and cancel["verb"] == "update"
    assert cancel["responseStatus"]["code"] == 200  # authorized, proxied to virt-api, which cancelled
    stranger = _stranger_token(control_plane)
    trust = ssl.create_default_context(cafile=str(control_plane.ca_path))
    with httpx.Client(base_url=control_plane.url, verify=trust, timeout=10) as http:
        r = http.put(cancel["requestURI"], json={"evacuationNodeName": "x"},
                     headers={"Authorization": f"Bearer {stranger}"})
    assert r.status_code == 403, r.text  # the same call without the rule: refused before routing
    assert 'cannot update resource "virtualmachineinstances/evacuate" in API group "subresources.kubevirt.io"' \
        in r.json()["message"], r.json()["message"]
    detail["detail"] = (f"{len(mine)} requests of {user} with the guard's token, all allowed; "
                        f"{len(GUARD_CALLS)} kinds of call from the code and {len(GUARD_DISCOVERY)} discovery GETs "
                        f"seen and SAR-allowed; {len(granted)} granted verbs all used (update "
                        f"virtualmachineinstances/evacuate/cancel by virt-api's review); {len(FORBIDDEN)} forbidden "
                        "SARs refused; PUT .../evacuate/cancel resolved as update virtualmachineinstances/evacuate "
                        "in subresources.kubevirt.io: allowed for the guard (200 from virt-api), 403 without the rule")


def _stranger_token(cp) -> str:
    """A token of a ServiceAccount with no bindings at all."""
    core = client.CoreV1Api(cp.api_client())
    if not [s for s in core.list_namespaced_service_account("default").items if s.metadata.name == "stranger"]:
        core.create_namespaced_service_account("default", {"metadata": {"name": "stranger"}})
    return cp.service_account_token("default", "stranger")
