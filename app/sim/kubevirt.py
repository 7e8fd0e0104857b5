"""KubeVirt (v1.8.3; v1.9 with one setting) as the simulation needs it: evacuation, migrations, limits, retries.

The state lives in plain mutable objects (fast to change); every change is
also published into a real ``ClusterStore`` as the Kubernetes object the API
server would hold, projected by the production ``*_from_object`` functions.
The guard reads that store and nothing else, so it decides on exactly what it
would see in a cluster (timestamps included, truncated to the second).

Mechanics, each as KubeVirt v1.8.3's code has it (paths under its module):
- the eviction admitter checks, in order: the VMI is already marked ->
  ``Evacuation in progress: Eviction triggered evacuation of VMI "NS/NAME"``; the pod is not on
  the VMI's node (a migration target) -> ``Eviction request for target Pod``, with nothing more;
  otherwise it marks the VMI (``status.evacuationNodeName``, and ``kubevirt.io/eviction-source:
  descheduler`` when the Eviction carries ``requested-by: sigs.k8s.io/descheduler``) and answers
  ``Eviction triggered evacuation of VMI "NS/NAME"``
  (pkg/virt-api/webhooks/validating-webhook/admitters/pod-eviction-admitter.go:165-181);
- the launcher pod's ``descheduler.alpha.kubernetes.io/eviction-in-progress`` annotation follows
  the mark on the VMI's current pod (virt-controller, a reconcile later; pkg/virt-controller/watch/
  vmi/lifecycle.go:215-226) and so stays through failed attempts; a success moves the VMI, clears
  the mark and the eviction-source annotation (virt-handler, pkg/virt-handler/migration-target.go:199-213);
- the evacuation controller (pkg/virt-controller/watch/drain/evacuation/evacuation.go) works per node and
  runs only when its queue holds the node: on a Node add/update/delete (113-134), a VMI add/update/delete
  (the VMI's ``status.nodeName``, 136-171), a VMIM add (its evacuation annotation's node, 195-218) or
  update/delete (its VMI's current node, 220-254), and after 5 s when the node's limits were full (390).
  It does not watch pods. A sync takes the marked VMIs on the node (the drain taint ``kubevirt.io/drain``:
  all of them) that are not migrating (``migrationState`` started, not ended), have no unfinished VMIM, and
  have at most one active launcher pod (327-335, 458-519);
- with the MigrationPriorityQueue feature gate off (the v1.8 default: Beta, on only when listed in
  ``featureGates``, pkg/virt-config/featuregate/active.go:158-165, 270, pkg/virt-config/feature-gates.go:32-46)
  the VMIMs carry no ``spec.priority`` and the sync creates only as many as there is room for: the
  parallel limits (5 per cluster, 2 outbound per node) minus the VMIMs in a running phase (Scheduling
  onwards; Pending ones, in backoff included, do not count), candidates in the VMI index's order (a set:
  no defined order; here a seeded shuffle) (evacuation.go:379-418); a VMIM that still finds the limits
  full is re-tried by the migration controller every 5 s (migration.go:1364-1391). With the gate on
  (``kubevirt: {migrationPriorityQueue: true}``; GA in v1.9) every candidate gets a VMIM at once,
  priority ``system-maintenance`` when the descheduler marked it, ``system-critical`` otherwise
  (evacuation.go:351-356), and the migration controller re-offers the highest-priority pending ones
  when one finishes (migration.go:442-475), then (here) the oldest;
- the VMIM is named ``kubevirt-evacuation-xxxxx`` (evacuation.go:345);
- a migration copies the guest memory over the source node's NIC, shared by
  the node's outbound migrations, while the guest dirties pages; it aborts at
  the completion timeout (150 s per GiB) or after 150 s without progress; a
  target pod that cannot schedule is deleted and the VMIM fails after 5 minutes (migration.go:86, 1532-1549);
- after a failure the VMI stays marked. The failed attempt's target pod is still active when the failure's
  own updates wake the evacuation controller (its virt-launcher exits a moment later, and nothing the
  controller watches changes then: the VMI's ``status.activePods`` counts a completed pod too,
  vmi/lifecycle.go:988-1006), so the next VMIM is created at the next wake-up: in a quiet node, virt-handler's
  heartbeat (60 s x (1 + 1.2 x U[0,1)), pkg/virt-handler/vm.go:191, heartbeat/heartbeat.go:96). An
  unschedulable target pod is deleted first, so its retry is created at once. The migration controller
  then holds the new VMIM Pending until ``retry_backoff`` has passed since the failure: 20 s doubling per
  failed evacuation VMIM still kept since the last success, so at most 320 s (migration.go:1051-1113);
- the 5 most recent finished VMIMs of a VMI are kept (migration.go:91, 2264-2300).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.cluster.store import ClusterStore
from app.domain.kinds import POD, VMIM
from app.domain.records import (
    DOMAIN_ANNOTATION,
    EVACUATION_MIGRATION,
    EVICTION_IN_PROGRESS,
    KUBEVIRT_DRAIN_TAINT,
    MIGRATION_JOB_LABEL,
    kubevirt_from_object,
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
PRIORITY_NAMES = {PRIORITY_DRAIN: "system-critical", PRIORITY_DESCHEDULER: "system-maintenance"}
ANNOTATION_DELAY = 1  # virt-controller reconciles the pod annotation to the mark a second later
LIMITS_RECHECK = 5  # evacuation.go:390 and migration.go:1372, 1389: a full node or cluster is looked at again in 5 s
# with the gate on, a VMIM blocked by the limits is re-queued after 1 s (system-critical) or 5 s
# (system-maintenance): getRequeueDelayForPriority, migration.go:1407-1416
GATED_RECHECK = {PRIORITY_DRAIN: 1, PRIORITY_DESCHEDULER: 5}
EPS = 1e-9


def ts(t: float | None) -> str | None:
    return None if t is None else format_timestamp(EPOCH + t)


@dataclass(slots=True)
class Pod:
    name: str
    vmi: "VMI"
    node: Node
    migration: "Migration | None" = None  # set on a migration's target pod
    eviction_in_progress: bool = False
    updates: int = 0  # update events the pod informer has seen (after creation)


@dataclass(slots=True)
class Migration:
    """One VMIM: one attempt to move a VMI."""

    seq: int
    name: str
    uid: str
    vmi: "VMI"
    created: int
    eligible_at: int  # held back until then by the retry backoff
    priority: int  # the cause: the priority the gate would give it (PRIORITY_DESCHEDULER or PRIORITY_DRAIN)
    evacuation_node: str
    queued: bool = True  # spec.priority set and honoured (the MigrationPriorityQueue gate on)
    phase: str = "Pending"
    start: int | None = None  # slot taken, target pod created
    end: int | None = None
    source: Node | None = None
    target: Node | None = None
    target_pod: Pod | None = None
    failed: bool = False
    failure: str = ""  # why it failed: unschedulable, completion-timeout, no-progress, transient
    # the copy, a fluid model: memory left to converge, of the first pass, since when it stalls
    copy_start: int | None = None
    remaining: float = 0.0
    first_pass: float = 0.0
    share: float = 0.0  # GiB/s of the source NIC this migration gets now
    updated: float = 0.0
    stalled_since: float | None = None
    fail_at: int | None = None  # a transient failure strikes here, if the copy is still going
    version: int = 0  # invalidates end events planned under an older share
    recheck_at: int = -1  # when the migration controller looks at it again after the limits refused it

    @property
    def queue_priority(self) -> int:
        return self.priority if self.queued else 0

    @property
    def cause(self) -> str:
        return "descheduler" if self.priority == PRIORITY_DESCHEDULER else "drain"


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
    failures_since_success: int = 0
    pod_serial: int = 0
    active_pods: int = 0  # launcher pods not yet completed (the source, a target still up)
    annotations: dict = field(default_factory=dict)  # written by others: the guard's migration history

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
    failure: str = ""
    copy_start: int | None = None  # migrationState.startTimestamp (None: never started copying)


def migration_duration(memory: float, dirty_rate: float, bandwidth: float, s: KubeVirtSettings) -> tuple[int, bool]:
    """(seconds until a migration alone on its source NIC ends, whether it ends aborted).

    Pre-copy sends the memory, then what was dirtied meanwhile, and so on: with
    bandwidth B and dirty rate D < B the rounds add up to M / (B - D). With
    D >= B it never converges: the first pass (M / B) makes progress, then it
    is aborted after 150 s without any. The completion timeout (150 s per GiB)
    aborts it first if shorter. Target pod start-up (setup) comes before.
    The engine runs the same fluid model step by step when the NIC is shared.
    """
    timeout = s.completion_timeout_per_gib * memory
    if dirty_rate < bandwidth:
        copy = memory / (bandwidth - dirty_rate)
        if copy <= timeout:
            return s.setup_seconds + math.ceil(copy - EPS), False
        return s.setup_seconds + math.ceil(timeout - EPS), True
    stall = memory / bandwidth + s.progress_timeout
    return s.setup_seconds + math.ceil(min(stall, timeout) - EPS), True


# ---- the copy on a shared NIC, step by step: the simulator's migrations and the e2e actor's copies both use these.
# ``c`` is anything with ``share``, ``remaining``, ``first_pass``, ``stalled_since`` and ``updated``.

def transient_failure_at(vm: VM, network: float, now: float, rng: random.Random) -> float:
    """When a transient failure strikes a copy that starts at ``now``: a seeded point of its nominal length."""
    nominal = vm.memory / max(network - vm.dirty_rate, network / 4)
    return now + max(1, int(nominal * rng.uniform(0.1, 1.0)))


def advance_copy(c, dirty_rate: float, now: float) -> None:
    """Bring a copy up to ``now`` at its current share: with share B above the dirty rate D the memory left shrinks
    at B - D; otherwise the first pass makes progress and then nothing does (``stalled_since``)."""
    dt = now - c.updated
    if dt <= 0:
        return
    b, d = c.share, dirty_rate
    if b > d:
        c.remaining -= (b - d) * dt
        c.first_pass = max(0.0, c.first_pass - b * dt)
        c.stalled_since = None
    elif c.first_pass > 0:
        sent = min(c.first_pass, b * dt)
        c.first_pass -= sent
        if c.first_pass <= EPS:
            c.first_pass = 0.0
            c.stalled_since = c.updated + (sent / b if b > 0 else 0.0)
    elif c.stalled_since is None:
        c.stalled_since = c.updated
    c.updated = now


def copy_end(c, copy_start: float, vm: VM, fail_at: float | None, s: KubeVirtSettings, now: float) -> tuple[float, str]:
    """(when the copy ends at its current share, why: "" for success, else the abort's cause)."""
    b, d = c.share, vm.dirty_rate
    candidates = [(copy_start + s.completion_timeout_per_gib * vm.memory, "completion-timeout")]
    if b > d:
        candidates.append((now + max(0.0, c.remaining) / (b - d), ""))
    elif c.first_pass > 0:
        candidates.append((now + c.first_pass / b + s.progress_timeout if b > 0 else now + s.progress_timeout,
                           "no-progress"))
    else:
        candidates.append(((c.stalled_since if c.stalled_since is not None else now) + s.progress_timeout,
                           "no-progress"))
    if fail_at is not None:
        candidates.append((fail_at, "transient"))
    return min(candidates, key=lambda x: (x[0], x[1] == ""))


_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the API server's generateName alphabet (apimachinery's rand.String)


