"""KubeVirt as the simulation needs it: evacuation, migrations, limits, retries, retention.

The state lives in plain mutable objects (fast to change); every change is
also published into a real ``ClusterStore`` as the Kubernetes object the API
server would hold, projected by the production ``*_from_object`` functions.
The guard reads that store and nothing else, so it decides on exactly what it
would see in a cluster (timestamps included, truncated to the second).

Mechanics (simulation-model.md):
- an eviction of a migratable VM's pod marks the VMI for evacuation and is
  refused with ``Eviction triggered evacuation``; the evacuation controller
  creates one VMIM per marked VMI at once;
- at most 5 migrations run per cluster and 2 outbound per source node; pending
  VMIMs wait with no timeout, the highest priority first (drains before the
  descheduler), then the oldest;
- duration from memory, bandwidth and dirty rate, aborted by the completion
  timeout (150 s per GiB) or when it makes no progress (150 s);
- after a failure the VMI stays marked and a new VMIM is created at once, held
  back by 20 s doubling per consecutive failure among the retained VMIMs (only
  the 5 newest finished VMIMs per VMI are kept, so at most 320 s).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from app.cluster.store import ClusterStore
from app.domain.kinds import POD, VMIM
from app.domain.records import (
    DOMAIN_ANNOTATION,
    EVACUATION_MIGRATION,
    EVICTION_IN_PROGRESS,
    MIGRATION_JOB_LABEL,
    migration_from_object,
    node_from_object,
    pod_from_object,
    vmi_from_object,
)
from app.sim.model import VM, Node
from app.sim.scenario import KubeVirtSettings
from app.timefmt import format_timestamp

NAMESPACE = "vms"
EPOCH = 1767225600  # 2026-01-01T00:00:00Z is simulated time 0
BACKGROUND = "Eviction triggered evacuation"
PRIORITY_DRAIN, PRIORITY_DESCHEDULER = 1, 0


def ts(t: float | None) -> str | None:
    return None if t is None else format_timestamp(EPOCH + t)


@dataclass(slots=True)
class Pod:
    name: str
    vmi: "VMI"
    node: Node
    migration: "Migration | None" = None  # set on a migration's target pod
    eviction_in_progress: bool = False


@dataclass(slots=True)
class Migration:
    """One VMIM: one attempt to move a VMI."""

    seq: int
    name: str
    uid: str
    vmi: "VMI"
    created: int
    eligible_at: int  # held back until then by the retry backoff
    priority: int
    evacuation_node: str
    phase: str = "Pending"
    start: int | None = None
    end: int | None = None
    source: Node | None = None
    target: Node | None = None
    target_pod: Pod | None = None
    failed: bool = False


@dataclass(slots=True)
class VMI:
    vm: VM
    node: Node
    pod: Pod | None = None
    created: int = -3600
    evacuation_node: str = ""  # status.evacuationNodeName
    from_descheduler: bool = False  # annotation kubevirt.io/eviction-source: descheduler
    migration: Migration | None = None  # the one status.migrationState describes
    vmims: list[Migration] = field(default_factory=list)  # retained VMIMs, oldest first
    pod_serial: int = 0

    @property
    def name(self) -> str:
        return self.vm.name


@dataclass(frozen=True, slots=True)
class Answer:
    """What the API server tells the client that asked for an eviction."""

    allowed: bool
    message: str
    reason: str  # label for the statistics (the guard's reason, or kubevirt_*)

    @property
    def background(self) -> bool:
        """The descheduler's test: a 429 whose text contains the background phrase."""
        return not self.allowed and BACKGROUND in self.message


@dataclass(frozen=True, slots=True)
class MigrationRun:
    """A finished (or, at the end of a run, still running) migration, for the metrics."""

    vm: str
    cause: str  # descheduler | drain
    created: int
    start: int
    end: int | None
    source: str
    target: str
    failed: bool


