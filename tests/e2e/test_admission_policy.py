"""The chart's ValidatingAdmissionPolicy, judged by the real API server.

The chart binds a policy (``templates/validatingadmissionpolicy.yaml``) that lets the guard's ServiceAccount change
nothing on a pod but the descheduler's ``eviction-in-progress`` annotation and nothing on a VMI but the guard's
``migration-history`` annotation, whatever its RBAC (``patch`` on every pod and VMI) would allow. This check sends
requests as that ServiceAccount with a TokenRequest token of its own (not the guard's), the ways a leaked token could
be used: JSON, merge, strategic-merge and server-side-apply PATCHes (admission sees each as an UPDATE of the whole
object), and PUT, which the chart's RBAC refuses before admission; to see the policy judge a PUT too, ``update`` is
granted for a moment by an extra binding (what a widened RBAC would do). Status: the chart grants no status
subresource (refused by the authorizer); a VMI has none (KubeVirt's CRD), so its status is part of the object and
the policy's spec/status rule keeps the guard from touching a VMI's evacuation mark.

The guard's own writes pass the same policy: the audit log shows each of them (its token) judged by the policy (the
policy's ``<name>/judged`` audit annotation) and answered 200. kube-apiserver's
``apiserver_validating_admission_policy_check_total{enforcement_action="deny"}`` counts exactly the denials sent
here (it counts no successful evaluations: the audit annotation is the evidence of those).
"""

from __future__ import annotations

import json
import ssl
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.domain.history import HistoryEntry, encode_history
from app.domain.records import EVICTION_IN_PROGRESS
from tests.e2e.cluster import eventually
from tests.e2e.objects import migration_state

HISTORY = "kubevirt-eviction-guard.io/migration-history"
JSON, MERGE, STRATEGIC, APPLY = ("application/json-patch+json", "application/merge-patch+json",
                                 "application/strategic-merge-patch+json", "application/apply-patch+yaml")
ANNOTATIONS_POD = f"kubevirt-eviction-guard may change no annotation but {EVICTION_IN_PROGRESS}"
ANNOTATIONS_VMI = f"kubevirt-eviction-guard may change no annotation but {HISTORY}"
SPEC = "kubevirt-eviction-guard may not change spec or status"
META = "kubevirt-eviction-guard may not change labels, owner references or finalizers"
CHECKS = "apiserver_validating_admission_policy_check_total"


def pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def policy_checks(cp, policy: str) -> dict[str, float]:
    """kube-apiserver's own count of this policy's evaluations, by enforcement action (allow, deny)."""
    with cp.admin_http(timeout=30) as c:
        text = c.get("/metrics").text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == CHECKS and s.labels.get("policy") == policy:
                out[s.labels["enforcement_action"]] = out.get(s.labels["enforcement_action"], 0) + s.value
    return out


class AsGuard:
    """HTTP as the guard's ServiceAccount, with a token of its own."""

    def __init__(self, cp, token: str) -> None:
        self.http = httpx.Client(base_url=cp.url, verify=ssl.create_default_context(cafile=str(cp.ca_path)),
                                 headers={"Authorization": f"Bearer {token}"}, timeout=15)

    def send(self, method: str, path: str, body, content_type: str = "application/json", **params) -> httpx.Response:
        data = body if isinstance(body, str) else json.dumps(body)
        return self.http.request(method, path, content=data, headers={"Content-Type": content_type}, params=params)


