"""The control plane itself: the pinned binaries are what they say, and the API server serves what the guard needs."""

from __future__ import annotations

import os
import re

import pytest

from tests.e2e.controlplane import ROOT, binary_version


def pinned_kubernetes() -> str:
    """The Kubernetes release the run is meant to test: ``E2E_KUBERNETES`` (``make e2e-oldest`` sets it from
    e2e/oldest/go.mod), else e2e/go.mod's k8s.io/kubernetes."""
    if os.environ.get("E2E_KUBERNETES"):
        return os.environ["E2E_KUBERNETES"]
    m = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (ROOT / "e2e" / "go.mod").read_text(), re.M)
    assert m, "e2e/go.mod pins no k8s.io/kubernetes"
    return m.group(1)


def _version(text: str) -> tuple[int, ...]:
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    assert m, text
    return tuple(int(x) for x in m.groups())


@pytest.mark.check("binaries report their versions")
def test_binaries_report_true_versions(binaries, detail):
    versions = {name: binary_version(name)
                for name in ("kube-apiserver", "etcd", "descheduler", "helm", "helm3", "kubectl")}
    pinned = _version(pinned_kubernetes())
    assert _version(versions["kube-apiserver"]) == pinned, versions
    assert _version(versions["kubectl"]) == pinned, versions
    assert _version(versions["etcd"]) >= (3, 5, 0), versions
    assert _version(versions["descheduler"]) >= (0, 36, 0), versions
    assert _version(versions["helm"]) >= (4, 0, 0), versions
    assert (3, 0, 0) <= _version(versions["helm3"]) < (4, 0, 0), versions
    detail["detail"] = "; ".join(f"{k}: {v}" for k, v in versions.items())


@pytest.mark.check("control plane serves policy/v1 evictions")
def test_api_server_serves_evictions_and_admission(control_plane, detail):
    with control_plane.admin_http(timeout=10) as c:
        version = c.get("/version").json()
        core = c.get("/api/v1").json()
        admission = c.get("/apis/admissionregistration.k8s.io/v1").json()
    names = {r["name"] for r in core["resources"]}
    assert "pods/eviction" in names
    eviction = next(r for r in core["resources"] if r["name"] == "pods/eviction")
    assert eviction["group"] == "policy" and eviction["version"] == "v1", eviction
    kinds = {r["kind"] for r in admission["resources"]}
    assert {"MutatingWebhookConfiguration", "ValidatingAdmissionPolicy"} <= kinds
    assert version["gitVersion"] == pinned_kubernetes(), version
    detail["detail"] = f"kube-apiserver {version['gitVersion']} ready"