def migration_duration(memory: float, dirty_rate: float, s: KubeVirtSettings) -> tuple[int, bool]:
    """(seconds until the migration ends, whether it ends by being aborted).

    Pre-copy sends the memory, then what was dirtied meanwhile, and so on: with
    bandwidth B and dirty rate D < B the rounds add up to M / (B - D). With
    D >= B it never converges: it is aborted 150 s after the first full pass
    stops making progress. Either way the completion timeout (150 s per GiB)
    aborts it first if shorter. The setup (target pod start) comes before.
    """
    timeout = s.completion_timeout_per_gib * memory
    if dirty_rate < s.bandwidth:
        copy = memory / (s.bandwidth - dirty_rate)
        if copy <= timeout:
            return s.setup_seconds + math.ceil(copy), False
        return s.setup_seconds + math.ceil(timeout), True
    stall = memory / s.bandwidth + s.progress_timeout
    return s.setup_seconds + math.ceil(min(stall, timeout)), True


def retry_backoff(vmims: list[Migration], initial: int) -> int:
    """The hold-back of a new VMIM: ``initial`` doubling per consecutive failure among the
    retained finished VMIMs (newest first), 0 after a success or none."""
    failures = 0
    for m in reversed(vmims):
        if m.phase == "Pending" or m.phase == "Running":
            continue
        if not m.failed:
            break
        failures += 1
    return 0 if failures == 0 else initial * 2 ** (failures - 1)


