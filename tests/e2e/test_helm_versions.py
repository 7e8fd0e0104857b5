"""Helm 3 and Helm 4, each built from its own module (e2e/go.mod): install, upgrade, certificate rotation and
uninstall of the chart as a user runs them (default values: the Service-based webhook and Helm-generated
certificates), on a control plane of their own so that the releases' webhooks never meet the session's evictions.

The uninstall order is read from the API server's audit log (every DELETE, in the order the API server received
them). Helm deletes a release's objects kind by kind in its ``UninstallOrder`` (``pkg/release/v1/util/
kind_sorter.go`` in v4, ``pkg/releaseutil/kind_sorter.go`` in v3), all of one kind at once, the next kind after
them; kinds not in the list go last, alphabetically. Helm 4's list starts with the webhook configurations; Helm 3's
does not name them, so Helm 3 alone would delete the MutatingWebhookConfiguration last, after the Service and the
Deployment. The chart therefore renders, under Helm 3, a ``pre-delete`` hook: a Job running the guard's image
(``kubevirt-eviction-guard unregister``) deletes the webhook configuration before Helm deletes anything else. That
Job needs a kubelet: this control plane has none, so here Helm 3 uninstalls with ``--no-hooks`` (the documented way
out when the Job cannot run) and the hook runs on the real node (tests/e2e/test_node.py), under the same check.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.e2e.controlplane import ControlPlane
from tests.e2e.guard import CHART, fullname, helm

ADMIN = "e2e-admin"
WEBHOOK = "mutatingwebhookconfigurations"
# what the guard's pods need, deleted after the webhook configuration in the right order
SERVING = ("services", "deployments", "clusterroles", "clusterrolebindings", "serviceaccounts", "secrets")
HOOK_KINDS = {"Job", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}


@pytest.fixture(scope="module")
def helm_plane(binaries: Path, e2e_dir: Path) -> Iterator[ControlPlane]:
    cp = ControlPlane(e2e_dir / "helm-versions", binaries).start()
    try:
        yield cp
    finally:
        cp.stop()


def _when(ev: dict) -> datetime:
    return datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00"))


def hook_user(release: str, namespace: str) -> str:
    """The identity of the uninstall hook's Job (its own ServiceAccount)."""
    return f"system:serviceaccount:{namespace}:{fullname(release, {})}-unregister"


def delete_order(cp: ControlPlane, release: str, namespace: str, cluster_names: set[str],
                 after: set[str], namespaces: frozenset[str] = frozenset()) -> list[dict]:
    """The release's DELETEs since ``after`` (audit IDs seen before), by Helm (the admin) or the uninstall hook, in
    the order the API server received them: objects in ``namespace`` (but Helm's own release records) and the
    release's cluster-scoped objects (``cluster_names``, the hook's own among them)."""
    out = []
    users = {ADMIN, hook_user(release, namespace)}
    for ev in cp.audit_events():
        ref = ev.get("objectRef") or {}
        user = ev.get("user", {}).get("username")
        if ev["auditID"] in after or ev.get("verb") != "delete" or not ref.get("name") or user not in users:
            continue
        if ref.get("resource") == "secrets" and ref["name"].startswith("sh.helm.release."):
            continue  # Helm's storage driver, not the chart
        in_release = ref.get("namespace") in {namespace, *namespaces}
        if in_release or (not ref.get("namespace") and ref["name"] in cluster_names):
            out.append({"resource": ref["resource"], "name": ref["name"], "at": _when(ev), "user": user,
                        "code": (ev.get("responseStatus") or {}).get("code")})
    return sorted(out, key=lambda d: d["at"])


def leftovers(cp: ControlPlane, release: str, namespace: str, manifests: list[dict]) -> list[str]:
    """What of the release is still on the API server: each manifest's object, anything labelled or annotated
    as the release's (the uninstall hook's objects too), and every Secret in the namespace (the Helm-generated
    certificates, Helm's records)."""
    left = []
    for doc in manifests:
        ns = ["-n", namespace] if doc["metadata"].get("namespace") else []
        if cp.kubectl("get", doc["kind"], doc["metadata"]["name"], *ns, check=False).returncode == 0:
            left.append(f"{doc['kind']}/{doc['metadata']['name']}")
    kinds = "mutatingwebhookconfigurations,validatingwebhookconfigurations,clusterroles,clusterrolebindings"
    listed = json.loads(cp.kubectl("get", kinds, "-o", "json").stdout)["items"]
    listed += json.loads(cp.kubectl("get", "roles,rolebindings,secrets,serviceaccounts,configmaps,services,"
                                    "deployments,jobs", "-A", "-o", "json").stdout)["items"]
    for obj in listed:
        meta = obj["metadata"]
        ours = (meta.get("annotations") or {}).get("meta.helm.sh/release-name") == release or \
            (meta.get("labels") or {}).get("app.kubernetes.io/instance") == release
        if ours or (obj["kind"] == "Secret" and meta.get("namespace") == namespace):
            left.append(f"{obj['kind']}/{meta['name']}")
    return sorted(set(left))


