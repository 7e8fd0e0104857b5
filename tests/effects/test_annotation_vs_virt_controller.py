"""The guard's eviction-in-progress writer beside a virt-controller-like actor, over HTTP.

The guard runs as in ``serve``: informers keep its store current from the fake
API server, and a thread sends it a denial every 20 ms (a descheduler and a
drain hammering one VM). Beside it, ``VirtController`` reconciles the
annotation the way KubeVirt does:

- ``v1.7`` (and later): present with ``"true"`` exactly while the VMI is marked
  for evacuation, on the ready source pod only;
- ``v1.6`` (before 1.7): ``"kubevirt"`` added when a migration starts and
  removed when it ends, failed ones included, while the VMI stays marked.

Every pod PATCH is recorded by the fake API server; the actor sends merge
patches, the guard JSON patches, so each write is attributed.
"""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from app.backoff import Backoff
from app.cluster.informer import ClusterWatch
from app.cluster.listing import list_into
from app.cluster.store import ClusterStore
from app.effects import Effects, KubeEffectsApi
from app.effects.annotate import NOT_NEEDED, AnnotateJob
from app.metrics import Metrics
from app.policy import PolicySettings, Reason, decide
from tests.effects.support import EIP, NOW, review_of
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

pytestmark = pytest.mark.timeout(60)
NS = "vms"
POD = "virt-launcher-db-aaaaa"
MERGE = "application/merge-patch+json"


class VirtController(threading.Thread):
    """Reconciles the annotation on launcher pods from VMIs, through the API, every 30 ms."""

    def __init__(self, api: FakeApiServer, semantics: str) -> None:
        super().__init__(daemon=True, name=f"virt-controller-{semantics}")
        self.semantics = semantics
        self.client = k8s.ApiClient(api.configuration())
        self.core, self.custom = k8s.CoreV1Api(self.client), k8s.CustomObjectsApi(self.client)
        self.stop = threading.Event()
        self.paused = threading.Event()  # set: reconcile nothing (a virt-controller slower than the guard)
        self.rounds = 0  # finished reconcile rounds: a test waits for it to move on instead of sleeping
        self.seen_migrations: dict[str, tuple[str, bool]] = {}  # vmi -> (migration uid, ended) last seen

    def run(self) -> None:
        while not self.stop.wait(0.03):
            if self.paused.is_set():
                continue
            try:
                self.reconcile()
            except k8s.exceptions.ApiException:
                pass  # a conflict with the guard's write: next round
            self.rounds += 1

    def reconcile(self) -> None:
        vmis = {v["metadata"]["name"]: v for v in self.custom.list_namespaced_custom_object(
            "kubevirt.io", "v1", NS, "virtualmachineinstances")["items"]}
        for pod in self.core.list_namespaced_pod(NS, label_selector="kubevirt.io=virt-launcher").items:
            vmi = vmis.get((pod.metadata.annotations or {}).get("kubevirt.io/domain"))
            if vmi is None:
                continue
            has = EIP in (pod.metadata.annotations or {})
            want = self.v17(pod, vmi) if self.semantics == "v1.7" else self.v16(vmi, has)
            if want is not None and want != has:
                value = ("true" if self.semantics == "v1.7" else "kubevirt") if want else None
                self.core.patch_namespaced_pod(pod.metadata.name, NS, {"metadata": {"annotations": {EIP: value}}},
                                               _content_type=MERGE)

    @staticmethod
    def v17(pod, vmi) -> bool:
        status = vmi.get("status") or {}
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())
        source = pod.spec.node_name == status.get("nodeName")
        return bool(status.get("evacuationNodeName")) and source and ready and pod.status.phase == "Running"

    def v16(self, vmi, has: bool) -> bool | None:
        """Edge-triggered: add when a migration starts, remove when it ends; None: leave as is."""
        state = (vmi.get("status") or {}).get("migrationState") or {}
        uid, ended = state.get("migrationUid", ""), bool(state.get("endTimestamp"))
        before = self.seen_migrations.get(vmi["metadata"]["name"])
        self.seen_migrations[vmi["metadata"]["name"]] = (uid, ended)
        if not uid or before == (uid, ended):
            return None
        return not ended

    def halt(self) -> None:
        self.stop.set()
        self.join(2)
        self.client.close()


