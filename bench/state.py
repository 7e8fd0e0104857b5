"""A synthetic cluster the size of a large KubeVirt fleet, as a ``--snapshot`` file.

Shape (the issue's): N VMIs, of which 10% have a migration in flight, 30% have
1 to 6 finished migrations inside the 48h history window and the rest never
migrated; their virt-launcher pods (plus the target pods of running
migrations and some completed source pods); up to 5 finished VMIMs per VMI
(KubeVirt keeps the 5 newest); 500 nodes, a few of them cordoned. A few
thousand unrelated pods and some launcher pods whose VMI is gone complete the
decision table.

The VMs with a migration in flight sit on the first half of the nodes (the
"busy" nodes, dozens leaving each), so that the other half is quiet and
descheduler evictions there reach the cooldown rule instead of all stopping at
the node budget. A few more nodes have exactly one VM leaving, as a guarded
cluster's nodes do (the node budget lets one go at a time): evictions of the
other VMs there are the node budget's usual refusal.

Objects carry the fields the guard reads and the metadata real objects carry
around them (labels, annotations, owner references, finalizers), but not the
kilobytes of domain spec and conditions a real VMI has: the snapshot is a
state to load, and its size on disk is not what is measured.

Everything is derived from a seeded ``random.Random`` and the fixed ``NOW``,
so the same arguments give the same file and the same decisions.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)
NOW_TEXT = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
NODES = 500
NAMESPACES = 200
CORDON_EVERY = 25  # every 25th quiet node is cordoned (being drained)
KEEP_FINISHED = 5  # KubeVirt keeps the 5 newest finished VMIMs per VMI
SHARE_IN_FLIGHT = 0.10
SHARE_MIGRATED = 0.30
ONE_LEAVING_NODES = 50  # at most; about one per 2,000 VMIs
ONE_LEAVING_STAYING = 20  # VMs on each of them besides the one leaving


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Targets:
    """Pods to evict, grouped by the part of the decision table they exercise."""

    groups: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def add(self, group: str, namespace: str, pod: str) -> None:
        self.groups.setdefault(group, []).append((namespace, pod))


@dataclass
class State:
    items: list[dict]
    targets: Targets
    counts: dict[str, int]


class _Builder:
    def __init__(self, vmis: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = vmis
        self.items: list[dict] = []
        self.targets = Targets()
        self.busy = [f"node-{i:03d}" for i in range(NODES // 2)]
        quiet = [f"node-{i:03d}" for i in range(NODES // 2, NODES)]
        self.cordoned = set(quiet[::CORDON_EVERY])
        self.quiet = quiet
        self.all_nodes = self.busy + quiet
        self.counts = {"VirtualMachineInstance": 0, "VirtualMachineInstanceMigration": 0, "Pod": 0, "Node": 0}

    # ---- small helpers -------------------------------------------------------

    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def suffix(self) -> str:
        return "".join(self.rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))

    def emit(self, obj: dict) -> None:
        self.items.append(obj)
        self.counts[obj["kind"]] += 1

    def other_node(self, node: str, pool: list[str]) -> str:
        while True:
            n = self.rng.choice(pool)
            if n != node:
                return n

    # ---- objects -------------------------------------------------------------

    def node(self, name: str) -> dict:
        spec: dict = {"podCIDR": "10.128.0.0/23", "providerID": f"baremetal://{name}"}
        if name in self.cordoned:
            spec["unschedulable"] = True
            spec["taints"] = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": self.uid(), "resourceVersion": str(self.rng.randrange(10**7, 10**8)),
                         "labels": {"kubernetes.io/hostname": name, "kubevirt.io/schedulable": "true",
                                    "node-role.kubernetes.io/worker": ""}},
            "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }

    def vmi(self, ns: str, name: str, uid: str, node: str, migration: dict | None, evacuation: str = "") -> dict:
        status: dict = {"phase": "Running", "nodeName": node, "qosClass": "Burstable",
                        "activePods": {self.uid(): node}}
        if migration:
            status["migrationState"] = migration
        if evacuation:
            status["evacuationNodeName"] = evacuation
        return {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {
                "name": name, "namespace": ns, "uid": uid, "resourceVersion": str(self.rng.randrange(10**7, 10**8)),
                "generation": 4, "creationTimestamp": ts(60 * 86400),
                "labels": {"kubevirt.io/nodeName": node, "kubevirt.io/vm": name, "vm.kubevirt.io/name": name},
                "annotations": {"kubevirt.io/latest-observed-api-version": "v1",
                                "kubevirt.io/storage-observed-api-version": "v1"},
                "finalizers": ["kubevirt.io/virtualMachineControllerFinalize", "foregroundDeleteVirtualMachine"],
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name,
                                     "uid": self.uid(), "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {"evictionStrategy": "LiveMigrate", "domain": {"cpu": {"cores": 2}, "memory": {"guest": "8Gi"}}},
            "status": status,
        }

    def pod(self, ns: str, vmi_name: str, vmi_uid: str, node: str, phase: str = "Running", job: str = "",
            in_progress: bool = False) -> dict:
        name = f"virt-launcher-{vmi_name}-{self.suffix()}"
        labels = {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": vmi_uid,
                  "vm.kubevirt.io/name": vmi_name, "kubevirt.io/domain": vmi_name}
        if job:
            labels["kubevirt.io/migrationJobUID"] = job
        annotations = {"kubevirt.io/domain": vmi_name, "descheduler.alpha.kubernetes.io/request-evict-only": "",
                       "kubevirt.io/migrationTransportUnix": "true"}
        if in_progress:
            annotations["descheduler.alpha.kubernetes.io/eviction-in-progress"] = "true"
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": ns, "uid": self.uid(),
                "resourceVersion": str(self.rng.randrange(10**7, 10**8)), "generateName": f"virt-launcher-{vmi_name}-",
                "labels": labels, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                     "name": vmi_name, "uid": vmi_uid, "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {"nodeName": node, "serviceAccountName": "default", "priority": 0,
                     "terminationGracePeriodSeconds": 210},
            "status": {"phase": phase, "qosClass": "Burstable", "hostIP": "10.0.0.12"},
        }

    def mstate(self, uid: str, src: str, dst: str, start: float, end: float | None = None, failed: bool = False) -> dict:
        s = {"migrationUid": uid, "sourceNode": src, "targetNode": dst, "startTimestamp": ts(start), "mode": "PreCopy"}
        if end is not None:
            s.update(endTimestamp=ts(end), completed=not failed, failed=failed)
        return s

    def vmim(self, ns: str, vmi_name: str, phase: str, created: float, state: dict | None, uid: str,
             evacuation: str = "") -> dict:
        meta: dict = {"name": f"{vmi_name}-mig-{self.suffix()}", "namespace": ns, "uid": uid,
                      "resourceVersion": str(self.rng.randrange(10**7, 10**8)), "generation": 1,
                      "creationTimestamp": ts(created), "labels": {"kubevirt.io/vmi-name": vmi_name},
                      "finalizers": ["kubevirt.io/migrationJobFinalize"]}
        if evacuation:
            meta["annotations"] = {"kubevirt.io/evacuationMigration": evacuation}
        status: dict = {"phase": phase, "phaseTransitionTimestamps": [{"phase": "Pending",
                                                                       "phaseTransitionTimestamp": ts(created)}]}
        if state:
            status["migrationState"] = state
        return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration", "metadata": meta,
                "spec": {"vmiName": vmi_name}, "status": status}

    # ---- VMs by class --------------------------------------------------------

    def finished_history(self, ns: str, name: str, node: str, count: int, last_end: float) -> tuple[dict, list[dict]]:
        """``count`` finished migrations, the newest ending ``last_end`` seconds ago and
        the older ones spread back towards the edge of the 48h window. Returns the
        VMI's ``migrationState`` (the newest) and the VMIMs KubeVirt still keeps."""
        ends = sorted([last_end] + [self.rng.uniform(last_end + 600, 47 * 3600) for _ in range(count - 1)])
        vmims, state = [], {}
        for k, end in enumerate(reversed(ends)):  # oldest first
            duration = self.rng.uniform(20, 1200)
            failed = self.rng.random() < 0.15
            uid = self.uid()
            src, dst = self.other_node(node, self.all_nodes), node
            state = self.mstate(uid, src, dst, end + duration, end, failed)
            if k >= count - KEEP_FINISHED:
                vmims.append(self.vmim(ns, name, "Failed" if failed else "Succeeded", end + duration + 5, state, uid))
        return state, vmims

    def in_flight(self, ns: str, name: str, uid: str) -> None:
        node = self.rng.choice(self.busy)
        kind = self.rng.random()
        history, older = {}, []
        if self.rng.random() < 0.3:
            history, older = self.finished_history(ns, name, node, self.rng.randint(1, 3), self.rng.uniform(4 * 3600, 40 * 3600))
        evacuation = node if self.rng.random() < 0.5 else ""
        for m in older:
            self.emit(m)
        if kind < 0.5:  # running: migrationState started, not ended; target pod on another node
            job = self.uid()
            start = self.rng.uniform(10, 3000)
            dst = self.other_node(node, self.quiet)
            state = self.mstate(job, node, dst, start)
            self.emit(self.vmi(ns, name, uid, node, state, evacuation))
            self.emit(self.vmim(ns, name, "Running", start + 3, state, job, evacuation))
            source = self.pod(ns, name, uid, node, in_progress=bool(evacuation))
            target = self.pod(ns, name, uid, dst, phase="Running", job=job)
            self.emit(source)
            self.emit(target)
            self.targets.add("in_flight_source", ns, source["metadata"]["name"])
            self.targets.add("migration_target", ns, target["metadata"]["name"])
        elif kind < 0.8:  # queued: a Pending VMIM, the VMI's migrationState (if any) is an older, ended one
            self.emit(self.vmi(ns, name, uid, node, history or None, evacuation))
            self.emit(self.vmim(ns, name, "Pending", self.rng.uniform(5, 2400), None, self.uid(), evacuation))
            source = self.pod(ns, name, uid, node, in_progress=bool(evacuation))
            self.emit(source)
            self.targets.add("in_flight_source", ns, source["metadata"]["name"])
        else:  # marked for evacuation, last attempt failed, the retry's VMIM not created yet
            job = self.uid()
            start = self.rng.uniform(60, 1800)
            state = self.mstate(job, node, self.other_node(node, self.quiet), start, start - 30, failed=True)
            self.emit(self.vmi(ns, name, uid, node, state, node))
            self.emit(self.vmim(ns, name, "Failed", start + 3, state, job, node))
            source = self.pod(ns, name, uid, node, in_progress=True)
            self.emit(source)
            self.targets.add("evacuation_pending", ns, source["metadata"]["name"])

    def migrated(self, ns: str, name: str, uid: str) -> None:
        node = self.rng.choice(self.all_nodes)
        count = self.rng.randint(1, 6)
        recent = self.rng.random() < 0.5
        last_end = self.rng.uniform(60, 2 * 3600) if recent else self.rng.uniform(2 * 3600, 46 * 3600)
        state, vmims = self.finished_history(ns, name, node, count, last_end)
        self.emit(self.vmi(ns, name, uid, node, state))
        for m in vmims:
            self.emit(m)
        launcher = self.pod(ns, name, uid, node)
        self.emit(launcher)
        if self.rng.random() < 0.3:  # the old source pod of the last migration, completed
            self.emit(self.pod(ns, name, uid, state["sourceNode"], phase="Succeeded"))
        self.targets.add(self._group(node, "recently_migrated"), ns, launcher["metadata"]["name"])

    def never_migrated(self, ns: str, name: str, uid: str) -> None:
        node = self.rng.choice(self.all_nodes)
        self.emit(self.vmi(ns, name, uid, node, None))
        launcher = self.pod(ns, name, uid, node)
        self.emit(launcher)
        self.targets.add(self._group(node, "never_migrated"), ns, launcher["metadata"]["name"])

    def _group(self, node: str, quiet_group: str) -> str:
        if node in self.cordoned:
            return "cordoned_node"
        if node in self.busy:
            return "busy_node"
        return quiet_group

    # ---- the whole cluster ---------------------------------------------------

    def one_leaving(self, node: str, first: int) -> int:
        """``node`` with one VM migrating away (a running VMIM) and ``ONE_LEAVING_STAYING`` quiet VMs beside it."""
        i = first
        ns, name, uid = f"tenant-{i % NAMESPACES:03d}", f"vm-{i:06d}", self.uid()
        job, start = self.uid(), self.rng.uniform(10, 300)
        dst = self.other_node(node, self.quiet)
        state = self.mstate(job, node, dst, start)
        self.emit(self.vmi(ns, name, uid, node, state))
        self.emit(self.vmim(ns, name, "Running", start + 3, state, job))
        self.emit(self.pod(ns, name, uid, node))
        self.emit(self.pod(ns, name, uid, dst, phase="Running", job=job))
        for i in range(first + 1, first + 1 + ONE_LEAVING_STAYING):
            ns, name, uid = f"tenant-{i % NAMESPACES:03d}", f"vm-{i:06d}", self.uid()
            self.emit(self.vmi(ns, name, uid, node, None))
            launcher = self.pod(ns, name, uid, node)
            self.emit(launcher)
            self.targets.add("one_leaving_node", ns, launcher["metadata"]["name"])
        return i + 1

    def build(self) -> State:
        for name in self.all_nodes:
            self.emit(self.node(name))
        one_leaving = [f"node-one-{k:02d}" for k in range(min(ONE_LEAVING_NODES, max(1, self.n // 2000)))]
        n = self.n - len(one_leaving) * (1 + ONE_LEAVING_STAYING)
        classes = [self.in_flight] * round(n * SHARE_IN_FLIGHT) + [self.migrated] * round(n * SHARE_MIGRATED)
        classes += [self.never_migrated] * (n - len(classes))
        self.rng.shuffle(classes)
        for i, make in enumerate(classes):
            make(f"tenant-{i % NAMESPACES:03d}", f"vm-{i:06d}", self.uid())
        i = len(classes)
        for node in one_leaving:
            self.emit(self.node(node))
            i = self.one_leaving(node, i)
        for i in range(max(10, self.n // 20)):  # unrelated workloads
            ns = f"apps-{i % 50:02d}"
            name = f"web-{i:05d}-{self.suffix()}"
            self.emit({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": ns, "uid": self.uid(), "labels": {"app": "web"}},
                       "spec": {"nodeName": self.rng.choice(self.all_nodes)}, "status": {"phase": "Running"}})
            self.targets.add("not_a_launcher", ns, name)
        for i in range(max(5, self.n // 200)):  # launchers whose VMI was deleted a moment ago
            ns = f"tenant-{i % NAMESPACES:03d}"
            pod = self.pod(ns, f"gone-{i:05d}", self.uid(), self.rng.choice(self.quiet))
            self.emit(pod)
            self.targets.add("vmi_gone", ns, pod["metadata"]["name"])
        for i in range(50):
            self.targets.add("unknown_pod", f"tenant-{i % NAMESPACES:03d}", f"virt-launcher-nope-{i:05d}")
        return State(items=self.items, targets=self.targets, counts=self.counts)


def build_state(vmis: int, seed: int = 6) -> State:
    return _Builder(vmis, seed).build()


def write_snapshot(state: State, path: Path) -> int:
    """Write the state as a Kubernetes ``List`` in JSON, the shape ``kubectl get -o json`` prints."""
    data = orjson.dumps({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": state.items})
    path.write_bytes(data)
    return len(data)
