"""The simulator's KubeVirt, in real time, writing what it holds to the real API server.

``app.sim.kubevirt.KubeVirt`` is the project's model of KubeVirt v1.7+ (evacuation, 5 migrations per cluster and 2
outbound per node by priority, retries 20 s doubling, the shared-NIC copy, the pod annotation that follows the mark,
5 kept VMIMs). Here its ``publish_*`` hooks write the objects as the API server would hold them: nodes and launcher
pods as kubelet reports them (Running, Ready, requests, owner reference to the VMI), VMIs and VMIMs as
virt-controller writes them (``status.evacuationNodeName``, ``migrationState`` with real timestamps, VMIM phases and
their transition times, ``kubevirt.io/eviction-source``, the ``EvictionRequested`` condition). The model then runs
against the same scenario in both places, so a difference between the real run and the simulator's is the
descheduler's (or the guard's), not KubeVirt's.

Writes go through one ``Writer`` thread, in the order the model made them, so the API server sees the same sequence
virt-controller would produce. Merge patches carry only the fields KubeVirt owns: what others write (the guard's
history annotation, its ``eviction-in-progress`` patch) is left alone. The API server's uids are not known when the
model names an object, so bodies carry placeholders (``@vmi:NAME``, ``@vmim:UID``) that the writer resolves.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import urllib3
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from app.domain.records import EVICTION_IN_PROGRESS
from app.sim.kubevirt import NAMESPACE, PRIORITY_NAMES, VMI, KubeVirt, Migration, Pod
from app.timefmt import format_timestamp
from tests.e2e.objects import KUBEVIRT, KubeObjects

log = logging.getLogger("actor.kubevirt")
MERGE = "application/merge-patch+json"
EVICTION_SOURCE = "kubevirt.io/eviction-source"
VMIMS = "virtualmachineinstancemigrations"


class Clock:
    """Run time: whole seconds since the start, as the model counts them, and wall-clock timestamps for objects."""

    def __init__(self) -> None:
        self.mono0 = time.monotonic()
        self.wall0 = time.time()

    def elapsed(self) -> float:
        return time.monotonic() - self.mono0

    def now(self) -> int:
        return int(self.elapsed())

    def stamp(self, t: float | None) -> str | None:
        return None if t is None else format_timestamp(self.wall0 + t)


class Writer:
    """One thread applying the model's writes in order. ``wait(seq)`` returns once write ``seq`` is done."""

    def __init__(self, api_client: ApiClient) -> None:
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.objects = KubeObjects(api_client)
        self.uids: dict[str, str] = {}  # placeholder -> the API server's uid
        self._queue: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self._cv = threading.Condition()
        self._next = 0
        self._done = 0
        self.failures: list[str] = []
        self.writes = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self._thread.start()

    def put(self, op: Callable[[], None]) -> int:
        with self._cv:
            self._next += 1
            self._queue.append((self._next, op))
            self._cv.notify_all()
            return self._next

    def last(self) -> int:
        with self._cv:
            return self._next

    def wait(self, seq: int | None = None, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            target = self._next if seq is None else seq
            while self._done < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if not self._queue:
                    return
                seq, op = self._queue.popleft()
            self._apply(op)
            with self._cv:
                self._done = seq
                self._cv.notify_all()

    def _apply(self, op: Callable[[], None]) -> None:
        for attempt in range(6):
            try:
                op()
                self.writes += 1
                return
            except ApiException as e:
                if e.status in (404, 409) or 400 <= (e.status or 0) < 500 and e.status != 429:
                    self.failures.append(f"{getattr(op, '__name__', 'write')}: {e.status} {e.reason}: "
                                         f"{(e.body or b'')[:300]!r}")
                    log.warning("write refused: %s", self.failures[-1])
                    return
                err = f"{e.status} {e.reason}"
            except (urllib3.exceptions.HTTPError, OSError) as e:
                err = f"{type(e).__name__}: {e}"
            time.sleep(0.2 * (attempt + 1))
        self.failures.append(f"{getattr(op, '__name__', 'write')}: gave up: {err}")
        log.error("write failed: %s", self.failures[-1])

    # ---- the calls (run on the writer thread) --------------------------------

    def resolve(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("@"):
            return self.uids.get(value, value)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value

    @staticmethod
    def _json(resp) -> dict:
        try:
            return orjson.loads(resp.read())
        finally:
            resp.release_conn()

    def call(self, method, *args, **kw) -> dict:
        return self._json(method(*args, _preload_content=False, _request_timeout=(5, 20), **kw))


class _VMIMDeletes:
    """The ``store`` the model writes to: every ``publish_*`` is overridden here, so what is left is the deletion of
    retained VMIMs, a DELETE on the API server."""

    def __init__(self, kv: RealKubeVirt) -> None:
        self.kv = kv

    def upsert(self, record) -> None:
        pass

    def delete(self, kind: str, key: tuple[str, str]) -> None:
        if kind == "vmim":
            self.kv.delete_vmim(key[1])


class RealKubeVirt(KubeVirt):
    def __init__(self, settings, nodes, vms, placement, rng, schedule, writer: Writer, clock: Clock) -> None:
        self.writer = writer
        self.clock = clock
        self._written: dict[tuple[str, str], Any] = {}  # last body written per (kind, name, part)
        self._transitions: dict[str, list[dict]] = {}
        self._source_pods: dict[str, str] = {}  # VMIM -> the pod the VM ran in when it started
        self._deferred: list[Callable[[], None]] | None = None
        self.max_leaving = 0
        super().__init__(settings, nodes, vms, placement, _VMIMDeletes(self), rng, schedule)  # type: ignore[arg-type]
        self.publish_kubevirt()

    def publish_kubevirt(self) -> None:
        """The KubeVirt CR (namespace ``kubevirt``) with the migration limits the model enforces."""
        if self._changed(("kubevirt", "kubevirt"), True):
            w, limits = self.writer, {"parallelOutboundMigrationsPerNode": self.s.parallel_outbound_migrations_per_node,
                                      "parallelMigrationsPerCluster": self.s.parallel_migrations_per_cluster}
            body = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                    "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                    "spec": {"configuration": {"evictionStrategy": "LiveMigrate", "migrations": limits}}}

            def create() -> None:
                w.objects.namespace("kubevirt")
                w.call(w.custom.create_namespaced_custom_object, *KUBEVIRT, "kubevirt", "kubevirts", body)
            self._put("create kubevirt", create)

    # ---- helpers -------------------------------------------------------------

    def _changed(self, key: tuple[str, str], body: Any) -> bool:
        if self._written.get(key) == body:
            return False
        self._written[key] = body
        return True

    def _now_stamp(self) -> str:
        return self.clock.stamp(self.clock.elapsed())  # type: ignore[return-value]

    def _put(self, name: str, fn: Callable[[], None]) -> None:
        fn.__name__ = name
        if self._deferred is not None and name.startswith("complete pod"):
            self._deferred.append(fn)
        else:
            self.writer.put(fn)

    # ---- nodes -----------------------------------------------------------------

    def publish_node(self, n) -> None:
        w = self.writer
        spec = {"unschedulable": True if n.cordoned else None,
                "taints": ([{"key": "kubevirt.io/soft-taint", "effect": "PreferNoSchedule"}] * n.soft_taints
                           + ([{"key": n.no_schedule, "effect": "NoSchedule"}] if n.no_schedule else [])) or None}
        first = ("node", n.name) not in self._written
        if not self._changed(("node", n.name), spec):
            return
        if first:
            def create() -> None:
                w.objects.node(n.name, cpu=_cpu(n.cpu), memory=f"{int(n.memory * 1024)}Mi",
                               labels={"kubevirt.io/schedulable": "true"})
                # admission (TaintNodesByCondition) adds node.kubernetes.io/not-ready to a new node; the node
                # lifecycle controller lifts it once the node is Ready: here, the actor does
                w.call(w.core.patch_node, n.name, {"spec": spec}, _content_type=MERGE)
            self._put(f"create node {n.name}", create)
        else:
            self._put(f"patch node {n.name}",
                      lambda: w.call(w.core.patch_node, n.name, {"spec": spec}, _content_type=MERGE))

    # ---- pods ------------------------------------------------------------------

    def publish_pod(self, p: Pod) -> None:
        w = self.writer
        annotations = {EVICTION_IN_PROGRESS: "true" if p.eviction_in_progress else None}
        first = ("pod", p.name) not in self._written
        if not self._changed(("pod", p.name), annotations):
            return
        if first:
            if ("vmi", p.vmi.name) not in self._written:
                self.publish_vmi(p.vmi)  # the pod's owner reference needs the VMI's uid
            vm = p.vmi.vm
            vmi_ref = {"metadata": {"name": p.vmi.name, "uid": f"@vmi:{p.vmi.name}"}}
            job = f"@vmim:{p.migration.uid}" if p.migration is not None else None
            extra = {EVICTION_IN_PROGRESS: "true"} if p.eviction_in_progress else None
            requests = {"cpu": _cpu(vm.vcpus / self.s.cpu_allocation_ratio), "memory": f"{int(vm.memory * 1024)}Mi"}

            def create() -> None:
                w.objects.launcher_pod(NAMESPACE, w.resolve(vmi_ref), p.node.name, name=p.name,
                                       job_uid=w.resolve(job), annotations=extra, ready=p.migration is None,
                                       requests=requests)
            self._put(f"create pod {p.name}", create)
        else:
            self._put(f"annotate pod {p.name}", lambda: w.call(
                w.core.patch_namespaced_pod, p.name, NAMESPACE, {"metadata": {"annotations": annotations}},
                _content_type=MERGE))

    def remove_annotation(self, pod: Pod) -> None:
        """Someone else's ``eviction-in-progress`` on a pod that should not carry it: virt-controller removes it."""
        w = self.writer
        pod.eviction_in_progress = False
        self._written[("pod", pod.name)] = {EVICTION_IN_PROGRESS: None}
        self._put(f"unannotate pod {pod.name}", lambda: w.call(
            w.core.patch_namespaced_pod, pod.name, NAMESPACE,
            {"metadata": {"annotations": {EVICTION_IN_PROGRESS: None}}}, _content_type=MERGE))

    def _delete_pod(self, pod: Pod) -> None:
        """kubelet: the pod completes (Succeeded for a migrated-away source, Failed for a failed target), then the
        API object goes (grace 0: no kubelet is there to confirm a graceful deletion)."""
        w = self.writer
        phase = "Failed" if pod.migration is not None and pod.migration.failed else "Succeeded"
        status = _pod_status(phase, ready=False, now=self._now_stamp())

        def complete() -> None:
            w.call(w.core.patch_namespaced_pod_status, pod.name, NAMESPACE, status, _content_type=MERGE)
            w.call(w.core.delete_namespaced_pod, pod.name, NAMESPACE, grace_period_seconds=0)
        self._put(f"complete pod {pod.name}", complete)
        super()._delete_pod(pod)

    def _finish(self, now: int, m: Migration, failed: bool, failure: str = "") -> None:
        """As the model; the source pod completes after the VMI shows the VM on its target (KubeVirt's order), and
        the target pod turns Ready."""
        self._deferred = []
        try:
            super()._finish(now, m, failed, failure)
        finally:
            deferred, self._deferred = self._deferred, None
        if not failed and m.target_pod is not None and m.target_pod.name in self.pods:
            w, name, status = self.writer, m.target_pod.name, _pod_status("Running", True, self._now_stamp())
            self._put(f"ready pod {name}", lambda: w.call(w.core.patch_namespaced_pod_status, name, NAMESPACE,
                                                          status, _content_type=MERGE))
        for fn in deferred:
            self.writer.put(fn)

    # ---- VMIs ------------------------------------------------------------------

    def publish_vmi(self, v: VMI) -> None:
        w = self.writer
        meta = {"labels": {"kubevirt.io/nodeName": v.node.name},
                "annotations": {EVICTION_SOURCE: "descheduler" if v.from_descheduler else None}}
        conditions = [{"type": "Ready", "status": "True"}, {"type": "LiveMigratable", "status": "True"}]
        if v.evacuation_node:
            conditions.append({"type": "EvictionRequested", "status": "True", "reason": "EvictionRequested",
                               "message": "VMI is marked for eviction"})
        status = {"phase": "Running", "migrationMethod": "LiveMigration", "conditions": conditions,
                  "nodeName": v.node.name, "evacuationNodeName": v.evacuation_node or None}
        if v.migration is not None and v.migration.copy_start is not None:
            status["migrationState"] = self._state(v.migration)
        first = ("vmi", v.name) not in self._written
        if not self._changed(("vmi", v.name), (meta, status)):
            return
        if first:
            def create() -> None:
                obj = w.objects.vmi(NAMESPACE, v.name, v.node.name)
                w.uids[f"@vmi:{v.name}"] = obj["metadata"]["uid"]
                w.objects.patch_vmi(NAMESPACE, v.name, {"metadata": meta, "status": w.resolve(status)})
            self._put(f"create vmi {v.name}", create)
        else:  # no status subresource on VMIs: KubeVirt updates the whole object
            self._put(f"update vmi {v.name}", lambda: w.objects.patch_vmi(
                NAMESPACE, v.name, {"metadata": meta, "status": w.resolve(status)}))

    def _state(self, m: Migration) -> dict:
        """``migrationState`` as virt-controller fills it; absent fields as nulls (a merge patch then drops them)."""
        ended = m.end is not None
        return {
            "migrationUid": f"@vmim:{m.uid}",
            "startTimestamp": self.clock.stamp(m.copy_start),
            "endTimestamp": self.clock.stamp(m.end) if ended else None,
            "completed": (not m.failed) if ended else None,
            "failed": m.failed if ended else None,
            "failureReason": (m.failure or None) if ended else None,
            "sourceNode": m.source.name if m.source else None,
            "targetNode": m.target.name if m.target else None,
            "sourcePod": self._source_pods.get(m.name),
            "targetPod": m.target_pod.name if m.target_pod else None,
            "mode": "PreCopy",
        }

    # ---- VMIMs -----------------------------------------------------------------

    def publish_vmim(self, m: Migration) -> None:
        w = self.writer
        if m.start is not None and m.vmi.pod is not None:
            self._source_pods.setdefault(m.name, m.vmi.pod.name)
        transitions = self._transitions.setdefault(m.name, [])
        if not transitions or transitions[-1]["phase"] != m.phase:
            transitions.append({"phase": m.phase, "phaseTransitionTimestamp": self._now_stamp()})
        status = {"phase": m.phase, "phaseTransitionTimestamps": list(transitions)}
        if m.copy_start is not None:
            status["migrationState"] = self._state(m)
        first = ("vmim", m.name) not in self._written
        if not self._changed(("vmim", m.name), status):
            return
        if first:
            def create() -> None:
                obj = w.objects.vmim(NAMESPACE, m.name, m.vmi.name, m.phase, evacuation_node=m.evacuation_node,
                                     priority=PRIORITY_NAMES[m.priority])
                w.uids[f"@vmim:{m.uid}"] = obj["metadata"]["uid"]
                w.objects.set_vmim_status(NAMESPACE, m.name, w.resolve(status))
            self._put(f"create vmim {m.name}", create)
        else:
            self._put(f"update vmim {m.name}", lambda: w.objects.set_vmim_status(NAMESPACE, m.name,
                                                                                 w.resolve(status)))

    def delete_vmim(self, name: str) -> None:
        w = self.writer
        self._transitions.pop(name, None)
        self._source_pods.pop(name, None)
        self._put(f"delete vmim {name}", lambda: w.call(w.custom.delete_namespaced_custom_object, *KUBEVIRT,
                                                        NAMESPACE, VMIMS, name))

    # ---- what the admitter and the metrics read ---------------------------------

    def admit_eviction(self, pod_name: str, now: int, from_descheduler: bool):
        """The model's admitter; and the most VMs marked for evacuation from one node at once, counted here (only a
        mark raises it)."""
        answer = super().admit_eviction(pod_name, now, from_descheduler)
        marked = collections.Counter(v.evacuation_node for v in self.vmis if v.evacuation_node)
        self.max_leaving = max(self.max_leaving, max(marked.values(), default=0))
        return answer

    def migrating(self, vmi: VMI) -> bool:
        """A VMIM of this VMI is queued or running."""
        return any(m.vmi is vmi for m in self.pending) or any(m.vmi is vmi for m in self.running)


def _cpu(cores: float) -> str:
    return f"{int(round(cores * 1000))}m"


def _pod_status(phase: str, ready: bool, now: str) -> dict:
    flag = "True" if ready else "False"
    return {"status": {"phase": phase, "conditions": [{"type": "Ready", "status": flag, "lastTransitionTime": now},
                                                      {"type": "ContainersReady", "status": flag,
                                                       "lastTransitionTime": now}]}}