def vmim_name(seq: int) -> str:
    """The evacuation controller's VMIM name: ``generateName: kubevirt-evacuation-`` (kubevirt v1.8.3
    pkg/virt-controller/watch/drain/evacuation/evacuation.go:345), with 5 characters of the API server's
    alphabet; here derived from the sequence number so runs stay reproducible."""
    out = ""
    for _ in range(5):
        seq, r = divmod(seq, len(_NAME_CHARS))
        out = _NAME_CHARS[r] + out
    return "kubevirt-evacuation-" + out


def retry_backoff(previous: Sequence[str], initial: int) -> int:
    """The hold-back of a new evacuation VMIM, as virt-controller's ``handleMigrationBackoff``
    computes it (kubevirt v1.8.3 pkg/virt-controller/watch/migration/migration.go:1051-1113): over
    the VMI's evacuation VMIMs that still exist (``previous``: their phases, oldest first, the new
    one not among them), newest first until a Succeeded one, ``initial`` for the first Failed and
    doubled for each further Failed; unfinished ones count for nothing. The wait runs from the newest
    previous VMIM's failure. Since the garbage collector keeps only 5 finished VMIMs per VMI
    (migration.go:91, 2264-2300), at most 5 failures count: the wait tops out at ``initial`` x 2^4."""
    backoff = 0
    for phase in reversed(previous):
        if phase == "Succeeded":
            break
        if phase == "Failed":
            backoff = initial if backoff == 0 else backoff * 2
    return backoff


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
        heartbeat_rng: random.Random | None = None,
        order_rng: random.Random | None = None,
    ) -> None:
        """``heartbeat_rng`` draws virt-handler's heartbeat jitter, ``order_rng`` the order of the VMI
        index (both their own streams, so they do not shift failures and target ties)."""
        self.s = settings
        self.heartbeat_rng = heartbeat_rng or random.Random(f"{rng.random()}:heartbeat")
        self.order_rng = order_rng or random.Random(f"{rng.random()}:order")
        self.nodes = nodes
        self.node_by_name = {n.name: n for n in nodes}
        self.store = store
        self.rng = rng
        self.schedule = schedule
        self.pods: dict[str, Pod] = {}
        self.pods_on: dict[str, dict[str, Pod]] = {n.name: {} for n in nodes}
        self.vmis: list[VMI] = []
        self.vmi_by_name: dict[str, VMI] = {}
        self.pending: list[Migration] = []
        self.running: list[Migration] = []
        self.copying: dict[str, list[Migration]] = {n.name: [] for n in nodes}  # by source node
        self.outbound: dict[str, int] = {n.name: 0 for n in nodes}
        self.marked_on: dict[str, int] = {n.name: 0 for n in nodes}
        # the most descheduler-caused VMs leaving one node at once while it was not being drained
        # (docs/decisions.md, the node budget's invariant); see descheduler_leavers
        self.max_leaving_per_node = 0
        self.finished: list[MigrationRun] = []
        self.concurrent_evacuations = 0  # descheduler marked a VM while another was marked on that node
        self.listeners: list[Callable[[Migration], None]] = []  # told of every finished migration
        self.pod_listeners: list[Callable[[Pod, int], None]] = []  # the pod informer: update events
        self.pod_delete_listeners: list[Callable[[Pod], None]] = []
        self.heartbeat_listeners: list[Callable[[str, int], None]] = []
        self._seq = 0
        self._evac_queued: set[tuple[str, int]] = set()  # (node, second) syncs already queued
        self._evac_delayed: dict[str, int] = {}  # node -> when its delayed entry is due
        self.publish_kubevirt()
        for n in nodes:
            self.publish_node(n)
        for vm, node_index in zip(vms, placement):
            vmi = VMI(vm=vm, node=nodes[node_index])
            self.vmis.append(vmi)
            self.vmi_by_name[vmi.name] = vmi
            vmi.pod = self._new_pod(vmi, vmi.node)
            self.publish_vmi(vmi)
        period = settings.heartbeat_interval * (1 + settings.heartbeat_jitter)
        for n in nodes:  # virt-handler has been running for a while: each node's next beat at a random phase
            self.schedule(int(self.heartbeat_rng.random() * period), self._heartbeat, (n.name,))

    # ---- publication into the store (as the API server's objects) ------------

    def node_updated(self, n: Node, now: int) -> None:
        """A Node changed: published, and the evacuation controller wakes for it (evacuation.go:113-134)."""
        self.publish_node(n)
        self.enqueue(n.name, now)

    def vmi_updated(self, v: VMI, now: int) -> None:
        """A VMI changed: published, and the evacuation controller wakes for its ``status.nodeName``
        (evacuation.go:136-171)."""
        self.publish_vmi(v)
        self.enqueue(v.node.name, now)

    def vmim_updated(self, m: Migration, now: int) -> None:
        """A VMIM was added or changed: published, and the evacuation controller wakes for the node of its
        evacuation annotation (added) or of its VMI (updated), here both the VMI's node (evacuation.go:195-254)."""
        self.publish_vmim(m)
        self.enqueue(m.vmi.node.name, now)

    def publish_kubevirt(self) -> None:
        """The KubeVirt CR: the migration limits modelled here, and LiveMigrate for every VM (all are migratable)."""
        self.store.upsert(kubevirt_from_object({
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"evictionStrategy": "LiveMigrate", "migrations": {
                "parallelOutboundMigrationsPerNode": self.s.parallel_outbound_migrations_per_node,
                "parallelMigrationsPerCluster": self.s.parallel_migrations_per_cluster}}},
        }))

    def publish_node(self, n: Node) -> None:
        spec: dict = {}
        if n.cordoned:
            spec["unschedulable"] = True
        taints = [{"key": "kubevirt.io/soft-taint", "effect": "PreferNoSchedule"}] * n.soft_taints
        if n.no_schedule:
            taints = taints + [{"key": n.no_schedule, "effect": "NoSchedule"}]
        if taints:
            spec["taints"] = taints
        self.store.upsert(node_from_object({"metadata": {"name": n.name, "labels": {"kubevirt.io/schedulable": "true"}},
                                            "spec": spec}))

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
        if v.migration is not None and v.migration.copy_start is not None:
            status["migrationState"] = _state(v.migration)
        annotations = {**v.annotations, **({"kubevirt.io/eviction-source": "descheduler"} if v.from_descheduler else {})}
        self.store.upsert(vmi_from_object({
            "metadata": {"name": v.name, "namespace": NAMESPACE, "uid": f"uid-vmi-{v.name}",
                         "creationTimestamp": ts(v.created), "annotations": annotations},
            "status": status,
        }))

    def publish_vmim(self, m: Migration) -> None:
        status: dict = {"phase": m.phase}
        if m.copy_start is not None:
            status["migrationState"] = _state(m)
        spec = {"vmiName": m.vmi.name}
        if m.queued:
            spec["priority"] = PRIORITY_NAMES[m.priority]
        self.store.upsert(migration_from_object({
            "metadata": {"name": m.name, "namespace": NAMESPACE, "uid": m.uid, "creationTimestamp": ts(m.created),
                         "annotations": {EVACUATION_MIGRATION: m.evacuation_node}},
            "spec": spec,
            "status": status,
        }))

    # ---- pods ----------------------------------------------------------------

    def _new_pod(self, vmi: VMI, node: Node, migration: Migration | None = None) -> Pod:
        vmi.pod_serial += 1
        pod = Pod(name=f"virt-launcher-{vmi.name}-{vmi.pod_serial:05x}", vmi=vmi, node=node, migration=migration)
        vmi.active_pods += 1
        self.pods[pod.name] = pod
        self.pods_on[node.name][pod.name] = pod
        node.req_cpu += vmi.vm.vcpus / self.s.cpu_allocation_ratio
        node.req_mem += vmi.vm.memory
        self.publish_pod(pod)
        return pod

    def _delete_pod(self, pod: Pod) -> None:
        pod.vmi.active_pods -= 1
        del self.pods[pod.name]
        del self.pods_on[pod.node.name][pod.name]
        pod.node.req_cpu -= pod.vmi.vm.vcpus / self.s.cpu_allocation_ratio
        pod.node.req_mem -= pod.vmi.vm.memory
        self.store.delete(POD, (NAMESPACE, pod.name))
        for listener in self.pod_delete_listeners:
            listener(pod)

    def _sync_annotation(self, now: int, pod: Pod) -> None:
        """virt-controller: the source pod's eviction-in-progress annotation equals the mark."""
        if pod.name not in self.pods:
            return
        want = bool(pod.vmi.evacuation_node) and pod.vmi.pod is pod
        if want == pod.eviction_in_progress:
            return
        pod.eviction_in_progress = want
        pod.updates += 1
        self.publish_pod(pod)
        for listener in self.pod_listeners:
            listener(pod, now)

    # ---- the eviction admitter (virt-launcher-eviller) -----------------------

    def admit_eviction(self, pod_name: str, now: int, from_descheduler: bool) -> Answer:
        """KubeVirt's validating webhook on pods/eviction, with its side effect."""
        pod = self.pods.get(pod_name)
        if pod is None:
            return Answer(True, "pod not found", "kubevirt_not_found")
        vmi = pod.vmi
        ref = f'VMI "{NAMESPACE}/{vmi.name}"'
        if vmi.evacuation_node:
            return Answer(False, f"Evacuation in progress: {BACKGROUND} of {ref}", "kubevirt_evacuation_in_progress")
        if pod.node is not vmi.node:
            return Answer(False, "Eviction request for target Pod", "kubevirt_target_pod")
        node = pod.node.name
        if from_descheduler and self.marked_on[node] > 0:
            self.concurrent_evacuations += 1
        self.marked_on[node] += 1
        vmi.evacuation_node = node
        # the admitter adds the annotation for the descheduler and never removes it; only a successful
        # migration does (virt-handler): a drain's eviction of a VMI the descheduler marked before (and whose
        # mark was cancelled) still carries it, so its VMIM gets system-maintenance too
        vmi.from_descheduler = vmi.from_descheduler or from_descheduler
        self.vmi_updated(vmi, now)  # the VMI update wakes the evacuation controller for the node: it creates the VMIM
        self.schedule(now + ANNOTATION_DELAY, self._sync_annotation, (pod,))
        self.observe_leavers(pod.node)
        return Answer(False, f"{BACKGROUND} of {ref}", "kubevirt_evacuation")

    # ---- the evacuation and migration controllers ----------------------------

    def enqueue(self, node: str, now: int, after: int = 0) -> None:
        """The evacuation controller's work queue gets ``node``: now (``Add``: a key already waiting
        is not added twice), or ``after`` seconds from now (``AddAfter``: one delayed entry per key, the
        earliest, as client-go's delaying queue keeps it)."""
        if node not in self.node_by_name:
            return
        if after <= 0:
            if (node, now) not in self._evac_queued:
                self._evac_queued.add((node, now))
                self.schedule(now, self._evacuation_sync, (node,))
            return
        at = now + after
        due = self._evac_delayed.get(node)
        if due is not None and due <= at:
            return
        self._evac_delayed[node] = at
        self.schedule(at, self._delayed_ready, (node,))

    def _delayed_ready(self, now: int, node: str) -> None:
        if self._evac_delayed.get(node) == now:
            del self._evac_delayed[node]
            self.enqueue(node, now)

    def _heartbeat(self, now: int, node: str) -> None:
        """virt-handler's heartbeat patches its Node's schedulable label and heartbeat annotation
        (pkg/virt-handler/heartbeat/heartbeat.go:140-181) every ``heartbeat_interval`` x (1 + jitter x U)
        seconds (``wait.JitterUntil(h.do, 1m, 1.2, true, ...)``, heartbeat.go:96; vm.go:191): a Node
        update, which wakes the evacuation controller for the node (evacuation.go:121-134)."""
        self.enqueue(node, now)
        for listener in self.heartbeat_listeners:
            listener(node, now)
        s = self.s
        gap = s.heartbeat_interval * (1 + s.heartbeat_jitter * self.heartbeat_rng.random())
        self.schedule(now + max(1, int(gap)), self._heartbeat, (node,))

    def _migration_in_progress(self, vmi: VMI) -> bool:
        """``IsMigrating``: ``migrationState`` has a start and no end (pkg/util/migrations/migrations.go:77-98)."""
        m = vmi.migration
        return m is not None and m.copy_start is not None and m.end is None

    def _evacuation_sync(self, now: int, node: str) -> None:
        """One pass of the evacuation controller over ``node`` (evacuation.go:297-452)."""
        self._evac_queued.discard((node, now))
        n = self.node_by_name[node]
        tainted = n.no_schedule == KUBEVIRT_DRAIN_TAINT
        if not tainted and self.marked_on[node] == 0:
            return
        on_node = [p.vmi for p in self.pods_on[node].values() if p.vmi.pod is p and p.vmi.node is n]
        if tainted:  # the deprecated drain taint: every VMI on the node (evacuation.go:458-466, 523-530)
            wanted = on_node
        else:  # getMarkedForEvictionVMIs (evacuation.go:327-335)
            wanted = [v for v in on_node if v.evacuation_node == node and not self._migration_in_progress(v)]
        # filterRunningNonMigratingVMIs (evacuation.go:480-519): all modelled VMs are LiveMigrate and migratable
        candidates = [v for v in wanted if not any(m.end is None for m in v.vmims) and v.active_pods <= 1]
        if not candidates:
            return
        self.order_rng.shuffle(candidates)  # the node index is a set: no defined order
        if not self.s.migration_priority_queue:
            # evacuation.go:380-418: Pending VMIMs (those in backoff too) are not counted as running
            free = min(self.s.parallel_migrations_per_cluster - len(self.running),
                       self.s.parallel_outbound_migrations_per_node - self.outbound[node])
            if free <= 0:
                self.enqueue(node, now, LIMITS_RECHECK)
                return
            candidates = candidates[:free]
        for vmi in candidates:
            self._create_vmim(vmi, now)

    def _create_vmim(self, vmi: VMI, now: int) -> None:
        """``GenerateNewMigration`` (evacuation.go:337-359) and its creation; the migration controller then
        holds it Pending while ``handleMigrationBackoff`` says so (migration.go:1051-1113), counted from
        the previous VMIM's failure."""
        self._seq += 1
        previous = vmi.vmims  # what the garbage collector left, oldest first
        backoff = retry_backoff([m.phase for m in previous], self.s.backoff_initial)
        eligible = now
        if backoff and previous[-1].phase == "Failed" and previous[-1].end is not None:
            eligible = max(now, previous[-1].end + backoff)
        m = Migration(
            seq=self._seq, name=vmim_name(self._seq), uid=f"uid-vmim-{self._seq:06d}", vmi=vmi,
            created=now, eligible_at=eligible,
            priority=PRIORITY_DESCHEDULER if vmi.from_descheduler else PRIORITY_DRAIN,
            evacuation_node=vmi.node.name,  # the key of the node being synced (evacuation.go:340, 432)
            queued=self.s.migration_priority_queue,
        )
        vmi.vmims.append(m)
        self.pending.append(m)
        self.vmim_updated(m, now)
        if eligible > now:
            self.schedule(m.eligible_at, self._process, (m,))
        else:
            self._process(now, m)

    def _process(self, now: int, m: Migration) -> None:
        """The migration controller takes up one pending VMIM (its backoff over, or re-queued)."""
        if m in self.pending:
            self.try_start(now, [m])

    def try_start(self, now: int, only: list[Migration] | None = None) -> None:
        """Start what the limits allow (migration.go:1341-1405): by priority when the gate is on, then the
        oldest. A VMIM the limits refuse is looked at again a few seconds later."""
        pool = self.pending if only is None else only
        if not pool:
            return
        ready = sorted((m for m in pool if m.eligible_at <= now), key=lambda m: (-m.queue_priority, m.created, m.seq))
        for m in ready:
            source = m.vmi.node
            if (len(self.running) >= self.s.parallel_migrations_per_cluster
                    or self.outbound[source.name] >= self.s.parallel_outbound_migrations_per_node):
                delay = GATED_RECHECK[m.priority] if m.queued else LIMITS_RECHECK
                if m.recheck_at <= now:
                    m.recheck_at = now + delay
                    self.schedule(m.recheck_at, self._process, (m,))
                continue
            self._start(m, source, now)

    def schedulable_targets(self, vm: VM, source: Node) -> list[Node]:
        return [n for n in self.nodes if n is not source and not n.cordoned and not n.no_schedule
                and n.req_mem + vm.memory <= n.memory]

    def choose_target(self, vm: VM, source: Node) -> Node | None:
        """The scheduler's pick: a node that fits (memory requests, no cordon, no NoSchedule
        taint), the fewest PreferNoSchedule taints first, then the least allocated
        (LeastAllocated on cpu and memory requests), ties broken at random."""
        if vm.target_unschedulable:
            return None
        best: list[Node] = []
        best_key = None
        for n in self.schedulable_targets(vm, source):
            free = (1 - n.req_cpu / n.cpu) + (1 - n.req_mem / n.memory)
            key = (-n.soft_taints, round(free, 9))
            if best_key is None or key > best_key:
                best, best_key = [n], key
            elif key == best_key:
                best.append(n)
        if not best:
            return None
        return best[0] if len(best) == 1 else self.rng.choice(best)

    def failure_probability(self, vm: VM, source: Node) -> float:
        if vm.failure_probability is not None:
            return vm.failure_probability
        return self.s.failure_probability if source.failure_probability is None else source.failure_probability

    def network(self, node: Node) -> float:
        return self.s.network if node.network is None else node.network

    def _start(self, m: Migration, source: Node, now: int) -> None:
        """The migration controller takes the VMIM: slot, target pod, then the copy."""
        self.pending.remove(m)
        self.running.append(m)
        self.outbound[source.name] += 1
        m.phase, m.start, m.source = "Scheduling", now, source
        target = self.choose_target(m.vmi.vm, source)
        m.version += 1
        if target is None:
            # the target pod stays Pending; KubeVirt fails the VMIM after the unschedulable timeout
            self.schedule(now + self.s.unschedulable_timeout, self._end_event, (m, m.version, "unschedulable"))
        else:
            m.target = target
            m.target_pod = self._new_pod(m.vmi, target, migration=m)
            self.schedule(now + self.s.setup_seconds, self._begin_copy, (m,))
        self.vmim_updated(m, now)

    def _begin_copy(self, now: int, m: Migration) -> None:
        vmi, source = m.vmi, m.source
        assert source is not None
        m.phase, m.copy_start, m.updated = "Running", now, now
        m.remaining = m.first_pass = vmi.vm.memory
        vmi.migration = m
        if self.rng.random() < self.failure_probability(vmi.vm, source):
            m.fail_at = transient_failure_at(vmi.vm, self.network(source), now, self.rng)
        self.copying[source.name].append(m)
        self._reshare(source, now)
        self.vmim_updated(m, now)
        self.vmi_updated(vmi, now)

    # ---- the copy: a fluid model on the source node's shared NIC -------------

    def _advance(self, m: Migration, now: float) -> None:
        advance_copy(m, m.vmi.vm.dirty_rate, now)

    def _reshare(self, source: Node, now: int) -> None:
        """The source NIC is split evenly among the node's copying migrations: bring each
        up to now at its old share, then plan its end at the new one."""
        active = self.copying[source.name]
        if not active:
            return
        share = self.network(source) / len(active)
        for m in active:
            self._advance(m, now)
            if m.stalled_since is not None and now - m.stalled_since >= self.s.progress_timeout - EPS:
                continue  # already aborted for lack of progress; its end event is due now
            m.share = share
            self._plan(m, now)

    def _plan(self, m: Migration, now: int) -> None:
        assert m.copy_start is not None
        at, why = copy_end(m, m.copy_start, m.vmi.vm, m.fail_at, self.s, now)
        m.version += 1
        self.schedule(max(now, math.ceil(at - EPS)), self._end_event, (m, m.version, why))

    def _end_event(self, now: int, m: Migration, version: int, why: str) -> None:
        if m.version != version or m.end is not None:
            return  # replanned since
        self._finish(now, m, failed=bool(why), failure=why)

    def _finish(self, now: int, m: Migration, failed: bool, failure: str = "") -> None:
        vmi = m.vmi
        source, target = m.source, m.target
        assert source is not None
        self.running.remove(m)
        self.outbound[source.name] -= 1
        copying = m in self.copying[source.name]
        if copying:
            self.copying[source.name].remove(m)
        m.phase, m.end, m.failed, m.failure = ("Failed" if failed else "Succeeded"), now, failed, failure
        self.finished.append(MigrationRun(
            vm=vmi.name, cause=m.cause, created=m.created, start=m.start if m.start is not None else now, end=now,
            source=source.name, target=target.name if target else "", failed=failed, failure=failure,
            copy_start=m.copy_start,
        ))
        old = vmi.pod
        if failed:
            vmi.failures_since_success += 1
            if m.target_pod is not None:
                if failure == "unschedulable" or self.s.target_exit_seconds <= 0:
                    self._delete_pod(m.target_pod)  # deleted before the VMIM fails (migration.go:1532-1549)
                else:  # its virt-launcher exits a moment after the failure; the controllers see no change
                    self.schedule(now + self.s.target_exit_seconds, self._target_exited, (m.target_pod,))
        else:
            assert target is not None and m.target_pod is not None
            vmi.failures_since_success = 0
            vmi.node, vmi.pod = target, m.target_pod
            if vmi.evacuation_node:
                self.marked_on[vmi.evacuation_node] -= 1
            vmi.evacuation_node, vmi.from_descheduler = "", False
            if old is not None:
                self._delete_pod(old)  # the source pod completes and is gone
        self.vmim_updated(m, now)
        self.vmi_updated(vmi, now)
        self.retain(vmi, now)
        for listener in self.listeners:
            listener(m)
        if copying:
            self._reshare(source, now)
        # still marked: the evacuation controller creates the next VMIM when it next runs for the node with the
        # target pod gone (the updates above woke it); with the gate on, the freed slot goes to the pending
        # VMIMs by priority at once (migration.go:442-475), without it they find it at their next 5 s look
        if self.s.migration_priority_queue:
            self.try_start(now)

    def _target_exited(self, now: int, pod: Pod) -> None:
        """A failed attempt's target virt-launcher has exited: the pod no longer counts as active
        (``VMIActivePodsCount`` skips completed pods, pkg/controller/controller.go:361-383). Nothing the
        evacuation controller watches changes (it has no pod handler; ``status.activePods`` still lists the
        completed pod). The model drops the pod object here."""
        if pod.name in self.pods:
            self._delete_pod(pod)

    def retain(self, vmi: VMI, now: int) -> None:
        """Garbage-collect all but the newest finished VMIMs of a VMI."""
        finished = [m for m in vmi.vmims if m.phase in ("Succeeded", "Failed")]
        drop = finished[: max(0, len(finished) - self.s.retained_finished_migrations)]
        for m in drop:
            vmi.vmims.remove(m)
            self.store.delete(VMIM, (NAMESPACE, m.name))
        if drop:
            self.enqueue(vmi.node.name, now)  # a VMIM deleted: its VMI's node (evacuation.go:220-222)

    # ---- what other components read -----------------------------------------

    def cancel_evacuation(self, vmi: VMI, node: str, now: int) -> bool:
        """``PUT .../virtualmachineinstances/NAME/evacuate/cancel`` (v1.8+) with
        ``{"evacuationNodeName": node}``: clears the mark, so no new VMIM is created.
        It does not abort a migration already created (queued or running): that one
        still runs, and only its retry is gone. Refused when the node carries KubeVirt's
        drain taint (``nodeDrainTaintKey``, ``kubevirt.io/drain``; any other taint, the
        autoscaler's included, does not count) or the mark is for another node (the
        patch's ``test`` fails): pkg/virt-api/rest/evacuate_cancel.go. The VMI keeps its
        ``kubevirt.io/eviction-source`` annotation. virt-controller then drops the pod's
        eviction-in-progress annotation, as for any unmarked VMI."""
        target = self.node_by_name.get(node)
        if vmi.evacuation_node != node or target is None or target.no_schedule == KUBEVIRT_DRAIN_TAINT:
            return False
        self.marked_on[node] -= 1
        vmi.evacuation_node = ""
        self.vmi_updated(vmi, now)
        if vmi.pod is not None:
            self.schedule(now + ANNOTATION_DELAY, self._sync_annotation, (vmi.pod,))
        return True

    def running_runs(self) -> list[MigrationRun]:
        return [
            MigrationRun(m.vmi.name, m.cause, m.created, m.start if m.start is not None else 0, None,
                         m.source.name if m.source else "", m.target.name if m.target else "", False)
            for m in self.running
        ]

    def leaving(self, node: str) -> int:
        """VMs marked for evacuation from ``node``."""
        return self.marked_on[node]

    def descheduler_leavers(self, node: str) -> list[VMI]:
        """The VMs leaving ``node`` because of the descheduler: marked for evacuation from it by a
        descheduler eviction, or with an unfinished descheduler-caused VMIM while on it (a VMIM queued
        or running after its mark was cancelled still moves the VM). A departure ends when the VM
        left, or when it is no longer marked and has no unfinished VMIM."""
        out = []
        for vmi in {p.vmi.name: p.vmi for p in self.pods_on[node].values()}.values():
            if vmi.node.name != node:
                continue  # a migration target's pod: the VM runs elsewhere
            if (vmi.evacuation_node == node and vmi.from_descheduler) or any(
                    m.end is None and m.priority == PRIORITY_DESCHEDULER for m in vmi.vmims):
                out.append(vmi)
        return out

    def observe_leavers(self, node: Node) -> None:
        """Called where the count can grow (a new mark, a node's drain ending): keeps the maximum
        over every instant a node is not being drained."""
        if not (node.cordoned or node.no_schedule):
            self.max_leaving_per_node = max(self.max_leaving_per_node, len(self.descheduler_leavers(node.name)))

    def set_cordoned(self, node: Node, cordoned: bool, now: int) -> None:
        node.cordoned = cordoned
        self.node_updated(node, now)
        if not cordoned:
            self.observe_leavers(node)
            self.try_start(now)

    def set_no_schedule(self, node: Node, key: str, now: int) -> None:
        node.no_schedule = key
        self.node_updated(node, now)
        if not key:
            self.observe_leavers(node)
            self.try_start(now)


def _state(m: Migration) -> dict:
    state = {
        "migrationUid": m.uid,
        "startTimestamp": ts(m.copy_start),
        "sourceNode": m.source.name if m.source else "",
        "targetNode": m.target.name if m.target else "",
        "targetPod": m.target_pod.name if m.target_pod else "",
        "mode": "PreCopy",
    }
    if m.end is not None:
        state.update(endTimestamp=ts(m.end), completed=not m.failed, failed=m.failed)
    return state
