"""Helm 3 and Helm 4, each built from its own module (e2e/go.mod): install, upgrade and uninstall of the chart as a user
runs them (default values: the Service-based webhook and Helm-generated certificates), on a control plane of their own
so that the releases' webhooks never meet the session's evictions.

The uninstall order is read from the API server's audit log (every DELETE, in the order the API server received
them). Helm deletes a release's objects kind by kind in its ``UninstallOrder`` (``pkg/release/v1/util/
kind_sorter.go`` in v4, ``pkg/releaseutil/kind_sorter.go`` in v3), all of one kind at once, the next kind after
them; kinds not in the list go last, alphabetically. Helm 4's list starts with the webhook configurations; Helm 3's
does not name them, so Helm 3 deletes the MutatingWebhookConfiguration last, after the Service, the Deployment and
the RBAC: for that moment the API server calls a webhook whose Service is gone (failurePolicy Ignore: the
eviction proceeds, the call counts as failed). docs/install.md tells Helm 3 users to delete the webhook
configuration first.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.e2e.controlplane import ControlPlane
from tests.e2e.guard import CHART, fullname, helm

ADMIN = "e2e-admin"
WEBHOOK = "mutatingwebhookconfigurations"
# what the guard's pods need, deleted after the webhook configuration in the right order
SERVING = ("services", "deployments", "clusterroles", "clusterrolebindings", "serviceaccounts", "secrets")


@pytest.fixture(scope="module")
def helm_plane(binaries: Path, e2e_dir: Path) -> Iterator[ControlPlane]:
    cp = ControlPlane(e2e_dir / "helm-versions", binaries).start()
    try:
        yield cp
    finally:
        cp.stop()


def _when(ev: dict) -> datetime:
    return datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00"))


def _delete_order(cp: ControlPlane, namespace: str, cluster_names: set[str], after: set[str]) -> list[dict]:
    """The release's DELETEs since ``after`` (audit IDs seen before), in the order the API server received them:
    objects in ``namespace`` (but Helm's own release records) and the release's cluster-scoped objects."""
    out = []
    for ev in cp.audit_events(user=ADMIN):
        ref = ev.get("objectRef") or {}
        if ev["auditID"] in after or ev.get("verb") != "delete" or not ref.get("name"):
            continue
        if ref.get("resource") == "secrets" and ref["name"].startswith("sh.helm.release."):
            continue  # Helm's storage driver, not the chart
        if ref.get("namespace") == namespace or (not ref.get("namespace") and ref["name"] in cluster_names):
            out.append({"resource": ref["resource"], "name": ref["name"], "at": _when(ev),
                        "code": (ev.get("responseStatus") or {}).get("code")})
    return sorted(out, key=lambda d: d["at"])


def _leftovers(cp: ControlPlane, release: str, namespace: str, manifests: list[dict]) -> list[str]:
    """What of the release is still on the API server: each manifest's object, anything labelled or annotated
    as the release's, and every Secret in the namespace (the Helm-generated certificates, Helm's records)."""
    left = []
    for doc in manifests:
        ns = ["-n", namespace] if doc["metadata"].get("namespace") else []
        if cp.kubectl("get", doc["kind"], doc["metadata"]["name"], *ns, check=False).returncode == 0:
            left.append(f"{doc['kind']}/{doc['metadata']['name']}")
    kinds = "mutatingwebhookconfigurations,validatingwebhookconfigurations,clusterroles,clusterrolebindings"
    listed = json.loads(cp.kubectl("get", kinds, "-o", "json").stdout)["items"]
    listed += json.loads(cp.kubectl("get", "roles,rolebindings,secrets,serviceaccounts,configmaps,services,"
                                    "deployments", "-A", "-o", "json").stdout)["items"]
    for obj in listed:
        meta = obj["metadata"]
        ours = (meta.get("annotations") or {}).get("meta.helm.sh/release-name") == release or \
            (meta.get("labels") or {}).get("app.kubernetes.io/instance") == release
        if ours or (obj["kind"] == "Secret" and meta.get("namespace") == namespace):
            left.append(f"{obj['kind']}/{meta['name']}")
    return sorted(set(left))


def _run(cp: ControlPlane, binary: str, n: int) -> dict:
    release, namespace = f"guard-h{n}", f"kveg-helm{n}"
    name = fullname(release, {})
    version = helm(cp, "version", "--short", binary=binary).strip()
    helm(cp, "install", release, str(CHART), "--namespace", namespace, "--create-namespace", binary=binary)
    manifests = [d for d in yaml.safe_load_all(helm(cp, "get", "manifest", release, "-n", namespace,
                                                    binary=binary)) if d]
    kinds = sorted({d["kind"] for d in manifests})
    assert {"MutatingWebhookConfiguration", "Deployment", "Service", "Secret", "ClusterRole"} <= set(kinds), kinds
    hook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout)
    ca = hook["webhooks"][0]["clientConfig"]["caBundle"]
    assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == name

    # upgrade: a changed value rolls out; the generated CA is kept (the chart's lookup of its own Secret)
    helm(cp, "upgrade", release, str(CHART), "--namespace", namespace, "--set", "replicaCount=3", binary=binary)
    (listed,) = json.loads(helm(cp, "list", "-n", namespace, "-o", "json", binary=binary))
    assert listed["revision"] == "2" and listed["status"] == "deployed", listed
    deployment = json.loads(cp.kubectl("-n", namespace, "get", "deployment", name, "-o", "json").stdout)
    assert deployment["spec"]["replicas"] == 3
    hook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout)
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == ca, "the upgrade replaced the CA"
    (secret,) = [d for d in manifests if d["kind"] == "Secret"]
    live = json.loads(cp.kubectl("-n", namespace, "get", "secret", secret["metadata"]["name"], "-o", "json").stdout)
    assert base64.b64decode(live["data"]["ca.crt"]) == base64.b64decode(ca)

    seen = {ev["auditID"] for ev in cp.audit_events(user=ADMIN)}
    helm(cp, "uninstall", release, "--namespace", namespace, "--wait", binary=binary)
    cluster_names = {d["metadata"]["name"] for d in manifests if not d["metadata"].get("namespace")}
    order = _delete_order(cp, namespace, cluster_names, seen)
    deleted = {(d["resource"], d["name"]) for d in order}
    assert len(deleted) == len(manifests), (order, kinds)
    assert all(d["code"] in (200, 202) for d in order), order
    left = _leftovers(cp, release, namespace, manifests)
    assert not left, f"{binary} uninstall left {left}"
    resources = list(dict.fromkeys(d["resource"] for d in order))
    webhook_at = next(d["at"] for d in order if d["resource"] == WEBHOOK)
    serving_at = min(d["at"] for d in order if d["resource"] in SERVING)
    return {"version": version, "kinds": kinds, "order": resources, "webhook_first": webhook_at <= serving_at,
            "window_ms": max(0.0, (webhook_at - serving_at).total_seconds() * 1000)}


@pytest.mark.check("helm 3 and helm 4")
def test_helm3_and_helm4_install_upgrade_uninstall(helm_plane, detail):
    h3 = _run(helm_plane, "helm3", 3)
    h4 = _run(helm_plane, "helm", 4)
    assert h3["version"].startswith("v3.") and h4["version"].startswith("v4."), (h3["version"], h4["version"])
    # Helm 4 deletes the webhook configuration before anything the guard's pods need
    assert h4["webhook_first"] and h4["order"][0] == WEBHOOK, h4["order"]
    # Helm 3 does not know the kind: last, after the Service and the Deployment (its UninstallOrder); a Helm 3
    # that learnt it would pass this line no more, and the docs' advice to Helm 3 users could go
    o3 = h3["order"]
    assert not h3["webhook_first"] and o3.index("services") < o3.index("deployments") < o3.index(WEBHOOK), o3
    detail["detail"] = "; ".join(
        f"{h['version']}: install ({len(h['kinds'])} kinds), upgrade to revision 2 (replicaCount 3, CA kept), "
        f"uninstall deleted {' > '.join(h['order'])}"
        + (" (webhook configuration first)" if h["webhook_first"] else
           f" (webhook configuration {h['window_ms']:.0f} ms after the first of the guard's objects)")
        + ", nothing left (no webhook configuration, RBAC, Secret)" for h in (h3, h4))