class KubeVirt:
    def __init__(
        self,
        settings: KubeVirtSettings,
        nodes: list[Node],
        vms: list[VM],
        placement: list[int],
        store: ClusterStore,
        rng: random.Random,
        schedule: Callable[[int, Callable, tuple], None],
    ) -> None:
        self.s = settings
        self.nodes = nodes
        self.node_by_name = {n.name: n for n in nodes}
        self.store = store
        self.rng = rng
        self.schedule = schedule
        self.pods: dict[str, Pod] = {}
        self.pods_on: dict[str, dict[str, Pod]] = {n.name: {} for n in nodes}
        self.vmis: list[VMI] = []
        self.pending: list[Migration] = []
        self.running: list[Migration] = []
        self.outbound: dict[str, int] = {n.name: 0 for n in nodes}
        self.marked_on: dict[str, int] = {n.name: 0 for n in nodes}
        self.finished: list[MigrationRun] = []
        self.concurrent_evacuations = 0  # descheduler marked a VM while another was marked on that node
        self.listeners: list[Callable[[Migration], None]] = []  # told of every finished migration
        self._seq = 0
        for n in nodes:
            self.publish_node(n)
        for vm, node_index in zip(vms, placement):
            vmi = VMI(vm=vm, node=nodes[node_index])
            self.vmis.append(vmi)
            vmi.pod = self._new_pod(vmi, vmi.node)
            self.publish_vmi(vmi)

    # ---- publication into the store (as the API server's objects) ------------

    def publish_node(self, n: Node) -> None:
        self.store.upsert(node_from_object({"metadata": {"name": n.name, "labels": {"kubevirt.io/schedulable": "true"}},
                                            "spec": {"unschedulable": True} if n.cordoned else {}}))

    def publish_pod(self, p: Pod) -> None:
        labels = {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": p.vmi.name}
        if p.migration is not None:
            labels[MIGRATION_JOB_LABEL] = p.migration.uid
        annotations = {DOMAIN_ANNOTATION: p.vmi.name, "descheduler.alpha.kubernetes.io/request-evict-only": ""}
        if p.eviction_in_progress:
            annotations[EVICTION_IN_PROGRESS] = "true"
        self.store.upsert(pod_from_object({
            "metadata": {"name": p.name, "namespace": NAMESPACE, "uid": f"uid-{p.name}", "labels": labels,
                         "annotations": annotations},
            "spec": {"nodeName": p.node.name},
            "status": {"phase": "Running"},
        }))

    def publish_vmi(self, v: VMI) -> None:
        status: dict = {"phase": "Running", "nodeName": v.node.name}
        if v.evacuation_node:
            status["evacuationNodeName"] = v.evacuation_node
        if v.migration is not None:
            status["migrationState"] = _state(v.migration)
        annotations = {"kubevirt.io/eviction-source": "descheduler"} if v.from_descheduler else {}
        self.store.upsert(vmi_from_object({
            "metadata": {"name": v.name, "namespace": NAMESPACE, "uid": f"uid-vmi-{v.name}",
                         "creationTimestamp": ts(v.created), "annotations": annotations},
            "status": status,
        }))

    def publish_vmim(self, m: Migration) -> None:
        status: dict = {"phase": m.phase}
        if m.start is not None:
            status["migrationState"] = _state(m)
        self.store.upsert(migration_from_object({
            "metadata": {"name": m.name, "namespace": NAMESPACE, "uid": m.uid, "creationTimestamp": ts(m.created),
                         "annotations": {EVACUATION_MIGRATION: m.evacuation_node}},
            "spec": {"vmiName": m.vmi.name},
            "status": status,
        }))

    # ---- pods ----------------------------------------------------------------

    def _new_pod(self, vmi: VMI, node: Node, migration: Migration | None = None) -> Pod:
        vmi.pod_serial += 1
        pod = Pod(name=f"virt-launcher-{vmi.name}-{vmi.pod_serial:05x}", vmi=vmi, node=node, migration=migration)
        self.pods[pod.name] = pod
        self.pods_on[node.name][pod.name] = pod
        node.req_cpu += vmi.vm.vcpus / self.s.cpu_allocation_ratio
        node.req_mem += vmi.vm.memory
        self.publish_pod(pod)
        return pod

    def _delete_pod(self, pod: Pod) -> None:
        del self.pods[pod.name]
        del self.pods_on[pod.node.name][pod.name]
        pod.node.req_cpu -= pod.vmi.vm.vcpus / self.s.cpu_allocation_ratio
        pod.node.req_mem -= pod.vmi.vm.memory
        self.store.delete(POD, (NAMESPACE, pod.name))

    # ---- the eviction admitter (virt-launcher-eviller) -----------------------

    def admit_eviction(self, pod_name: str, now: int, from_descheduler: bool) -> Answer:
        """KubeVirt's validating webhook on pods/eviction, with its side effect."""
        pod = self.pods.get(pod_name)
        if pod is None:
            return Answer(True, "pod not found", "kubevirt_not_found")
        vmi = pod.vmi
        ref = f'VMI "{NAMESPACE}/{vmi.name}"'
        if pod.node is not vmi.node:
            return Answer(False, f"Eviction request for target Pod of {ref}", "kubevirt_target_pod")
        if vmi.evacuation_node:
            return Answer(False, f"Evacuation in progress: {BACKGROUND} of {ref}", "kubevirt_evacuation_in_progress")
        node = pod.node.name
        if from_descheduler and self.marked_on[node] > 0:
            self.concurrent_evacuations += 1
        self.marked_on[node] += 1
        vmi.evacuation_node = node
        vmi.from_descheduler = from_descheduler
        self.publish_vmi(vmi)
        # virt-controller reconciles the pod annotation to the mark (at once, here)
        pod.eviction_in_progress = True
        self.publish_pod(pod)
        self._create_vmim(vmi, now)
        return Answer(False, f"{BACKGROUND} of {ref}", "kubevirt_evacuation")

    # ---- the evacuation and migration controllers ----------------------------

    def _create_vmim(self, vmi: VMI, now: int) -> None:
        self._seq += 1
        backoff = retry_backoff(vmi.vmims, self.s.backoff_initial)
        m = Migration(
            seq=self._seq, name=f"{vmi.name}-evacuation-{self._seq:06d}", uid=f"uid-vmim-{self._seq:06d}", vmi=vmi,
            created=now, eligible_at=now + backoff,
            priority=PRIORITY_DESCHEDULER if vmi.from_descheduler else PRIORITY_DRAIN,
            evacuation_node=vmi.evacuation_node,
        )
        vmi.vmims.append(m)
        self.pending.append(m)
        self.publish_vmim(m)
        if backoff:
            self.schedule(m.eligible_at, self.try_start, ())
        else:
            self.try_start(now)

    def try_start(self, now: int) -> None:
        """Start what the limits allow: highest priority first, then the oldest."""
        if not self.pending or len(self.running) >= self.s.parallel_migrations_per_cluster:
            return
        ready = sorted((m for m in self.pending if m.eligible_at <= now), key=lambda m: (-m.priority, m.created, m.seq))
        for m in ready:
            if len(self.running) >= self.s.parallel_migrations_per_cluster:
                break
            source = m.vmi.node
            if self.outbound[source.name] >= self.s.parallel_outbound_migrations_per_node:
                continue
            target = self.choose_target(m.vmi.vm, source)
            if target is None:
                continue
            self._start(m, source, target, now)

    def choose_target(self, vm: VM, source: Node) -> Node | None:
        """The scheduler's pick: a node that fits (memory requests), untainted ones first,
        then the least allocated (kube-scheduler's LeastAllocated on cpu and memory
        requests), ties broken at random."""
        best: list[Node] = []
        best_key = None
        for n in self.nodes:
            if n is source or n.cordoned or n.req_mem + vm.memory > n.memory:
                continue
            free = (1 - n.req_cpu / n.cpu) + (1 - n.req_mem / n.memory)
            key = (not n.soft_tainted, round(free, 9))
            if best_key is None or key > best_key:
                best, best_key = [n], key
            elif key == best_key:
                best.append(n)
        if not best:
            return None
        return best[0] if len(best) == 1 else self.rng.choice(best)

    def failure_probability(self, source: Node) -> float:
        return self.s.failure_probability if source.failure_probability is None else source.failure_probability

    def _start(self, m: Migration, source: Node, target: Node, now: int) -> None:
        self.pending.remove(m)
        self.running.append(m)
        self.outbound[source.name] += 1
        vmi = m.vmi
        m.phase, m.start, m.source, m.target = "Running", now, source, target
        m.target_pod = self._new_pod(vmi, target, migration=m)
        vmi.migration = m
        duration, aborted = migration_duration(vmi.vm.memory, vmi.vm.dirty_rate, self.s)
        failed = aborted
        if not failed and self.rng.random() < self.failure_probability(source):
            failed = True
            duration = max(self.s.setup_seconds, int(duration * self.rng.uniform(0.2, 1.0)))
        self.publish_vmim(m)
        self.publish_vmi(vmi)
        self.schedule(now + duration, self._finish, (m, failed))

    def _finish(self, now: int, m: Migration, failed: bool) -> None:
        vmi = m.vmi
        source, target = m.source, m.target
        assert source is not None and target is not None and m.target_pod is not None
        self.running.remove(m)
        self.outbound[source.name] -= 1
        m.phase, m.end, m.failed = ("Failed" if failed else "Succeeded"), now, failed
        self.finished.append(MigrationRun(
            vm=vmi.name, cause="descheduler" if m.priority == PRIORITY_DESCHEDULER else "drain",
            created=m.created, start=m.start if m.start is not None else now, end=now, source=source.name, target=target.name, failed=failed,
        ))
        if failed:
            self._delete_pod(m.target_pod)
        else:
            old = vmi.pod
            vmi.node, vmi.pod = target, m.target_pod
            if old is not None:
                self._delete_pod(old)  # the source pod completes and is gone
            if vmi.evacuation_node:
                self.marked_on[vmi.evacuation_node] -= 1
            vmi.evacuation_node, vmi.from_descheduler = "", False
        self.publish_vmim(m)
        self.publish_vmi(vmi)
        self._retain(vmi)
        for listener in self.listeners:
            listener(m)
        if vmi.evacuation_node:  # still marked: the evacuation controller tries again
            self._create_vmim(vmi, now)
        self.try_start(now)

    def _retain(self, vmi: VMI) -> None:
        """Garbage-collect all but the newest finished VMIMs of a VMI."""
        finished = [m for m in vmi.vmims if m.phase in ("Succeeded", "Failed")]
        drop = finished[: max(0, len(finished) - self.s.retained_finished_migrations)]
        for m in drop:
            vmi.vmims.remove(m)
            self.store.delete(VMIM, (NAMESPACE, m.name))

    # ---- what other components read -----------------------------------------

    def running_runs(self) -> list[MigrationRun]:
        return [
            MigrationRun(m.vmi.name, "descheduler" if m.priority == PRIORITY_DESCHEDULER else "drain", m.created,
                         m.start if m.start is not None else 0, None, m.source.name if m.source else "", m.target.name if m.target else "", False)
            for m in self.running
        ]

    def set_cordoned(self, node: Node, cordoned: bool, now: int) -> None:
        node.cordoned = cordoned
        self.publish_node(node)
        if not cordoned:
            self.try_start(now)


def _state(m: Migration) -> dict:
    state = {
        "migrationUid": m.uid,
        "startTimestamp": ts(m.start),
        "sourceNode": m.source.name if m.source else "",
        "targetNode": m.target.name if m.target else "",
        "targetPod": m.target_pod.name if m.target_pod else "",
        "mode": "PreCopy",
    }
    if m.end is not None:
        state.update(endTimestamp=ts(m.end), completed=not m.failed, failed=m.failed)
    return state
