"""What has no binary in the end-to-end runs against real KubeVirt: kubelet, the scheduler's binding, virt-handler.

Everything else is KubeVirt's own code (``tests/e2e/kubevirt.py``): virt-api's eviction admitter marks VMIs,
virt-controller creates launcher pods, VMIMs (evacuation), migration target pods, moves VMIM phases, keeps the
``eviction-in-progress`` annotation, garbage-collects VMIMs, applies its limits and backoff. ``Nodes`` does only
what the three missing components do, each with the identity it has in a cluster:

- **the scheduler** (user ``system:kube-scheduler``, a client certificate; bootstrap RBAC binds its ClusterRole)
  binds an unbound launcher pod: a VM's first pod to the node the test placed it on, a migration target pod
  (label ``kubevirt.io/migrationJobUID``) to another Ready, uncordoned, untainted node (``targets`` may name it),
  the emptiest first;
- **kubelet** (user ``system:node:NODE`` in group ``system:nodes``; the RBAC-only control plane binds the
  ``system:node`` ClusterRole to that group, as clusters without the Node authorizer do) reports a bound pod
  Running with its containers started and Ready, ends a pod that is being deleted, and reports a launcher pod
  whose virt-launcher has exited (the source after a completed migration, the target after a failed one) as
  Succeeded or Failed;
- **virt-handler** (ServiceAccount ``kubevirt/kubevirt-handler``, KubeVirt's own ClusterRole) beats its
  heartbeat on its nodes (``kubevirt.io/schedulable=true`` and ``kubevirt.io/heartbeat``, every 60 to 132 s); starts a Scheduled VMI (phase Running, ``LiveMigratable`` True,
  ``migrationMethod``, ``selinuxContext: none`` as on a host without SELinux); and drives a migration through
  ``status.migrationState`` as its migration source and target controllers do: the target's address and ports
  (virt-controller then calls the migration TargetReady), the source's ``startTimestamp`` (Running), and after the
  copy time either the target's completion (``endTimestamp``, ``completed``, the node switch: ``status.nodeName``,
  the ``kubevirt.io/nodeName`` label, ``evacuationNodeName`` and ``kubevirt.io/eviction-source`` cleared:
  ``ackMigrationCompletion`` in ``pkg/virt-handler/migration-target.go``) or the source's failure (``failed``,
  ``completed``, ``endTimestamp``, ``failureReason``).

The outcome of each migration comes from ``plans`` (per VMI, one entry per attempt: ``"succeed"``, ``"fail"``
or ``"hold"``: stays in flight until the entry is changed) and else from ``fail_ratio`` with a seeded random; the
copy time from ``copy_seconds`` (per VMI, else ``default_copy``). With ``hardware`` (the outcome run: a scenario's
nodes, NICs and guests, ``physics.Hardware``) the scheduler picks targets as the simulator's scheduler does and
leaves a target that cannot schedule Pending with ``PodScheduled=False, reason Unschedulable`` (as kube-scheduler
reports it; virt-controller then times the migration out), the target's start-up takes the scenario's set-up time,
and each copy's length and end (converged, completion or progress timeout, transient failure) are the scenario's
physics. Every migration seen ends up in ``migrations``.

It polls (every ``interval``): lists of launcher pods, VMIs and nodes, then each object's next step, one write
each, as the three components would make them; a conflict is retried on the next pass.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e.actor.physics import Hardware
from tests.e2e.controlplane import ControlPlane, write_kubeconfig

log = logging.getLogger("actor.nodes")
KUBEVIRT = ("kubevirt.io", "v1")
LAUNCHER = "kubevirt.io=virt-launcher"
JOB_LABEL = "kubevirt.io/migrationJobUID"
EVICTION_SOURCE = "kubevirt.io/eviction-source"
SCHEDULABLE = "kubevirt.io/schedulable"
HEARTBEAT = "kubevirt.io/heartbeat"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _client(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg, persist_config=False)
    return client.ApiClient(cfg)


@dataclass
class Migration:
    uid: str
    namespace: str
    vmi: str
    source: str
    target: str
    started: float | None = None  # monotonic, when this actor wrote startTimestamp
    result: str | None = None  # succeed / fail once ended
    plan: str | None = None


@dataclass
class Nodes:
    cp: ControlPlane
    handler_kubeconfig: Path
    workdir: Path
    interval: float = 0.25
    default_copy: float = 2.0
    heartbeat: float = 60.0  # virt-handler's heartBeatInterval (pkg/virt-handler/vm.go)
    fail_ratio: float = 0.0
    seed: int = 1
    placement: dict[tuple[str, str], str] = field(default_factory=dict)
    targets: dict[tuple[str, str], str] = field(default_factory=dict)
    plans: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    copy_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    migrations: dict[str, Migration] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    hardware: Hardware | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._random = Random(self.seed)
        self._kubelets: dict[str, client.ApiClient] = {}
        self._exited: dict[tuple[str, str], str] = {}  # pod -> phase its virt-launcher exited with
        self._beats: dict[str, float] = {}  # node -> when its next heartbeat is due (monotonic)
        self._bound: dict[tuple[str, str], float] = {}  # pod -> when the scheduler bound it (monotonic)
        self._unschedulable: set[tuple[str, str]] = set()  # target pods reported unschedulable
        self.vmi_nodes: dict[tuple[str, str], str] = {}  # VMI -> status.nodeName, as of the last pass
        self.admin = self.cp.api_client()
        self.scheduler = _client(self._cert_kubeconfig("system:kube-scheduler", None))
        self.handler = _client(self.handler_kubeconfig)
        # no Node authorizer in this control plane: kubelets get the system:node ClusterRole through their group
        rbac = client.RbacAuthorizationV1Api(self.admin)
        try:
            rbac.create_cluster_role_binding({
                "metadata": {"name": "e2e-system-nodes"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]})
        except ApiException as e:
            if e.status != 409:
                raise

    def _cert_kubeconfig(self, user: str, group: str | None) -> Path:
        cert, key = self.cp.ca.issue(user, org=group)
        name = user.replace(":", "-")
        (self.workdir / f"{name}.crt").write_bytes(cert)
        (self.workdir / f"{name}.key").write_bytes(key)
        (self.workdir / f"{name}.key").chmod(0o600)
        return write_kubeconfig(self.workdir / f"{name}.kubeconfig", self.cp.url, self.cp.ca_path,
                                cert=self.workdir / f"{name}.crt", key=self.workdir / f"{name}.key", user=user)

    def kubelet(self, node: str) -> client.ApiClient:
        if node not in self._kubelets:
            self._kubelets[node] = _client(self._cert_kubeconfig(f"system:node:{node}", "system:nodes"))
        return self._kubelets[node]

    # ---- lifecycle ----

    def start(self) -> Nodes:
        self._thread = threading.Thread(target=self._run, name="actor-nodes", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as e:  # keep going; the test sees errors
                log.exception("actor pass failed")
                self.errors.append(repr(e))
            self._stop.wait(self.interval)

    # ---- one pass ----

    def step(self) -> None:
        core = client.CoreV1Api(self.admin)
        nodes = {n.metadata.name: n for n in _items(core.list_node)}
        with self.lock:
            self._label_nodes(nodes)
            pods = _items(core.list_pod_for_all_namespaces, label_selector=LAUNCHER)
            vmis = client.CustomObjectsApi(self.admin).list_cluster_custom_object(
                *KUBEVIRT, "virtualmachineinstances")["items"]
            by_vmi = {(v["metadata"]["namespace"], v["metadata"]["name"]): v for v in vmis}
            for pod in pods:
                self._pod(pod, nodes, pods, by_vmi)
            for vmi in vmis:
                self._vmi(vmi)
            self.vmi_nodes = {k: v.get("status", {}).get("nodeName", "") for k, v in by_vmi.items()}
            if self.hardware is not None:  # a copy whose migration is no longer the VMI's: its source stopped it
                current = {(v.get("status", {}).get("migrationState") or {}).get("migrationUid") for v in vmis}
                for uid in [u for u in self.hardware.copies.copies if u not in current]:
                    self.hardware.copies.stop(uid, time.monotonic())

    def _label_nodes(self, nodes: dict) -> None:
        """virt-handler's heartbeat (``pkg/virt-handler/heartbeat``): the schedulable label and the heartbeat
        annotation, at start and then every ``heartbeat`` seconds with KubeVirt's jitter (``wait.JitterUntil(do,
        1m, 1.2)``: 60 to 132 s). Each is a Node update, which is what wakes virt-controller's evacuation
        controller: it watches nodes, VMIs and VMIMs, not pods."""
        now = time.monotonic()
        for name, n in nodes.items():
            if name.startswith("barrier") or (n.metadata.labels or {}).get(SCHEDULABLE) == "true" and \
                    self._beats.get(name, 0) > now:
                continue
            self._beats[name] = now + self.heartbeat * (1 + self._random.random() * 1.2)
            self._call(lambda: client.CoreV1Api(self.handler).patch_node(name, {"metadata": {
                "labels": {SCHEDULABLE: "true"}, "annotations": {HEARTBEAT: now_rfc3339()}}}))

    # -- scheduler and kubelet --

    def _pod(self, pod, nodes: dict, pods: list, vmis: dict) -> None:
        ns, name = pod.metadata.namespace, pod.metadata.name
        vmi_name = (pod.metadata.annotations or {}).get("kubevirt.io/domain", "")
        node = pod.spec.node_name
        if pod.metadata.deletion_timestamp is not None:
            if node:  # kubelet: the containers stopped, the pod object goes
                self._call(lambda: client.CoreV1Api(self.kubelet(node)).delete_namespaced_pod(
                    name, ns, grace_period_seconds=0))
            return
        if not node:
            node = self._choose(pod, nodes, pods, vmis.get((ns, vmi_name)))
            if node is None:
                return
            body = client.V1Binding(metadata=client.V1ObjectMeta(name=name),
                                    target=client.V1ObjectReference(kind="Node", name=node, api_version="v1"))
            if self._call(lambda: client.CoreV1Api(self.scheduler).create_namespaced_pod_binding(
                    name, ns, body, _preload_content=False)):
                self._bound[(ns, name)] = time.monotonic()
            return
        exited = self._exited.get((ns, name))
        phase = pod.status.phase if pod.status else None
        if exited and phase not in ("Succeeded", "Failed"):
            self._report(pod, node, exited)
        elif not exited and phase in (None, "Pending"):
            self._report(pod, node, "Running")

    def _report(self, pod, node: str, phase: str) -> None:
        t = now_rfc3339()
        running = phase == "Running"
        statuses = [{"name": c.name, "image": c.image, "imageID": "", "restartCount": 0, "ready": running,
                     "started": running,
                     "state": {"running": {"startedAt": t}} if running else
                              {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1, "finishedAt": t,
                                              "reason": "Completed" if phase == "Succeeded" else "Error"}}}
                    for c in pod.spec.containers]
        status = {"phase": phase, "hostIP": _node_ip(node), "podIP": _node_ip(node, 100), "startTime": t,
                  "conditions": [{"type": k, "status": "True" if running or k == "PodScheduled" else "False",
                                  "lastTransitionTime": t} for k in ("PodScheduled", "Initialized",
                                                                      "ContainersReady", "Ready")],
                  "containerStatuses": statuses}
        self._call(lambda: client.CoreV1Api(self.kubelet(node)).patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}))

    def _choose(self, pod, nodes: dict, pods: list, vmi: dict | None) -> str | None:
        ns = pod.metadata.namespace
        vmi_name = (pod.metadata.annotations or {}).get("kubevirt.io/domain", "")
        key = (ns, vmi_name)
        if JOB_LABEL not in (pod.metadata.labels or {}):
            return self.placement.get(key)
        source = (vmi or {}).get("status", {}).get("nodeName")
        wanted = self.targets.get(key)
        if wanted:
            return wanted if wanted != source else None
        if self.hardware is not None:
            requests: dict[str, tuple[float, float]] = {}
            for p in pods:
                if p.spec.node_name and p.metadata.deletion_timestamp is None and (
                        p.status is None or p.status.phase not in ("Succeeded", "Failed")):
                    cpu, mem = self.hardware.requests((p.metadata.annotations or {}).get("kubevirt.io/domain", ""))
                    was = requests.get(p.spec.node_name, (0.0, 0.0))
                    requests[p.spec.node_name] = (was[0] + cpu, was[1] + mem)
            target = self.hardware.choose(vmi_name, source or "", requests)
            if target is None:
                self._report_unschedulable(pod)
            return target

        def usable(n) -> bool:
            ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            tainted = any(t.effect in ("NoSchedule", "NoExecute") for t in (n.spec.taints or []))
            return (ready and not n.spec.unschedulable and not tainted and n.metadata.name != source
                    and (n.metadata.labels or {}).get(SCHEDULABLE) == "true")

        load = {n: 0 for n, obj in nodes.items() if usable(obj)}
        for p in pods:
            if p.spec.node_name in load and (p.status is None or p.status.phase not in ("Succeeded", "Failed")):
                load[p.spec.node_name] += 1
        return min(load, key=lambda n: (load[n], n)) if load else None

    def _report_unschedulable(self, pod) -> None:
        """kube-scheduler's answer to a pod no node can take: ``PodScheduled`` False, reason Unschedulable (what
        virt-controller's pending-target timeout looks for)."""
        key = (pod.metadata.namespace, pod.metadata.name)
        if key in self._unschedulable:
            return
        status = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": "0/0 nodes are available: the VM's target cannot be placed.",
                                  "lastTransitionTime": now_rfc3339()}]}
        if self._call(lambda: client.CoreV1Api(self.scheduler).patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, {"status": status})):
            self._unschedulable.add(key)

    # -- virt-handler --

    def _vmi(self, vmi: dict) -> None:
        ns, name = vmi["metadata"]["namespace"], vmi["metadata"]["name"]
        status = vmi.setdefault("status", {})
        if status.get("phase") == "Scheduled" and status.get("nodeName"):
            status["phase"] = "Running"
            status["migrationMethod"] = "LiveMigration"
            status["selinuxContext"] = "none"
            conds = [c for c in status.get("conditions", []) if c["type"] != "LiveMigratable"]
            conds.append({"type": "LiveMigratable", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now_rfc3339()})
            status["conditions"] = conds
            self._update(vmi)
            return
        ms = status.get("migrationState")
        if status.get("phase") != "Running" or not ms or not ms.get("migrationUid") or ms.get("completed"):
            return
        uid = ms["migrationUid"]
        m = self.migrations.get(uid)
        if m is None:
            if not ms.get("targetNode"):
                return
            m = self.migrations[uid] = Migration(uid, ns, name, ms.get("sourceNode", ""), ms["targetNode"])
        if not ms.get("targetNodeAddress"):  # the target's virt-handler: its migration proxy listens
            ms["targetNodeAddress"] = _node_ip(m.target)
            ms["targetDirectMigrationNodePorts"] = {"49152": 0, "49153": 49152}
            self._update(vmi)
            return
        hw = self.hardware
        if not ms.get("startTimestamp"):  # the source's virt-handler: libvirt started the migration
            if hw is not None and time.monotonic() - self._bound.get((ns, ms.get("targetPod") or ""), 0) < hw.setup:
                return  # the target's virt-launcher is still starting
            if hw is None and self._plan(m) == "hold-start":
                return
            ms["startTimestamp"] = now_rfc3339()
            ms["mode"] = "PreCopy"
            if self._update(vmi):
                m.started = time.monotonic()
                if hw is not None:
                    hw.copies.start(uid, hw.vm(name), m.source, m.target, m.started)
            return
        if m.started is None:
            m.started = time.monotonic()
            if hw is not None:
                hw.copies.start(uid, hw.vm(name), m.source, m.target, m.started)
        reason = "e2e: the migration failed as the scenario said"
        if hw is not None:
            ended = hw.copies.outcome(uid, time.monotonic())
            if ended is None:
                return
            plan = m.plan = "fail" if ended[0] else "succeed"
            reason = f"e2e: {ended[1]}" if ended[0] else ""
        else:
            plan = self._plan(m)
            if plan in ("hold", "hold-start") or time.monotonic() - m.started < self.copy_seconds.get(
                    (ns, name), self.default_copy):
                return
        t = now_rfc3339()
        if plan == "fail":  # the source's virt-handler: libvirt's migration job failed
            ms.update(endTimestamp=t, failed=True, completed=True, failureReason=reason)
            target_pod = ms.get("targetPod")
            if self._update(vmi):
                self._finish(m, "fail", ns, target_pod, "Failed")
            return
        # the target's virt-handler: the domain runs here now (ackMigrationCompletion)
        ms.update(targetNodeDomainDetected=True, targetNodeDomainReadyTimestamp=t, endTimestamp=t, completed=True)
        source_pod = ms.get("sourcePod")
        vmi["metadata"].setdefault("labels", {})["kubevirt.io/nodeName"] = m.target
        (vmi["metadata"].get("annotations") or {}).pop(EVICTION_SOURCE, None)
        status["nodeName"] = m.target
        status.pop("evacuationNodeName", None)
        status["migrationTransport"] = "Unix"
        if self._update(vmi):
            self._finish(m, "succeed", ns, source_pod, "Succeeded")

    def _plan(self, m: Migration) -> str:
        if m.plan is None:
            queue = self.plans.get((m.namespace, m.vmi))
            if queue:
                m.plan = queue.pop(0)
            else:
                m.plan = "fail" if self._random.random() < self.fail_ratio else "succeed"
        return m.plan

    def set_plan(self, m: Migration, plan: str) -> None:
        with self.lock:
            m.plan = plan

    def _finish(self, m: Migration, result: str, ns: str, pod: str | None, phase: str) -> None:
        m.result = result
        if self.hardware is not None:
            self.hardware.copies.stop(m.uid, time.monotonic())
        if pod:  # its virt-launcher exits: kubelet reports the pod completed on the next pass
            self._exited[(ns, pod)] = phase

    # -- writes --

    def _update(self, vmi: dict) -> bool:
        """virt-handler's write: the whole VMI (its CRD has no status subresource), at the resourceVersion read."""
        return self._call(lambda: client.CustomObjectsApi(self.handler).replace_namespaced_custom_object(
            *KUBEVIRT, vmi["metadata"]["namespace"], "virtualmachineinstances", vmi["metadata"]["name"], vmi))

    def _call(self, fn) -> bool:
        try:
            fn()
            return True
        except ApiException as e:
            if e.status in (404, 409):
                return False  # gone, or changed since the list: the next pass reads it again
            self.errors.append(f"{e.status} {e.reason}: {(e.body or '')[:300]}")
            return False

    # ---- for tests ----

    def migrations_of(self, namespace: str, vmi: str) -> list[Migration]:
        with self.lock:
            return [m for m in self.migrations.values() if m.namespace == namespace and m.vmi == vmi]


class _View:
    """An API object as the API server sent it (JSON), read with the typed client's snake_case attribute names
    (``pod.spec.node_name``); labels and annotations stay plain dicts. The typed client's deserialisation of every
    launcher pod on every pass took most of the actor's CPU, and so slowed each step of a migration on a busy
    machine."""

    __slots__ = ("_d",)

    def __init__(self, d: dict) -> None:
        self._d = d

    def __getattr__(self, name: str):
        first, *rest = name.split("_")
        value = self._d.get(first + "".join(p.title() for p in rest))
        return value if name in ("annotations", "labels") else _wrap(value)


def _wrap(value):
    if isinstance(value, dict):
        return _View(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _items(list_fn, **kw) -> list:
    resp = list_fn(_preload_content=False, **kw)
    return [_View(o) for o in json.loads(resp.data)["items"]]


def _node_ip(node: str, offset: int = 0) -> str:
    """A stable made-up address per node (10.244.x.y): what kubelet and virt-handler report."""
    h = sum(node.encode()) * 7 + len(node)
    return f"10.{244 + offset % 10}.{h // 250 % 250}.{h % 250 + 1}"
