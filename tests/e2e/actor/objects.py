"""What the actor registers besides the objects (``tests/e2e/objects.py`` builds those): KubeVirt's admitter."""

from __future__ import annotations

from typing import Any

NAMESPACE = "vms"  # the simulator's namespace for VMs (app.sim.kubevirt.NAMESPACE)
ADMITTER_NAME = "virt-launcher-eviction-interceptor.kubevirt.io"


def admitter_webhook(url: str, ca_bundle_b64: str) -> dict[str, Any]:
    """KubeVirt's eviction admitter as virt-operator registers it (kubevirt-facts.md)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "virt-api-validator"},
            "webhooks": [{
                "name": ADMITTER_NAME, "admissionReviewVersions": ["v1"], "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Fail", "timeoutSeconds": 10,
                "clientConfig": {"url": url, "caBundle": ca_bundle_b64},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods/eviction"], "scope": "Namespaced"}],
                "matchConditions": [{"name": "only-vms",
                                     "expression": 'object.metadata.name.startsWith("virt-launcher")'}],
            }]}