class Hammer(threading.Thread):
    """Sends the guard a descheduler eviction of POD every 20 ms, decided on its live store;
    ``stale`` replays a decision taken earlier instead (a decision that aged in the queue)."""

    def __init__(self, store: ClusterStore, effects: Effects) -> None:
        super().__init__(daemon=True, name="hammer")
        self.store, self.effects = store, effects
        self.stop = threading.Event()
        self.stale = None
        self.reasons: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(0.02):
            review = review_of(POD)
            decision = self.stale or decide(review.eviction, self.store, NOW, PolicySettings())
            self.reasons.append(decision.reason)
            self.effects.on_decision(review, decision)

    def halt(self) -> None:
        self.stop.set()
        self.join(2)


def annotation(api: FakeApiServer) -> str | None:
    return (api.get("pod", NS, POD)["metadata"].get("annotations") or {}).get(EIP)


class History(threading.Thread):
    """The annotation's values on POD as a watch sees them, repeats folded: what the descheduler sees."""

    def __init__(self, api: FakeApiServer) -> None:
        super().__init__(daemon=True, name="history")
        self.client = k8s.ApiClient(api.configuration())
        self.values: list[str | None] = []
        self.w = watch.Watch()

    def run(self) -> None:
        core = k8s.CoreV1Api(self.client)
        try:
            for event in self.w.stream(core.list_namespaced_pod, NS, field_selector=f"metadata.name={POD}",
                                       timeout_seconds=50):
                value = (event["object"].metadata.annotations or {}).get(EIP)
                if not self.values or self.values[-1] != value:
                    self.values.append(value)
        except Exception:  # the server going away at the end of the test
            pass

    def halt(self) -> None:
        self.w.stop()
        self.client.close()


def changes(api: FakeApiServer) -> list[tuple[str, str]]:
    """Pod patches the server accepted: (who, what). An add of a value already there is a no-op."""
    out = []
    for p in list(api.patches):
        if p.resource != "pods" or p.status != 200:
            continue
        if p.content_type == MERGE:
            out.append(("virt-controller", "remove" if p.body["metadata"]["annotations"][EIP] is None else "add"))
        else:
            out.append(("guard", "add"))
    return out


