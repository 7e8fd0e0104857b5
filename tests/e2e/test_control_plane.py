"""The control plane itself: the pinned binaries are what they say, and the API server serves what the guard needs."""

from __future__ import annotations

import re

import pytest

from tests.e2e.controlplane import binary_version


def _version(text: str) -> tuple[int, ...]:
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    assert m, text
    return tuple(int(x) for x in m.groups())


@pytest.mark.check("binaries report their versions")
def test_binaries_report_true_versions(binaries, detail):
    versions = {name: binary_version(name) for name in ("kube-apiserver", "etcd", "descheduler", "helm", "kubectl")}
    assert _version(versions["kube-apiserver"]) >= (1, 36, 0), versions
    assert _version(versions["kubectl"]) >= (1, 36, 0), versions
    assert _version(versions["etcd"]) >= (3, 5, 0), versions
    assert _version(versions["descheduler"]) >= (0, 36, 0), versions
    assert _version(versions["helm"]) >= (3, 0, 0), versions
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
    detail["detail"] = f"kube-apiserver {version['gitVersion']} ready"