@pytest.mark.check("admission policy")
def test_the_policy_lets_the_guard_write_its_two_annotations_and_nothing_else(cluster, guard, installation,
                                                                              control_plane, detail):
    cp = control_plane
    vap = installation.one("ValidatingAdmissionPolicy")
    name = vap["metadata"]["name"]
    binding = installation.one("ValidatingAdmissionPolicyBinding")["metadata"]["name"]
    # as the chart rendered it (its CEL compiled by the API server on create; the type-checking warnings in
    # status come from kube-controller-manager, which does not run here)
    live = installation.get("validatingadmissionpolicy", name, False)
    assert live["spec"]["validations"] == vap["spec"]["validations"]
    assert installation.get("validatingadmissionpolicybinding", binding, False)["spec"]["validationActions"] == ["Deny"]

    ns = cluster.fresh_namespace("vap")
    node, src = cluster.fresh_node(), cluster.fresh_node()
    vm = cluster.vm(ns, "target", node, annotations={"kubevirt.io/latest-observed-api-version": "v1"})
    pod_path = f"/api/v1/namespaces/{ns}/pods/{vm.pod_name}"
    vmi_path = f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/target"
    token = cp.service_account_token(installation.namespace, installation.service_account, seconds=600)
    me = AsGuard(cp, token)
    before = policy_checks(cp, name)

    def pod_rv() -> str:
        return cluster.objects.get_pod(ns, vm.pod_name)["metadata"]["resourceVersion"]

    def vmi_rv() -> str:
        return cluster.objects.get_vmi(ns, "target")["metadata"]["resourceVersion"]

    history = encode_history([HistoryEntry("uid-1", time.time() - 600, time.time() - 300, "succeeded")])
    # (what, method, path, body or a function of nothing that makes it, content type, expected: a policy message or
    # "allowed"; "rbac" for the authorizer's refusal)
    cases = [
        ("pod: JSON patch of the image", "PATCH", pod_path,
         [{"op": "replace", "path": "/spec/containers/0/image", "value": "registry.example/evil:1"}], JSON, SPEC),
        ("pod: merge patch of a label", "PATCH", pod_path, {"metadata": {"labels": {"owned": "yes"}}}, MERGE, META),
        ("pod: merge patch adding a finalizer", "PATCH", pod_path,
         {"metadata": {"finalizers": ["example.com/hold"]}}, MERGE, META),
        ("pod: merge patch of another annotation", "PATCH", pod_path,
         {"metadata": {"annotations": {"example.com/note": "x"}}}, MERGE, ANNOTATIONS_POD),
        ("pod: merge patch removing KubeVirt's annotation", "PATCH", pod_path,
         {"metadata": {"annotations": {"kubevirt.io/domain": None}}}, MERGE, ANNOTATIONS_POD),
        ("pod: strategic merge patch of eviction-in-progress and another annotation", "PATCH", pod_path,
         {"metadata": {"annotations": {EVICTION_IN_PROGRESS: "true", "example.com/note": "x"}}}, STRATEGIC,
         ANNOTATIONS_POD),
        ("pod: server-side apply of another annotation", "PATCH", pod_path,
         {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": vm.pod_name, "namespace": ns,
                                                          "annotations": {"example.com/note": "x"}}},
         APPLY, ANNOTATIONS_POD),
        ("pod: the guard's JSON patch of eviction-in-progress", "PATCH", pod_path,
         lambda: [{"op": "test", "path": "/metadata/resourceVersion", "value": pod_rv()},
                  {"op": "add", "path": f"/metadata/annotations/{pointer(EVICTION_IN_PROGRESS)}", "value": "true"}],
         JSON, "allowed"),
        ("pod: merge patch removing eviction-in-progress", "PATCH", pod_path,
         {"metadata": {"annotations": {EVICTION_IN_PROGRESS: None}}}, MERGE, "allowed"),
        ("pod: server-side apply of eviction-in-progress", "PATCH", pod_path,
         {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": vm.pod_name, "namespace": ns,
                                                          "annotations": {EVICTION_IN_PROGRESS: "true"}}},
         APPLY, "allowed"),
        ("pod: PUT (update)", "PUT", pod_path, lambda: cluster.objects.get_pod(ns, vm.pod_name), "application/json",
         "rbac"),
        ("pod: status patch", "PATCH", pod_path + "/status", {"status": {"phase": "Failed"}}, MERGE, "rbac"),
        ("vmi: merge patch of the spec", "PATCH", vmi_path,
         {"spec": {"domain": {"resources": {"requests": {"memory": "64Gi"}}}}}, MERGE, SPEC),
        ("vmi: merge patch marking it for evacuation (status: no subresource)", "PATCH", vmi_path,
         {"status": {"evacuationNodeName": node}}, MERGE, SPEC),
        ("vmi: JSON patch of another annotation", "PATCH", vmi_path,
         [{"op": "add", "path": "/metadata/annotations/kubevirt.io~1eviction-source", "value": "descheduler"}],
         JSON, ANNOTATIONS_VMI),
        ("vmi: merge patch of a label", "PATCH", vmi_path, {"metadata": {"labels": {"owned": "yes"}}}, MERGE, META),
        ("vmi: the guard's JSON patch of migration-history", "PATCH", vmi_path,
         lambda: [{"op": "test", "path": "/metadata/resourceVersion", "value": vmi_rv()},
                  {"op": "add", "path": f"/metadata/annotations/{pointer(HISTORY)}", "value": history}],
         JSON, "allowed"),
        ("vmi: PUT (update)", "PUT", vmi_path, lambda: cluster.objects.get_vmi(ns, "target"), "application/json",
         "rbac"),
    ]
    seen = _judge(me, cases, ns, vm.pod_name, name, binding)

    # the same policy on a PUT: `update` granted for a moment (a widened RBAC); the policy still decides
    widened = _widen(cp, installation)
    try:
        def edited(get, change):
            obj = get()
            change(obj)
            return obj
        put_cases = [
            ("pod: PUT with another image (update granted)", "PUT", pod_path,
             lambda: edited(lambda: cluster.objects.get_pod(ns, vm.pod_name),
                            lambda o: o["spec"]["containers"][0].update(image="registry.example/evil:1")),
             "application/json", SPEC),
            ("pod: PUT with another annotation (update granted)", "PUT", pod_path,
             lambda: edited(lambda: cluster.objects.get_pod(ns, vm.pod_name),
                            lambda o: o["metadata"]["annotations"].update({"example.com/note": "x"})),
             "application/json", ANNOTATIONS_POD),
            ("pod: PUT with eviction-in-progress only (update granted)", "PUT", pod_path,
             lambda: edited(lambda: cluster.objects.get_pod(ns, vm.pod_name),
                            lambda o: o["metadata"]["annotations"].update({EVICTION_IN_PROGRESS: "false"})),
             "application/json", "allowed"),
            ("vmi: PUT with another status (update granted)", "PUT", vmi_path,
             lambda: edited(lambda: cluster.objects.get_vmi(ns, "target"),
                            lambda o: o["status"].update(phase="Failed")), "application/json", SPEC),
            ("vmi: PUT with migration-history only (update granted)", "PUT", vmi_path,
             lambda: edited(lambda: cluster.objects.get_vmi(ns, "target"),
                            lambda o: o["metadata"]["annotations"].update({HISTORY: "[]"})), "application/json",
             "allowed"),
        ]
        seen += _judge(me, put_cases, ns, vm.pod_name, name, binding)
    finally:
        widened()

    # nothing but the two annotations changed on the objects
    pod = cluster.objects.get_pod(ns, vm.pod_name)
    assert pod["spec"]["containers"][0]["image"] == vm.pod["spec"]["containers"][0]["image"]
    assert pod["metadata"].get("labels") == vm.pod["metadata"]["labels"] and not pod["metadata"].get("finalizers")
    assert set(pod["metadata"]["annotations"]) == set(vm.pod["metadata"]["annotations"]) | {EVICTION_IN_PROGRESS}
    vmi = cluster.objects.get_vmi(ns, "target")
    assert vmi["spec"] == vm.vmi["spec"] and vmi["status"] == vm.vmi["status"]
    assert set(vmi["metadata"]["annotations"]) == set(vm.vmi["metadata"].get("annotations") or {}) | {HISTORY}

    # the guard's own writes pass the policy: an eviction-in-progress patch and a history patch, made now
    marked = cluster.vm(ns, "marked", node, evacuation_node=node)
    cluster.vm(ns, "moved", src, migration=migration_state(node, src, started=9, ended=5))
    cluster.sync()
    code, _ = cluster.evict(ns, marked.pod_name, descheduler=True)
    assert code == 429

    judged_key = f"{name}/judged"

    def guards_writes():
        mine = [e for e in cp.audit_events(installation.username) if e["verb"] == "patch"
                and e["objectRef"].get("namespace") == ns and guard.credential_id in
                e["user"].get("extra", {}).get("authentication.kubernetes.io/credential-id", [])]
        got = {(e["objectRef"]["resource"], e["objectRef"]["name"]): e for e in mine}
        return got if {("pods", marked.pod_name), ("virtualmachineinstances", "moved")} <= set(got) else None

    writes = eventually(guards_writes, 30, "the guard's eviction-in-progress and history patches")
    for (resource, obj), e in writes.items():
        allowed_key = EVICTION_IN_PROGRESS if resource == "pods" else HISTORY
        assert e["responseStatus"]["code"] == 200, e
        assert e["annotations"].get(judged_key) == f"may change {allowed_key} only", (resource, e["annotations"])
    # every request sent here with the other token was judged too (or refused by the authorizer before admission)
    sent = [e for e in cp.audit_events(installation.username) if e.get("objectRef", {}).get("namespace") == ns
            and e["verb"] in ("patch", "update") and guard.credential_id not in
            e["user"].get("extra", {}).get("authentication.kubernetes.io/credential-id", [])]
    judged = [e for e in sent if judged_key in e.get("annotations", {})]
    assert len(sent) == len(seen) and len(judged) == sum(1 for x in seen if x[1] != "rbac"), (len(sent), len(judged))
    after = policy_checks(cp, name)
    denied = sum(1 for x in seen if x[1] not in ("allowed", "rbac"))
    assert after.get("deny", 0) - before.get("deny", 0) == denied, (before, after, denied)
    detail["detail"] = (
        f"policy {name}, requests as {installation.username} with a token of its own: "
        + "; ".join(f"{what}: {answer}" for what, answer in seen)
        + f". Audit: all {len(judged)} that reached admission carry {judged_key}; the guard's own patches "
        f"({', '.join(f'{r} {n}' for r, n in writes)}) judged and answered 200; kube-apiserver counted "
        f"{denied} deny evaluations of the policy meanwhile, the ones above")