def ca_bundle(cp: ControlPlane, name: str) -> list[x509.Certificate]:
    hook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout)
    return x509.load_pem_x509_certificates(base64.b64decode(hook["webhooks"][0]["clientConfig"]["caBundle"]))


def secret_ca(cp: ControlPlane, namespace: str, secret: str) -> x509.Certificate:
    live = json.loads(cp.kubectl("-n", namespace, "get", "secret", secret, "-o", "json").stdout)
    return x509.load_pem_x509_certificate(base64.b64decode(live["data"]["ca.crt"]))


def install_upgrade_rotate(cp: ControlPlane, binary: str, release: str, namespace: str, *values: str) -> dict:
    """``helm install``, ``helm upgrade`` (a changed value; the generated CA kept), a rotation (the Secret deleted,
    ``helm upgrade``: the caBundle holds the new CA and the previous one) and a plain upgrade after it (the previous
    CA dropped). Returns what the uninstall needs: the version, the manifests and the hooks Helm stored."""
    name = fullname(release, {})
    version = helm(cp, "version", "--short", binary=binary).strip()
    helm(cp, "install", release, str(CHART), "--namespace", namespace, "--create-namespace", *values, binary=binary)
    manifests = [d for d in yaml.safe_load_all(helm(cp, "get", "manifest", release, "-n", namespace,
                                                    binary=binary)) if d]
    hooks = [d for d in yaml.safe_load_all(helm(cp, "get", "hooks", release, "-n", namespace, binary=binary)) if d]
    kinds = sorted({d["kind"] for d in manifests})
    assert {"MutatingWebhookConfiguration", "Deployment", "Service", "Secret", "ClusterRole"} <= set(kinds), kinds
    hook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout)
    assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == name
    (secret,) = [d["metadata"]["name"] for d in manifests if d["kind"] == "Secret"]
    first = secret_ca(cp, namespace, secret)
    assert ca_bundle(cp, name) == [first]

    # upgrade: a changed value rolls out; the generated CA is kept (the chart's lookup of its own Secret)
    helm(cp, "upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values", "--set", "replicaCount=2",
         binary=binary)
    (listed,) = json.loads(helm(cp, "list", "-n", namespace, "-o", "json", binary=binary))
    assert listed["revision"] == "2" and listed["status"] == "deployed", listed
    deployment = json.loads(cp.kubectl("-n", namespace, "get", "deployment", name, "-o", "json").stdout)
    assert deployment["spec"]["replicas"] == 2
    assert ca_bundle(cp, name) == [first] == [secret_ca(cp, namespace, secret)], "the upgrade replaced the CA"

    # rotation: the Secret deleted, an upgrade generates a new pair; the webhook trusts the new CA and the previous
    cp.kubectl("-n", namespace, "delete", "secret", secret)
    helm(cp, "upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values", binary=binary)
    second = secret_ca(cp, namespace, secret)
    assert second != first and ca_bundle(cp, name) == [second, first]
    # the next upgrade drops the previous CA; a second rotation keeps one previous CA, not two
    helm(cp, "upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values", binary=binary)
    assert ca_bundle(cp, name) == [second]
    cp.kubectl("-n", namespace, "delete", "secret", secret)
    helm(cp, "upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values", binary=binary)
    third = secret_ca(cp, namespace, secret)
    assert ca_bundle(cp, name) == [third, second]
    return {"version": version, "binary": binary, "release": release, "namespace": namespace, "name": name,
            "manifests": manifests, "kinds": kinds, "hooks": sorted(d["kind"] for d in hooks)}


def _plural(kind: str) -> str:
    kind = kind.lower()
    return kind[:-1] + "ies" if kind.endswith("y") else kind + "s"