def wait_for(predicate, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def settled(actor: VirtController, hammer: Hammer, effects: Effects, decisions: int = 10) -> bool:
    """The signal that everyone has acted on what the cluster shows now: the guard decided ``decisions``
    more times and its side-effect queue ran dry, and virt-controller reconciled twice more."""
    n, r = len(hammer.reasons), actor.rounds
    return (wait_for(lambda: len(hammer.reasons) >= n + decisions and actor.rounds >= r + 2)
            and effects.queue.wait_idle(5))


@pytest.fixture
def api():
    with FakeApiServer(bookmark_interval=0.5) as server:
        for n in ("node-a", "node-b"):
            server.put(o.node(n))
        server.put(o.vmi(NS, "db", node="node-a", uid="uid-db", created=NOW - 86400))
        server.put(o.launcher_pod(NS, "db", "node-a", name=POD, vmi_uid="uid-db"))
        yield server


@pytest.fixture
def guard(api):
    """Store fed by the real informers, and the real side-effect pipeline writing through the real client."""
    kube = k8s.ApiClient(api.configuration())
    watch = ClusterWatch(kube, stale_after=30).start()
    assert watch.wait_synced(10)
    effects = Effects(watch.store, KubeEffectsApi(kube, timeout=(1.0, 2.0)), Metrics(), events=False,
                      backoff=Backoff(base=0.05, cap=0.2)).start()
    yield watch.store, effects
    effects.stop()
    watch.stop()
    kube.close()


def put_vmi(api, **kw) -> None:
    api.put(o.vmi(NS, "db", uid="uid-db", created=NOW - 86400, **kw))


def test_guard_and_kubevirt_1_7_never_fight(api, guard):
    store, effects = guard
    actor, hammer, history = VirtController(api, "v1.7"), Hammer(store, effects), History(api)
    history.start()
    actor.start()
    hammer.start()
    try:
        # 1. a migration in flight, VMI not marked (rule 6): nobody writes
        put_vmi(api, node="node-a", migration=o.migration_state(start=NOW - 60, source_node="node-a",
                                                                 target_node="node-b", uid="m1"))
        assert wait_for(lambda: Reason.MIGRATION_IN_PROGRESS in hammer.reasons[-3:])
        assert settled(actor, hammer, effects)
        assert changes(api) == [] and annotation(api) is None

        # 2. marked for evacuation (rule 7), virt-controller a little slow: the guard writes "true" first, and
        # virt-controller, when it comes round, finds what it wants and writes nothing
        actor.paused.set()
        put_vmi(api, node="node-a", evacuation_node="node-a",
                migration=o.migration_state(start=NOW - 60, end=NOW - 30, source_node="node-a",
                                            target_node="node-b", uid="m1", failed=True))
        assert wait_for(lambda: annotation(api) == "true")
        assert changes(api) == [("guard", "add")], "the guard's own write"
        assert wait_for(lambda: store.pod(NS, POD).eviction_in_progress)
        actor.paused.clear()
        assert settled(actor, hammer, effects)
        assert history.values == [None, "true"]
        assert changes(api) == [("guard", "add")], changes(api)  # virt-controller agreed: no write of its own
        stale = decide(review_of(POD).eviction, store, NOW, PolicySettings())
        assert stale.reason == Reason.EVACUATION_PENDING

        # 3. the retried migration fails again, the VMI stays marked: the annotation stays, nobody writes
        put_vmi(api, node="node-a", evacuation_node="node-a",
                migration=o.migration_state(start=NOW - 20, end=NOW - 5, source_node="node-a",
                                            target_node="node-b", uid="m2", failed=True))
        written = len(changes(api))
        assert wait_for(lambda: store.vmi(NS, "db").migration.uid == "m2")  # the guard sees the new attempt
        assert settled(actor, hammer, effects)
        assert len(changes(api)) == written and history.values == [None, "true"]

        # 4. the mark is cleared (evacuate-cancel): virt-controller removes the annotation, and the guard,
        # still fed the rule-7 decision from before (aged in a queue), never puts it back
        hammer.stale = stale
        put_vmi(api, node="node-a", migration=o.migration_state(start=NOW - 20, end=NOW - 5, source_node="node-a",
                                                                 target_node="node-b", uid="m2", failed=True))
        assert wait_for(lambda: annotation(api) is None)
        assert wait_for(lambda: not store.pod(NS, POD).eviction_in_progress and not store.vmi(NS, "db").evacuation_node)
        assert settled(actor, hammer, effects, decisions=25)
        assert annotation(api) is None
        assert changes(api)[written:] == [("virt-controller", "remove")], changes(api)
        assert history.values == [None, "true", None], "no flapping: one add, one removal"
    finally:
        hammer.halt()
        actor.halt()
        history.halt()
    assert len(hammer.reasons) > 50, "the guard was asked throughout"


def test_a_store_behind_on_vmis_does_not_re_add_what_virt_controller_removed(api):
    """Pods and VMIs come from two watches: the store can hold the pod without the annotation (removed by
    virt-controller) and the VMI from before its mark was cleared. The job's live read of the VMI stops it."""
    put_vmi(api, node="node-a", evacuation_node="node-a")
    kube = k8s.ApiClient(api.configuration())
    try:
        store = ClusterStore()
        list_into(kube, store)  # VMI marked, pod without the annotation
        put_vmi(api, node="node-a")  # the mark is cleared; the store does not know yet
        job = AnnotateJob(store, KubeEffectsApi(kube), NS, POD)
        assert job.run() == NOT_NEEDED
        assert [p for p in api.patches if p.resource == "pods"] == []
        put_vmi(api, node="node-a", evacuation_node="node-a")  # marked again: now the write is right
        list_into(kube, store)
        assert AnnotateJob(store, KubeEffectsApi(kube), NS, POD).run() == "applied"
        assert annotation(api) == "true"
    finally:
        kube.close()


def test_unready_and_target_pods_are_left_alone(api, guard):
    """The source pod on the marked node is not ready, and the target pod of the unfinished migration runs
    elsewhere: under 1.7 neither carries the annotation, and the guard, asked about both, agrees."""
    store, effects = guard
    api.put(o.vmim(NS, "m3", "db", phase="Running", uid="uid-m3", created=NOW - 10))
    api.put(o.launcher_pod(NS, "db", "node-a", name=POD, vmi_uid="uid-db", ready=False))
    api.put(o.launcher_pod(NS, "db", "node-b", name="virt-launcher-db-target", vmi_uid="uid-db",
                           migration_job_uid="uid-m3"))
    put_vmi(api, node="node-a", evacuation_node="node-a")
    actor = VirtController(api, "v1.7")
    actor.start()
    try:
        assert wait_for(lambda: store.pod(NS, POD) is not None and not store.pod(NS, POD).ready
                        and store.vmi(NS, "db").evacuation_node == "node-a"
                        and store.pod(NS, "virt-launcher-db-target") is not None)
        for pod in (POD, "virt-launcher-db-target"):
            review = review_of(pod)
            for _ in range(5):
                effects.on_decision(review, decide(review.eviction, store, NOW, PolicySettings()))
        assert effects.queue.wait_idle(5)  # the jobs ran (and found nothing to write)
        rounds = actor.rounds
        assert wait_for(lambda: actor.rounds >= rounds + 2)  # virt-controller, too, had its say
        assert changes(api) == []
        api.put(o.launcher_pod(NS, "db", "node-a", name=POD, vmi_uid="uid-db", ready=True))
        assert wait_for(lambda: annotation(api) == "true"), "the ready source pod does get it (the actor works)"
    finally:
        actor.halt()


def test_before_1_7_the_guard_re_adds_after_a_failed_migration(api, guard):
    """KubeVirt < 1.7 removes the annotation when a migration ends, failed ones included, while the VMI stays
    marked and the evacuation controller retries. The guard re-adds "true" on the next denied eviction, so the
    descheduler keeps counting the VM as in flight instead of evicting another VM from its node."""
    store, effects = guard
    actor, hammer = VirtController(api, "v1.6"), Hammer(store, effects)
    actor.start()
    try:
        put_vmi(api, node="node-a", evacuation_node="node-a",
                migration=o.migration_state(start=NOW - 10, source_node="node-a", target_node="node-b", uid="m1"))
        assert wait_for(lambda: annotation(api) == "kubevirt")
        put_vmi(api, node="node-a", evacuation_node="node-a",
                migration=o.migration_state(start=NOW - 10, end=NOW - 1, source_node="node-a", target_node="node-b",
                                            uid="m1", failed=True))
        assert wait_for(lambda: annotation(api) is None)
        assert changes(api) == [("virt-controller", "add"), ("virt-controller", "remove")]
        hammer.start()  # the descheduler asks again: rule 7, evacuation pending
        assert wait_for(lambda: annotation(api) == "true")
        assert wait_for(lambda: store.pod(NS, POD).eviction_in_progress)  # the guard sees its own write
        assert settled(actor, hammer, effects)
        assert changes(api)[2:] == [("guard", "add")] and annotation(api) == "true"
    finally:
        hammer.halt()
        actor.halt()
