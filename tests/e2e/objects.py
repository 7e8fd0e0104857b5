"""KubeVirt-shaped objects written through the real API server, as KubeVirt and the kubelet would leave them.

Shapes follow tests/fixtures/objects (KubeVirt's own labels and annotations: ``kubevirt.io: virt-launcher``,
``kubevirt.io/domain``, ``kubevirt.io/migrationJobUID``, VMI ``status.migrationState`` and
``status.evacuationNodeName``, VMIM ``spec.priority`` and ``kubevirt.io/evacuationMigration``). Timestamps are
relative to the real clock (the guard decides on it); ``creationTimestamp`` is the API server's own.

Status is written the way the owners write it: a VMI's with the object (its CRD has no status subresource), a
VMIM's and a pod's through ``/status``. Nothing runs the pods: there is no kubelet, so an allowed eviction leaves a
pod terminating (``deletionTimestamp`` set) for ever; tests use fresh pods.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from kubernetes import client

KUBEVIRT = ("kubevirt.io", "v1")
LAUNCHER_IMAGE = "registry.example/virt-launcher:v1.8.0"


def rfc3339(minutes_ago: float) -> str:
    t = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=minutes_ago)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def migration_state(source: str, target: str, started: float, ended: float | None = None, *, failed: bool = False,
                    uid: str | None = None) -> dict:
    """A VMI's ``status.migrationState``: started/ended minutes ago (ended None: in flight)."""
    s: dict[str, Any] = {"migrationUid": uid or str(uuid.uuid4()), "sourceNode": source, "targetNode": target,
                         "startTimestamp": rfc3339(started)}
    if ended is not None:
        s.update(endTimestamp=rfc3339(ended), completed=not failed, failed=failed)
    return s


class KubeObjects:
    """Creates and changes nodes, VMIs, VMIMs and launcher pods as the admin, with the ``kubernetes`` client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    # ---- cluster-scoped ----

    def namespace(self, name: str, labels: dict | None = None) -> dict:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        return self.api.sanitize_for_serialization(self.core.create_namespace(body))

    def node(self, name: str, *, cordoned: bool = False, cpu: str = "64", memory: str = "256Gi",
             labels: dict | None = None) -> dict:
        """A Node as a kubelet would register it (capacity, Ready); ``cordoned``: what ``kubectl drain`` does first."""
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                "spec": {"unschedulable": True} if cordoned else {}}
        self.core.create_node(body)
        status = {"capacity": {"cpu": cpu, "memory": memory, "pods": "250", "devices.kubevirt.io/kvm": "1k"},
                  "allocatable": {"cpu": cpu, "memory": memory, "pods": "250", "devices.kubevirt.io/kvm": "1k"},
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "lastHeartbeatTime": rfc3339(0), "lastTransitionTime": rfc3339(60)}]}
        return self.api.sanitize_for_serialization(self.core.patch_node_status(name, {"status": status}))

    def cordon(self, name: str, cordoned: bool = True) -> None:
        self.core.patch_node(name, {"spec": {"unschedulable": cordoned}})

    # ---- VMIs ----

    def vmi(self, namespace: str, name: str, node: str, *, migration: dict | None = None,
            evacuation_node: str | None = None, annotations: dict | None = None, phase: str = "Running") -> dict:
        status: dict[str, Any] = {"phase": phase, "nodeName": node}
        if migration is not None:
            status["migrationState"] = migration
        if evacuation_node:
            status["evacuationNodeName"] = evacuation_node
        body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {},
                             "labels": {"kubevirt.io/nodeName": node}},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "2Gi"}}}},
                "status": status}
        return self.custom.create_namespaced_custom_object(*KUBEVIRT, namespace, "virtualmachineinstances", body)

    def get_vmi(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(*KUBEVIRT, namespace, "virtualmachineinstances", name)

    def patch_vmi(self, namespace: str, name: str, patch: dict) -> dict:
        """A merge patch of the whole VMI (status included: no status subresource)."""
        return self.custom.patch_namespaced_custom_object(*KUBEVIRT, namespace, "virtualmachineinstances", name, patch)

    # ---- VMIMs ----

    def vmim(self, namespace: str, name: str, vmi_name: str, phase: str, *, migration: dict | None = None,
             evacuation_node: str | None = None, priority: str | None = None) -> dict:
        """Created, then its status written through ``/status`` as virt-controller does."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"kubevirt.io/vmi-name": vmi_name}}
        if evacuation_node:
            meta["annotations"] = {"kubevirt.io/evacuationMigration": evacuation_node}
        spec: dict[str, Any] = {"vmiName": vmi_name}
        if priority:
            spec["priority"] = priority
        body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration", "metadata": meta,
                "spec": spec}
        created = self.custom.create_namespaced_custom_object(*KUBEVIRT, namespace, "virtualmachineinstancemigrations",
                                                              body)
        status: dict[str, Any] = {"phase": phase}
        if migration is not None:
            status["migrationState"] = migration
        return self.set_vmim_status(namespace, name, status) if status else created

    def set_vmim_status(self, namespace: str, name: str, status: dict) -> dict:
        return self.custom.patch_namespaced_custom_object_status(
            *KUBEVIRT, namespace, "virtualmachineinstancemigrations", name, {"status": status})

    # ---- launcher pods ----

    def launcher_pod(self, namespace: str, vmi: dict | None, node: str, *, name: str | None = None,
                     vmi_name: str | None = None, job_uid: str | None = None, annotations: dict | None = None,
                     ready: bool = True, launcher: bool = True, phase: str = "Running",
                     requests: dict | None = None, spec: dict | None = None) -> dict:
        """A virt-launcher pod bound to ``node`` and owned by ``vmi`` (as virt-controller creates it), Running and
        Ready as a kubelet would report it; ``requests`` of its compute container (default 100m, 2Gi); ``spec``:
        more fields of its spec."""
        vname = vmi_name or (vmi["metadata"]["name"] if vmi else "none")
        labels = {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vname} if launcher else {"app": "web"}
        if vmi:
            labels["kubevirt.io/created-by"] = vmi["metadata"]["uid"]
        if job_uid:
            labels["kubevirt.io/migrationJobUID"] = job_uid
        meta: dict[str, Any] = {
            "name": name or f"virt-launcher-{vname}-{uuid.uuid4().hex[:5]}", "namespace": namespace, "labels": labels,
            "annotations": {"kubevirt.io/domain": vname, "descheduler.alpha.kubernetes.io/request-evict-only": "",
                            **(annotations or {})},
        }
        if vmi:
            meta["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                        "name": vmi["metadata"]["name"], "uid": vmi["metadata"]["uid"],
                                        "controller": True, "blockOwnerDeletion": True}]
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                         "containers": [{"name": "compute", "image": LAUNCHER_IMAGE,
                                         "resources": {"requests": requests or {"cpu": "100m",
                                                                                "memory": "2Gi"}}}],
                         **(spec or {})}}
        self.core.create_namespaced_pod(namespace, body)
        status = {"phase": phase, "hostIP": "10.0.0.1", "podIP": "10.128.0.10", "startTime": rfc3339(30),
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                  "lastTransitionTime": rfc3339(29)}]}
        pod = self.core.patch_namespaced_pod_status(meta["name"], namespace, {"status": status})
        return self.api.sanitize_for_serialization(pod)

    def get_pod(self, namespace: str, name: str) -> dict:
        return self.api.sanitize_for_serialization(self.core.read_namespaced_pod(name, namespace))
