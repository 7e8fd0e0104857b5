"""Side effects against the fake API server over HTTP, with the real ``kubernetes`` client.

The guard's store is filled the way ``report --kubeconfig`` fills it (one list
of each kind through the API), and refreshed by listing again when a test
changes the cluster: what matters here is what the guard *writes*.
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from app.admission import review as rv
from app.admission.server import GuardContext
from app.backoff import Backoff
from app.cluster.listing import list_into
from app.cluster.store import ClusterStore
from app.domain.records import vmi_from_object
from app.effects import Effects, KubeEffectsApi
from app.metrics import Metrics
from app.policy import PolicySettings, Reason, decide
from app.policy.model import Decision
from tests.effects.support import EIP, NOW, GuardServer, review_doc, review_of
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

pytestmark = pytest.mark.timeout(60)
NS = "vms"
EVAC_POD, MIGR_POD, COOL_POD, QUIET_POD = (f"virt-launcher-{n}-aaaaa" for n in ("evac", "migr", "cool", "quiet"))


def cluster(api: FakeApiServer) -> None:
    """evac: marked for evacuation from node-a (rule 7). migr: migrating, not marked (rule 6).
    cool: migrated 5 minutes ago (rule 9). quiet: never migrated (allowed)."""
    for n in ("node-a", "node-b", "node-c"):
        api.put(o.node(n))
    api.put(o.vmi(NS, "evac", node="node-a", uid="uid-evac", evacuation_node="node-a", created=NOW - 86400))
    api.put(o.vmi(NS, "migr", node="node-a", uid="uid-migr", created=NOW - 86400,
                  migration=o.migration_state(start=NOW - 60, source_node="node-a", target_node="node-c", uid="m1")))
    api.put(o.vmi(NS, "cool", node="node-b", uid="uid-cool", created=NOW - 86400,
                  migration=o.migration_state(start=NOW - 900, end=NOW - 300, source_node="node-c",
                                              target_node="node-b", uid="m2")))
    api.put(o.vmi(NS, "quiet", node="node-c", uid="uid-quiet", created=NOW - 86400))
    for vmi, node, name in (("evac", "node-a", EVAC_POD), ("migr", "node-a", MIGR_POD), ("cool", "node-b", COOL_POD),
                            ("quiet", "node-c", QUIET_POD)):
        api.put(o.launcher_pod(NS, vmi, node, name=name, vmi_uid=f"uid-{vmi}"))


@pytest.fixture
def api():
    with FakeApiServer() as server:
        cluster(server)
        yield server


@pytest.fixture
def kube(api):
    with k8s.ApiClient(api.configuration()) as c:
        yield c


@pytest.fixture
def store(kube):
    s = ClusterStore()
    list_into(kube, s)
    return s


def make_effects(store, kube, metrics=None, **kw) -> Effects:
    kw.setdefault("backoff", Backoff(base=0.05, cap=0.2))
    return Effects(store, KubeEffectsApi(kube, timeout=(1.0, 2.0)), metrics or Metrics(), **kw).start()


def deny(store, pod, **kw) -> tuple[rv.Review, Decision]:
    review = review_of(pod, **kw)
    return review, decide(review.eviction, store, NOW, PolicySettings())


def pod_patches(api):
    return [p for p in api.patches if p.resource == "pods"]


def vmi_events(api, vmi):
    return [e for e in api.events() if e["involvedObject"]["name"] == vmi]


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ---- the annotation --------------------------------------------------------------------


def test_rule_7_denial_patches_the_pod_with_a_guarded_json_patch(api, kube, store):
    fx = make_effects(store, kube)
    try:
        before = api.get("pod", NS, EVAC_POD)["metadata"]["resourceVersion"]
        fx.on_decision(*deny(store, EVAC_POD))
        assert fx.queue.wait_idle(5)
    finally:
        fx.stop()
    [patch] = pod_patches(api)
    assert (patch.name, patch.content_type, patch.status) == (EVAC_POD, "application/json-patch+json", 200)
    assert patch.body == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": before},
        {"op": "add", "path": "/metadata/annotations/descheduler.alpha.kubernetes.io~1eviction-in-progress",
         "value": "true"},
    ]
    pod = api.get("pod", NS, EVAC_POD)
    assert pod["metadata"]["annotations"][EIP] == "true"
    assert pod["metadata"]["annotations"]["kubevirt.io/domain"] == "evac"  # the rest untouched


def test_a_pod_changed_since_the_store_saw_it_is_rechecked_not_blindly_patched(api, kube, store):
    fx = make_effects(store, kube, max_attempts=10)
    try:
        changed = api.get("pod", NS, EVAC_POD)
        changed["metadata"]["labels"]["touched"] = "yes"
        new_version = api.put(changed)["metadata"]["resourceVersion"]  # the store has not seen it yet
        fx.on_decision(*deny(store, EVAC_POD))
        assert wait_for(lambda: any(p.status == 422 for p in pod_patches(api)))
        list_into(kube, store)  # the watch would deliver the new pod; here we list again
        assert fx.queue.wait_idle(5)
    finally:
        fx.stop()
    *refused, landed = pod_patches(api)
    old_version = refused[0].body[0]["value"]
    # refused under the old version (at most once more while waiting for the store: see the unit
    # tests for the waiting), then written under the version the store caught up to
    assert 1 <= len(refused) <= 2 and all(p.status == 422 and p.body[0]["value"] == old_version for p in refused)
    assert landed.status == 200 and landed.body[0]["value"] == new_version != old_version
    assert api.get("pod", NS, EVAC_POD)["metadata"]["labels"]["touched"] == "yes"  # the other change is kept


@pytest.mark.parametrize("dry", [{"dry_run": True}, {"body_dry_run": True}], ids=["request.dryRun", "deleteOptions.dryRun"])
def test_no_patch_and_no_event_on_dry_run(api, kube, store, dry):
    fx = make_effects(store, kube)
    try:
        review, decision = deny(store, EVAC_POD, **dry)
        assert decision.reason == Reason.EVACUATION_PENDING and decision.dry_run
        fx.on_decision(review, decision)
        assert fx.queue.wait_idle(5)
    finally:
        fx.stop()
    assert api.patches == [] and api.events() == []


def test_no_patch_when_the_vmi_is_not_marked_for_evacuation(api, kube, store):
    fx = make_effects(store, kube)
    try:
        review, decision = deny(store, MIGR_POD)
        assert decision.reason == Reason.MIGRATION_IN_PROGRESS
        fx.on_decision(review, decision)
        assert fx.queue.wait_idle(5)
    finally:
        fx.stop()
    assert pod_patches(api) == []
    assert len(vmi_events(api, "migr")) == 1  # the denial is still an Event


def test_a_forged_review_and_decision_cannot_make_the_guard_patch(api, kube, store):
    """The hook is handed a rule-7 denial for the migrating pod, with a VMI record
    claiming the evacuation mark; the store says otherwise, so nothing is written."""
    fx = make_effects(store, kube)
    try:
        review = review_of(MIGR_POD)
        pod = store.pod(NS, MIGR_POD)
        forged_vmi = vmi_from_object(o.vmi(NS, "migr", node="node-a", evacuation_node="node-a"))
        forged = Decision(allowed=False, reason=Reason.EVACUATION_PENDING, message="forged", vmi=forged_vmi,
                          pod=pod, node="node-a")
        fx.on_decision(review, forged)
        # and an AdmissionReview naming a pod the cluster does not have
        ghost = review_of("virt-launcher-ghost-zzzzz")
        fx.on_decision(ghost, decide(ghost.eviction, store, NOW, PolicySettings()))
        assert fx.queue.wait_idle(5)
    finally:
        fx.stop()
    assert pod_patches(api) == []
    assert EIP not in api.get("pod", NS, MIGR_POD)["metadata"]["annotations"]


def test_the_mark_cleared_before_the_job_runs_means_no_patch(api, kube, store):
    fx = Effects(store, KubeEffectsApi(kube), Metrics())  # not started: the job waits in the queue
    fx.on_decision(*deny(store, EVAC_POD))
    assert len(fx.queue) == 2
    vmi = api.get("vmi", NS, "evac")
    del vmi["status"]["evacuationNodeName"]
    api.put(vmi)
    list_into(kube, store)
    fx.start()
    try:
        assert fx.queue.wait_idle(5)
    finally:
        fx.stop()
    assert pod_patches(api) == []


# ---- Events ----------------------------------------------------------------------------


def test_denials_become_one_aggregated_warning_event_per_vmi_and_reason(api, kube, store):
    fx = make_effects(store, kube, event_interval=1.0)
    try:
        fx.on_decision(*deny(store, COOL_POD))
        assert wait_for(lambda: len(vmi_events(api, "cool")) == 1)  # the first denial is written at once
        for _ in range(3):
            fx.on_decision(*deny(store, COOL_POD))
        fx.on_decision(*deny(store, MIGR_POD))  # another VMI: its own series, not held back
        assert wait_for(lambda: len(api.events()) == 2)
        assert vmi_events(api, "cool")[0]["count"] == 1  # the rest are held back by the rate limit...
        assert wait_for(lambda: vmi_events(api, "cool")[0]["count"] == 4, timeout=5)  # ...and written as one patch
        assert fx.queue.wait_idle(5)  # nothing left, not even a flush scheduled for later
        assert len(api.events()) == 2 and vmi_events(api, "cool")[0]["count"] == 4  # no further writes
    finally:
        fx.stop()
    [cool] = vmi_events(api, "cool")
    assert cool["type"] == "Warning" and cool["reason"] == "EvictionBlocked"
    assert cool["involvedObject"] == {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                      "namespace": NS, "name": "cool", "uid": "uid-cool"}
    assert 'VMI "vms/cool" is in migration cooldown' in cool["message"]
    assert "requested by sigs.k8s.io/descheduler" in cool["message"]
    assert "LowNodeUtilization" in cool["message"]
    writes = [r for r in api.requests if "/events" in r.path]
    assert [r.method for r in writes] == ["POST", "POST", "PATCH"]
    [patch] = [p for p in api.patches if p.resource == "events"]
    assert patch.content_type == "application/merge-patch+json" and set(patch.body) == {"count", "lastTimestamp", "message"}


def test_allowed_descheduler_evictions_become_one_aggregated_normal_event(api, kube, store):
    """Why did my VM move: the quiet VM's allowed descheduler evictions, rate-limited like the denials, written
    once the watch shows KubeVirt marked the VMI (the eviction was real)."""
    metrics = Metrics()
    fx = make_effects(store, kube, metrics, event_interval=1.0)
    try:
        allowed = deny(store, QUIET_POD)
        by_admin = deny(store, QUIET_POD, requested_by="", reason="", username="admin")  # not the descheduler
        assert allowed[1].allowed and allowed[1].reason == Reason.ALLOWED
        fx.on_decision(*allowed)
        looked = lambda: metrics.registry.get_sample_value(  # noqa: E731
            "kubevirt_eviction_guard_side_effects_total", {"kind": "event", "outcome": "waiting"})
        assert wait_for(lambda: looked() == 1)  # the first look for the migration found none: no Event yet
        assert vmi_events(api, "quiet") == []
        store.upsert(vmi_from_object(o.vmi(NS, "quiet", node="node-c", uid="uid-quiet", evacuation_node="node-c",
                                           created=NOW - 86400)))
        assert wait_for(lambda: len(vmi_events(api, "quiet")) == 1)
        fx.on_decision(*allowed)
        fx.on_decision(*allowed)
        fx.on_decision(*by_admin)
        assert wait_for(lambda: vmi_events(api, "quiet")[0]["count"] == 3, timeout=5), vmi_events(api, "quiet")
        assert fx.queue.wait_idle(5)  # nothing left, not even a flush scheduled for later
    finally:
        fx.stop()
    [quiet] = vmi_events(api, "quiet")
    assert (quiet["type"], quiet["reason"], quiet["count"]) == ("Normal", "EvictionAllowed", 3)
    assert quiet["involvedObject"]["uid"] == "uid-quiet"
    msg = quiet["message"]
    assert msg.startswith(f"Eviction of pod {QUIET_POD} on node node-c allowed")
    assert "requested by sigs.k8s.io/descheduler as system:serviceaccount:kube-system:descheduler-sa" in msg
    assert "(triggered by default/LowNodeUtilization: node is overutilized)" in msg  # the descheduler's reason
    # two look-outs confirmed the three evictions: the later two, close together, shared one
    assert metrics.registry.get_sample_value("kubevirt_eviction_guard_side_effects_total",
                                             {"kind": "event", "outcome": "confirmed"}) == 2


# ---- errors and latency of the API server stay off the request path ---------------------


def post(client: httpx.Client, url: str, doc: dict) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    r = client.post(url + "/mutate", content=orjson.dumps(doc), headers={"Content-Type": "application/json"})
    return r, time.perf_counter() - started


def guard_context(store, effects: Effects | None, metrics: Metrics) -> GuardContext:
    return GuardContext(view=store, settings=PolicySettings(), clock=lambda: NOW, metrics=metrics,
                        on_decision=effects.on_decision if effects else None)


def test_a_hanging_or_failing_api_server_changes_neither_the_answer_nor_its_latency(api, kube, store, tmp_path):
    docs = [review_doc(EVAC_POD, uid="u1"), review_doc(COOL_POD, uid="u2"), review_doc(QUIET_POD, uid="u3")]
    expected = [rv.respond(r, decide(r.eviction, store, NOW, PolicySettings()))
                for r in (rv.decode(orjson.dumps(d)) for d in docs)]
    metrics = Metrics()
    api.set_latency(30)  # every API call hangs (longer than the client's read timeout)
    fx = make_effects(store, kube, metrics, max_attempts=2)
    try:
        with GuardServer(guard_context(store, fx, metrics), tmp_path) as guard, \
                httpx.Client(verify=guard.tls, timeout=5) as http:
            for doc, want in zip(docs, expected):
                r, took = post(http, guard.url, doc)
                assert r.status_code == 200 and r.content == want
                assert took < 1.0  # the API call takes 2 s to time out; the answer does not wait for it
            assert not fx.queue.wait_idle(0.2)  # the side effects are still stuck on the API server
            api.set_latency(0)
            api.fail(500, times=-1, verbs=["patch", "create"])  # now it answers, with errors
            r, took = post(http, guard.url, docs[1])
            assert r.content == expected[1] and took < 1.0
            assert fx.queue.wait_idle(15, ready_only=True)  # (the allowed eviction's look-out waits on)
    finally:
        fx.stop()
    errors = metrics.registry.get_sample_value
    assert errors("kubevirt_eviction_guard_side_effect_errors_total", {"kind": "annotation"}) >= 1
    assert errors("kubevirt_eviction_guard_side_effect_errors_total", {"kind": "event"}) >= 1
    assert errors("kubevirt_eviction_guard_side_effects_total", {"kind": "event", "outcome": "failed"}) >= 1
    assert api.events() == []


# ---- metrics, scraped from the real server ----------------------------------------------


def scrape(http: httpx.Client, url: str) -> dict[tuple[str, frozenset], float]:
    text = http.get(url + "/metrics").text
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_after_a_scripted_sequence_of_requests(api, kube, store, tmp_path):
    metrics = Metrics()
    fx = make_effects(store, kube, metrics, event_interval=60)
    P = "kubevirt_eviction_guard_"
    try:
        with GuardServer(guard_context(store, fx, metrics), tmp_path) as guard, \
                httpx.Client(verify=guard.tls, timeout=5) as http:
            script = [review_doc(EVAC_POD), review_doc(COOL_POD), review_doc(COOL_POD), review_doc(MIGR_POD),
                      review_doc(QUIET_POD), review_doc(COOL_POD, dry_run=True),
                      review_doc(COOL_POD, requested_by="", reason="", username="admin")]
            for i, doc in enumerate(script):
                doc["request"]["uid"] = f"uid-{i}"
                assert post(http, guard.url, doc)[0].status_code == 200
                assert fx.queue.wait_idle(5, ready_only=True)  # one step at a time: the counts do not race the worker
            assert http.post(guard.url + "/mutate", content=b"{", headers={"Content-Type": "application/json"}
                             ).status_code == 400
            m = scrape(http, guard.url)
    finally:
        fx.stop()

    def v(name, **labels):
        return m.get((P + name, frozenset(labels.items())), 0.0)

    assert v("decisions_total", decision="denied", reason="cooldown") == 3  # incl. the dry run
    assert v("decisions_total", decision="denied", reason="evacuation_pending") == 1
    assert v("decisions_total", decision="denied", reason="migration_in_progress") == 1
    assert v("decisions_total", decision="allowed", reason="allowed") == 2  # quiet VM; admin not in scope
    assert v("blocks_total", reason="cooldown", node="node-b", namespace=NS) == 3
    assert v("blocks_total", reason="evacuation_pending", node="node-a", namespace=NS) == 1
    assert v("blocks_total", reason="migration_in_progress", node="node-a", namespace=NS) == 1
    # cooldown was computed for the 3 cooldown denials (15m each); the quiet VM has no history
    assert v("effective_cooldown_seconds_count") == 3
    assert v("effective_cooldown_seconds_bucket", le="900.0") == 3
    assert v("admission_duration_seconds_count") == 7
    assert v("bad_requests_total", code="400") == 1
    assert v("side_effects_total", kind="annotation", outcome="applied") == 1
    # cool, evac, migr: one EvictionBlocked write each; quiet: no EvictionAllowed, since no migration followed
    # (its look-out is still waiting; the admin's eviction is not the descheduler's and gets none)
    assert v("side_effects_total", kind="event", outcome="applied") == 3
    assert v("events_rate_limited_total", reason="cooldown") == 1  # the second cool denial, within the minute
    assert v("side_effects_dropped_total", kind="event") == 0
    assert v("side_effect_queue_depth") == 2  # the held-back cool Event, due at the end of its minute; the look-out
    # bounded labels: no pod or VMI name anywhere
    names = {EVAC_POD, COOL_POD, MIGR_POD, QUIET_POD, "evac", "cool", "migr", "quiet"}
    assert not {value for (_, labels) in m for _, value in labels} & names