def _judge(me: AsGuard, cases, ns: str, pod: str, policy: str, binding: str) -> list[tuple[str, str]]:
    """Send each case; assert the API server's answer; (what, short answer) for the detail."""
    seen = []
    for what, method, path, body, ctype, expect in cases:
        payload = body() if callable(body) else body
        params = {"fieldManager": "e2e-leaked-token", "force": "true"} if ctype == APPLY else {}
        r = me.send(method, path, payload, ctype, **params)
        if expect == "allowed":
            assert r.status_code == 200, (what, r.status_code, r.text)
            seen.append((what, "allowed"))
        elif expect == "rbac":
            assert r.status_code == 403, (what, r.status_code, r.text)
            msg = r.json()["message"]
            assert "cannot " in msg and "ValidatingAdmissionPolicy" not in msg, (what, msg)
            seen.append((what, "rbac"))
        else:
            assert r.status_code == 403 and r.json()["reason"] == "Forbidden", (what, r.status_code, r.text)
            msg = r.json()["message"]
            assert msg.endswith(f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: "
                                f"{expect}"), (what, msg)
            seen.append((what, "403 " + expect.removeprefix("kubevirt-eviction-guard ")))
    return seen


def _widen(cp, installation):
    """Bind ``update`` on pods and VMIs to the guard's ServiceAccount; returns what removes it again (and waits
    until the authorizer refuses again)."""
    from kubernetes import client

    from tests.e2e.test_rbac import sar

    api = cp.api_client()
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role({"metadata": {"name": "e2e-widened-guard"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["update"]},
        {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"], "verbs": ["update"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": "e2e-widened-guard"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-widened-guard"},
        "subjects": [{"kind": "ServiceAccount", "name": installation.service_account,
                      "namespace": installation.namespace}]})
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{installation.namespace}", "system:authenticated"]

    def allowed() -> bool:
        return sar(api, installation.username, groups, "update", "", "pods", "", "default").allowed

    eventually(allowed, 10, "update to be granted")

    def narrow() -> None:
        rbac.delete_cluster_role_binding("e2e-widened-guard")
        rbac.delete_cluster_role("e2e-widened-guard")
        eventually(lambda: not allowed(), 10, "update to be refused again")

    return narrow
