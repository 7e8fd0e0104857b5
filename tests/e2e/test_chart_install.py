"""The chart, installed by the real Helm CLI on the real API server, and the webhook it registers, called by it.

The install is what a user who runs the guard outside the cluster does (tests/e2e/guard.py): certificates from
``kubevirt-eviction-guard certs``, ``kubectl create secret tls``, ``helm install`` with ``webhook.url`` and
``certificates.mode: secret``. The guard runs as a local process with the chart's args and a token of the chart's
ServiceAccount. The chart's Deployment never gets a pod (no scheduler, no kubelet here): that is expected.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.e2e.guard import helm

pytestmark = pytest.mark.usefixtures("guard")


@pytest.mark.check("chart installed by helm")
def test_chart_installed_by_helm(installation, control_plane, detail):
    status = json.loads(helm(control_plane, "status", installation.release, "-n", installation.namespace,
                             "-o", "json"))
    assert status["info"]["status"] == "deployed", status["info"]
    assert status["version"] == 1
    # every object of the release exists on the API server, labelled as Helm's
    kinds = []
    for doc in installation.manifests:
        kind, name = doc["kind"], doc["metadata"]["name"]
        namespaced = "namespace" in doc["metadata"]
        live = installation.get(kind, name, doc["metadata"]["namespace"] if namespaced else False)
        assert live["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", (kind, name)
        assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == installation.release, (kind, name)
        kinds.append(kind)
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Service", "Deployment",
            "PodDisruptionBudget", "MutatingWebhookConfiguration"} <= set(kinds), kinds
    assert "Secret" not in kinds  # "own Secret" mode: the user's Secret, not the chart's
    # Helm's release record (the Secret storage driver)
    release = installation.get("secret", f"sh.helm.release.v1.{installation.release}.v1")
    assert release["type"] == "helm.sh/release.v1"
    # no kubelet, no scheduler: the Deployment stays without pods, and that is all it can do here
    deployment = installation.get("deployment", installation.fullname)
    assert not deployment.get("status", {}).get("availableReplicas")
    version = helm(control_plane, "version", "--short").strip()
    (listed,) = json.loads(helm(control_plane, "list", "-n", installation.namespace, "-o", "json"))
    detail["detail"] = (f"helm {version} installed release {installation.release} "
                        f"({listed['chart']}) into {installation.namespace}: "
                        f"{len(kinds)} objects ({', '.join(sorted(set(kinds)))}); the Deployment has no pod "
                        "(no kubelet): the guard runs as a local process with its ServiceAccount's token")


@pytest.mark.check("webhook registered by the chart")
def test_webhook_registered_and_called_by_the_api_server(installation, control_plane, guard, cluster, detail):
    live = installation.get("mutatingwebhookconfiguration", installation.fullname, False)
    (hook,) = live["webhooks"]
    assert hook["clientConfig"]["url"] == f"https://127.0.0.1:{installation.port}/mutate"
    assert "service" not in hook["clientConfig"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == installation.certs["ca"].read_bytes()
    assert hook["rules"][0]["resources"] == ["pods/eviction"] and hook["sideEffects"] == "NoneOnDryRun"

    ns = cluster.fresh_namespace("hook")
    node = cluster.fresh_node()
    vm = cluster.vm(ns, "quiet", node)
    cluster.objects.launcher_pod(ns, None, node, name="web-1", launcher=False)
    cluster.sync()
    before = guard.metric("kubevirt_eviction_guard_decisions_total")
    # a launcher pod's dry-run eviction reaches the guard through the API server (the audit log says which webhook
    # the API server called, and carries the guard's own audit annotations)
    code, _ = cluster.evict(ns, vm.pod_name, dry_run=True)
    assert code == 201
    called = cluster.audit_of_eviction(ns, vm.pod_name)
    annotations = called["annotations"]
    assert annotations[f"{installation.webhook_name}/reason"] == "allowed", annotations
    assert annotations[f"{installation.webhook_name}/dry-run"] == "true"
    round0 = json.loads(annotations["mutation.webhook.admission.k8s.io/round_0_index_0"])
    assert round0 == {"configuration": installation.fullname, "webhook": installation.webhook_name,
                      "mutated": False}
    assert guard.metric("kubevirt_eviction_guard_decisions_total") == before + 1
    # the match condition keeps every other pod's eviction away from the guard
    code, _ = cluster.evict(ns, "web-1", dry_run=True)
    assert code == 201
    other = cluster.audit_of_eviction(ns, "web-1")
    assert not [k for k in other.get("annotations", {}) if k.startswith(installation.webhook_name)]
    assert "mutation.webhook.admission.k8s.io/round_0_index_0" not in other.get("annotations", {})
    assert guard.metric("kubevirt_eviction_guard_decisions_total") == before + 1
    detail["detail"] = (f"MutatingWebhookConfiguration {installation.fullname}: webhook {installation.webhook_name} "
                        f"-> {hook['clientConfig']['url']} (caBundle = the certs CLI's CA); the API server called it "
                        "for a virt-launcher pod's eviction (audit: round_0_index_0, the guard's reason/dry-run "
                        "annotations) and not for a non-launcher pod's (match condition)")