def uninstall(cp: ControlPlane, run: dict, *flags: str) -> dict:
    """``helm uninstall --wait`` (and ``flags``): the DELETEs in the order received, whether the webhook
    configuration went before everything the guard's pods need, and who deleted it."""
    release, namespace, manifests = run["release"], run["namespace"], run["manifests"]
    seen = {ev["auditID"] for ev in cp.audit_events()}
    helm(cp, "uninstall", release, "--namespace", namespace, "--wait", *flags, timeout=300, binary=run["binary"])
    cluster_names = {d["metadata"]["name"] for d in manifests if not d["metadata"].get("namespace")}
    cluster_names.add(f"{run['name']}-unregister")  # the hook's ClusterRole and ClusterRoleBinding
    elsewhere = frozenset(d["metadata"]["namespace"] for d in manifests if d["metadata"].get("namespace"))
    order = delete_order(cp, release, namespace, cluster_names, seen, elsewhere)  # e.g. the policy ConfigMaps' Roles
    deleted = {(d["resource"], d["name"]) for d in order}
    missing = [d for d in manifests if (_plural(d["kind"]), d["metadata"]["name"]) not in deleted]
    assert not missing, ([f"{d['kind']}/{d['metadata']['name']}" for d in missing], order)
    # 404: Helm deletes hook objects before creating them (before-hook-creation), and Helm 3 deletes the webhook
    # configuration the hook deleted already; both are fine to Helm
    assert all(d["code"] in (200, 202) or (d["code"] == 404 and (d["name"].endswith("-unregister") or
                                                                 d["resource"] == WEBHOOK)) for d in order), \
        [(d["resource"], d["name"], d["user"], d["code"]) for d in order]
    order = [d for d in order if d["code"] != 404]
    left = leftovers(cp, release, namespace, manifests)
    assert not left, f"{run['binary']} uninstall left {left}"
    resources = list(dict.fromkeys(d["resource"] for d in order))
    (webhook,) = [d for d in order if d["resource"] == WEBHOOK]
    serving_at = min(d["at"] for d in order if d["resource"] in SERVING and not d["name"].endswith("-unregister"))
    hook_deleted = sorted(f"{d['resource']}/{d['name']}" for d in order if d["name"].endswith("-unregister"))
    return {**run, "order": resources, "webhook_first": webhook["at"] <= serving_at, "webhook_by": webhook["user"],
            "window_ms": max(0.0, (webhook["at"] - serving_at).total_seconds() * 1000),
            "hook_deleted": hook_deleted}


def describe(h: dict) -> str:
    how = (f"deleted first by the uninstall hook, as {h['webhook_by']}" if h["webhook_by"] != ADMIN else
           "deleted first by Helm") if h["webhook_first"] else \
        f"{h['window_ms']:.0f} ms after the first of the guard's objects"
    return (f"{h['version']}: install ({len(h['kinds'])} kinds, hooks: {', '.join(h['hooks']) or 'none'}), upgrade "
            "(CA kept), rotation (caBundle: new CA + previous, then the previous dropped; a second rotation: 2 CAs), "
            f"uninstall{' ' + ' '.join(h['flags']) if h.get('flags') else ''} deleted {' > '.join(h['order'])} "
            f"(webhook configuration {how}), nothing left")


@pytest.mark.check("helm 3 and helm 4")
def test_helm3_and_helm4_install_upgrade_rotate_uninstall(helm_plane, detail):
    h4 = install_upgrade_rotate(helm_plane, "helm", "guard-h4", "kveg-helm4")
    assert h4["version"].startswith("v4.") and h4["hooks"] == [], h4["hooks"]  # Helm 4 needs no hook
    h4 = uninstall(helm_plane, h4)
    # Helm 4 deletes the webhook configuration before anything the guard's pods need
    assert h4["webhook_first"] and h4["order"][0] == WEBHOOK and h4["webhook_by"] == ADMIN, h4["order"]

    h3 = install_upgrade_rotate(helm_plane, "helm3", "guard-h3", "kveg-helm3")
    assert h3["version"].startswith("v3.") and set(h3["hooks"]) == HOOK_KINDS, h3["hooks"]
    # no kubelet here: the way out a user takes when the Job cannot run. Without the hook Helm 3's own order
    # deletes the webhook configuration last, after the Service and the Deployment: what the hook is for
    h3 = {**uninstall(helm_plane, h3, "--no-hooks"), "flags": ["--no-hooks"]}
    o3 = h3["order"]
    assert not h3["webhook_first"] and o3.index("services") < o3.index("deployments") < o3.index(WEBHOOK), o3
    assert h3["hook_deleted"] == [], h3["hook_deleted"]  # --no-hooks: the hook's objects were never made
    detail["detail"] = ("; ".join(describe(h) for h in (h4, h3)) +
                        " (the hook on a control plane without a kubelet; it runs on the real node: test_node.py)")
