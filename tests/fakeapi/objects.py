"""Builders for the objects the guard reads, in the shapes KubeVirt and Kubernetes write them.

Only what matters plus enough realistic padding (owner references, container
specs, conditions) that parsing costs are honest. Timestamps are RFC 3339
strings; pass epoch seconds (float) or a ready string.
"""

from __future__ import annotations

import uuid as _uuid
from datetime import datetime, timezone
from typing import Any

Time = float | str | None


def ts(value: Time) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uid(uid: str | None) -> str:
    return uid or str(_uuid.uuid4())


def node(name: str, unschedulable: bool = False, uid: str | None = None) -> dict:
    spec: dict[str, Any] = {"podCIDR": "10.128.0.0/23"}
    if unschedulable:
        spec["unschedulable"] = True
        spec["taints"] = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": _uid(uid), "labels": {"kubernetes.io/hostname": name,
                                                                "kubevirt.io/schedulable": "true"}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }


def migration_state(
    start: Time = None,
    end: Time = None,
    source_node: str = "",
    target_node: str = "",
    uid: str = "",
    failed: bool = False,
) -> dict:
    state: dict[str, Any] = {
        "migrationUid": uid,
        "sourceNode": source_node,
        "targetNode": target_node,
        "mode": "PreCopy",
        "completed": end is not None and not failed,
        "failed": failed,
    }
    if start is not None:
        state["startTimestamp"] = ts(start)
    if end is not None:
        state["endTimestamp"] = ts(end)
    return state


def vmi(
    namespace: str,
    name: str,
    node: str = "",
    uid: str | None = None,
    evacuation_node: str = "",
    migration: dict | None = None,
    created: Time = None,
    phase: str = "Running",
) -> dict:
    status: dict[str, Any] = {
        "phase": phase,
        "nodeName": node,
        "migrationMethod": "BlockMigration",
        "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": ts(created)},
            {"type": "LiveMigratable", "status": "True", "lastProbeTime": None, "lastTransitionTime": None},
        ],
        "interfaces": [{"name": "default", "ipAddress": "10.128.4.37", "mac": "02:5e:1a:00:00:01"}],
        "guestOSInfo": {"id": "rhel", "name": "Red Hat Enterprise Linux", "version": "9.4"},
    }
    if evacuation_node:
        status["evacuationNodeName"] = evacuation_node
    if migration is not None:
        status["migrationState"] = migration
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": _uid(uid),
        "labels": {"kubevirt.io/nodeName": node, "vm.kubevirt.io/name": name},
        "annotations": {"kubevirt.io/latest-observed-api-version": "v1", "kubevirt.io/storage-observed-api-version": "v1"},
        "finalizers": ["kubevirt.io/virtualMachineControllerFinalize", "foregroundDeleteVirtualMachine"],
    }
    if created is not None:
        meta["creationTimestamp"] = ts(created)
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": {
            "evictionStrategy": "LiveMigrate",
            "domain": {"cpu": {"cores": 2, "sockets": 1, "threads": 1}, "memory": {"guest": "16Gi"},
                       "devices": {"disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}],
                                   "interfaces": [{"name": "default", "masquerade": {}}]}},
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [{"name": "rootdisk", "persistentVolumeClaim": {"claimName": f"{name}-rootdisk"}}],
        },
        "status": status,
    }


def launcher_pod(
    namespace: str,
    vmi_name: str,
    node: str,
    name: str | None = None,
    phase: str = "Running",
    vmi_uid: str = "",
    migration_job_uid: str = "",
    uid: str | None = None,
    extra_annotations: dict | None = None,
    ready: bool | None = None,
) -> dict:
    """``ready``: the pod's Ready condition; by default True exactly when it is Running."""
    ready = phase == "Running" if ready is None else ready
    labels = {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": vmi_uid, "vm.kubevirt.io/name": vmi_name}
    if migration_job_uid:
        labels["kubevirt.io/migrationJobUID"] = migration_job_uid
    annotations = {"kubevirt.io/domain": vmi_name, "descheduler.alpha.kubernetes.io/request-evict-only": ""}
    annotations.update(extra_annotations or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"virt-launcher-{vmi_name}-{_uuid.uuid4().hex[:5]}",
            "namespace": namespace,
            "uid": _uid(uid),
            "generateName": f"virt-launcher-{vmi_name}-",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": vmi_name,
                                 "uid": vmi_uid, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 210,
            "containers": [{"name": "compute", "image": "registry.example/virt-launcher:v1.8.0",
                            "resources": {"requests": {"cpu": "400m", "memory": "16706Mi",
                                                       "devices.kubevirt.io/kvm": "1"},
                                          "limits": {"devices.kubevirt.io/kvm": "1"}}}],
        },
        "status": {"phase": phase, "podIP": "10.128.4.37", "qosClass": "Burstable",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def vmim(
    namespace: str,
    name: str,
    vmi_name: str,
    phase: str = "Succeeded",
    start: Time = None,
    end: Time = None,
    source_node: str = "",
    target_node: str = "",
    evacuation_node: str = "",
    uid: str | None = None,
    created: Time = None,
    priority: str = "",
    workload_update: bool = False,
    cause: str = "",
) -> dict:
    """``priority``: spec.priority (KubeVirt >= 1.7); ``workload_update``: the workload updater's annotation;
    ``cause``: the guard's ``kubevirt-eviction-guard.io/cause``."""
    uid = _uid(uid)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid,
                            "labels": {"kubevirt.io/vmi-name": vmi_name}, "annotations": {}}
    if evacuation_node:
        meta["annotations"]["kubevirt.io/evacuationMigration"] = evacuation_node
    if workload_update:
        meta["annotations"]["kubevirt.io/workloadUpdateMigration"] = ""
    if cause:
        meta["annotations"]["kubevirt-eviction-guard.io/cause"] = cause
    if created is not None:
        meta["creationTimestamp"] = ts(created)
    status: dict[str, Any] = {"phase": phase}
    if start is not None or source_node:
        status["migrationState"] = migration_state(start, end, source_node, target_node, uid, failed=phase == "Failed")
    transitions = [{"phase": "Pending", "phaseTransitionTimestamp": ts(created)}]
    if phase in ("Succeeded", "Failed") and end is not None:
        transitions.append({"phase": phase, "phaseTransitionTimestamp": ts(end)})
    status["phaseTransitionTimestamps"] = transitions
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstanceMigration",
        "metadata": meta,
        "spec": {"vmiName": vmi_name, **({"priority": priority} if priority else {})},
        "status": status,
    }
