"""Side-effect judgement without an API server: when to annotate, what to patch, how Events aggregate."""

import logging

import jsonpatch
import pytest

from app.domain.records import migration_from_object, pod_from_object, vmi_from_object
from app.effects import Effects
from app.effects.annotate import AnnotateJob, annotation_patch, wanted, why_not
from app.effects.events import ALLOWED_EVENT_REASON, CONFIRM_DELAYS, EVENT_REASON, EventRecorder, event_message
from app.effects.kubeapi import Conflict, NotFound, TransientApiError
from app.effects.queue import Backoff, EffectQueue, Retry
from app.metrics import Metrics
from app.policy import Reason
from tests.effects.support import (
    EIP,
    EVICTION_REASON,
    NS,
    FakeClock,
    RecordingApi,
    decided,
    node_obj,
    pod_obj,
    review_of,
    store_of,
    vmi_obj,
)

POD = "virt-launcher-db-abcde"


def evacuating_store(**pod_kw):
    return store_of(node_obj("node-a"), vmi_obj("db", "node-a", evacuation="node-a"),
                    pod_obj(POD, "db", "node-a", **pod_kw))


# ---- the annotation ----------------------------------------------------------------


def test_patch_tests_the_resource_version_then_adds_the_escaped_key():
    pod = pod_from_object(pod_obj(POD, "db", "node-a", rv_="4711"))
    assert annotation_patch(pod) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "4711"},
        {"op": "add", "path": "/metadata/annotations/descheduler.alpha.kubernetes.io~1eviction-in-progress",
         "value": "true"},
    ]


def test_patch_adds_the_whole_map_when_the_pod_has_no_annotations():
    obj = pod_obj(POD, "db", "node-a", annotations={})
    assert "annotations" not in obj["metadata"]
    patch = annotation_patch(pod_from_object(obj))
    assert patch[1] == {"op": "add", "path": "/metadata/annotations", "value": {EIP: "true"}}
    assert jsonpatch.apply_patch(obj, patch)["metadata"]["annotations"] == {EIP: "true"}  # a valid patch
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch({**obj, "metadata": {**obj["metadata"], "resourceVersion": "101"}}, patch)


@pytest.mark.parametrize("pod_kw,vmi_kw,why", [
    ({}, {"evacuation": "node-a"}, ""),
    ({}, {}, "not marked"),
    ({}, {"evacuation": "node-b"}, "not from the pod's node"),
    ({"eviction_in_progress": True}, {"evacuation": "node-a"}, "already has"),
    ({"phase": "Succeeded"}, {"evacuation": "node-a"}, "not a running virt-launcher"),
    ({"rv_": ""}, {"evacuation": "node-a"}, "no resourceVersion"),
    ({"ready": False}, {"evacuation": "node-a"}, "not ready"),  # KubeVirt >= 1.7: the ready source pod only
    ({}, {"evacuation": "node-a", "node": "node-b"}, "not the source pod"),  # the VMI already runs elsewhere
])
def test_only_a_pod_whose_vmi_is_marked_from_its_node_justifies_the_annotation(pod_kw, vmi_kw, why):
    pod = pod_from_object(pod_obj(POD, "db", "node-a", **pod_kw))
    vmi_kw = {"node": "node-a", **vmi_kw}
    vmi = vmi_from_object(vmi_obj("db", vmi_kw.pop("node"), **vmi_kw))
    assert (why in why_not(pod, vmi)) if why else why_not(pod, vmi) == ""


def test_the_target_pod_of_an_unfinished_migration_never_gets_the_annotation():
    """A target pod on the marked node (a migration back to it) is not the source pod KubeVirt annotates."""
    from tests.builders import vmim
    pod = pod_obj(POD, "db", "node-a", job="uid-m1")
    unfinished = vmim("m1", "db", "Running", created=10, uid="uid-m1")
    store = store_of(node_obj("node-a"), vmi_obj("db", "node-a", evacuation="node-a"), pod, unfinished)
    p, v = store.pod(NS, POD), store.vmi(NS, "db")
    assert why_not(p, v) == ""  # without the store's migrations it looks like the source pod
    assert "target of an unfinished migration" in why_not(p, v, store)
    store.upsert(migration_from_object(vmim("m1", "db", "Succeeded", created=10, uid="uid-m1")))
    assert why_not(p, v, store) == "", "after the migration succeeded the former target is the source pod"


def test_rule_7_denial_wants_the_annotation_and_rule_6_without_a_mark_does_not():
    _, d7 = decided(evacuating_store(), POD)
    assert d7.reason == Reason.EVACUATION_PENDING and wanted(d7)
    migrating = store_of(node_obj("node-a"), vmi_obj("db", "node-a", migrating_from="node-a"), pod_obj(POD, "db", "node-a"))
    _, d6 = decided(migrating, POD)
    assert d6.reason == Reason.MIGRATION_IN_PROGRESS and not wanted(d6)
    _, dry = decided(evacuating_store(), POD, dry_run=True)
    assert dry.denied and not wanted(dry)


def test_job_rechecks_the_store_when_it_runs_not_the_decision():
    store, api = evacuating_store(), RecordingApi()
    _, decision = decided(store, POD)
    assert wanted(decision)
    store.upsert(vmi_from_object(vmi_obj("db", "node-a")))  # the mark is cleared before the job runs
    assert AnnotateJob(store, api, NS, POD).run() == "not_needed"
    assert api.calls == []


def test_a_refused_patch_waits_for_the_store_to_see_the_new_pod_before_trying_again():
    store, api = evacuating_store(rv_="100"), RecordingApi(errors=[Conflict("422 Unprocessable Entity")])
    job = AnnotateJob(store, api, NS, POD)
    with pytest.raises(Retry):
        job.run()
    with pytest.raises(Retry):  # store still at 100: no second blind write
        job.run()
    assert len(api.of("patch_pod")) == 1
    store.upsert(pod_from_object(pod_obj(POD, "db", "node-a", rv_="101")))
    assert job.run() == "applied"
    assert api.of("patch_pod")[-1][3][0]["value"] == "101"


def test_a_conflict_the_store_never_explains_is_retried_with_the_same_guard():
    store, api = evacuating_store(rv_="100"), RecordingApi(errors=[Conflict("409")])
    job = AnnotateJob(store, api, NS, POD)
    for _ in range(3):  # the conflict, then two waits for the store
        with pytest.raises(Retry):
            job.run()
    assert len(api.calls) == 1
    assert job.run() == "applied"
    assert [c[3][0]["value"] for c in api.of("patch_pod")] == ["100", "100"]


def test_after_a_conflict_a_pod_that_now_has_the_annotation_is_left_alone():
    store, api = evacuating_store(rv_="100"), RecordingApi(errors=[Conflict("422")])
    job = AnnotateJob(store, api, NS, POD)
    with pytest.raises(Retry):
        job.run()
    store.upsert(pod_from_object(pod_obj(POD, "db", "node-a", rv_="101", eviction_in_progress=True)))
    assert job.run() == "not_needed" and len(api.calls) == 1


def test_a_deleted_pod_is_not_an_error():
    api = RecordingApi(errors=[NotFound("404")])
    assert AnnotateJob(evacuating_store(), api, NS, POD).run() == "not_needed"


# ---- Events: rate limit and aggregation ----------------------------------------------


class Harness:
    def __init__(self, interval=60.0, errors=()):
        self.mono, self.wall, self.metrics = FakeClock(1000.0), FakeClock(1_800_000_000.0), Metrics()
        self.api = RecordingApi(errors=list(errors))
        self.queue = EffectQueue(self.metrics, clock=self.mono, backoff=Backoff(base=1, cap=1), rand=lambda: 1.0)
        self.rec = EventRecorder(self.api, self.queue, self.metrics, interval=interval, clock=self.wall,
                                 monotonic=self.mono, instance="guard-0")
        self.store = store_of(node_obj("node-a"), node_obj("node-b"),
                              vmi_obj("db", "node-a", migrating_from="node-a"), pod_obj(POD, "db", "node-a"),
                              vmi_obj("web", "node-b", migrating_from="node-b"),
                              pod_obj("virt-launcher-web-x", "web", "node-b"))

    def deny(self, pod=POD, **kw):
        review, d = decided(self.store, pod, **kw)
        assert d.denied
        self.rec.record(review, d)
        return review, d

    def advance(self, seconds):
        self.mono.advance(seconds)
        self.wall.advance(seconds)

    def drain(self):
        while self.queue.run_once():
            pass


def test_first_denial_creates_a_warning_event_on_the_vmi():
    h = Harness()
    review, d = h.deny()
    h.drain()
    [(op, ns, name, ev)] = h.api.calls
    assert op == "create_event" and ns == NS and name.startswith("db.")
    assert ev["involvedObject"] == {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                    "namespace": NS, "name": "db", "uid": "uid-db"}
    assert (ev["type"], ev["reason"], ev["count"]) == ("Warning", EVENT_REASON, 1)
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2027-01-15T08:00:00Z"
    assert d.message in ev["message"] and POD in ev["message"]
    assert "sigs.k8s.io/descheduler" in ev["message"] and EVICTION_REASON in ev["message"]
    assert ev["source"]["component"] == ev["reportingComponent"] == "kubevirt-eviction-guard"


def test_denials_within_the_interval_become_one_patch_of_count_and_last_timestamp():
    h = Harness(interval=60)
    h.deny()
    h.drain()
    for _ in range(3):
        h.advance(10)
        h.deny()
    h.drain()
    assert len(h.api.calls) == 1  # rate-limited: nothing written before the interval ends
    h.advance(30)  # t=60 since the create
    h.drain()
    op, _, name, patch = h.api.calls[-1]
    assert op == "patch_event" and name == h.api.calls[0][2]
    assert patch["count"] == 4 and patch["lastTimestamp"] == "2027-01-15T08:00:30Z"
    assert h.metrics.registry.get_sample_value("kubevirt_eviction_guard_events_rate_limited_total",
                                               {"reason": "migration_in_progress"}) == 3
    h.advance(600)
    h.drain()
    assert len(h.api.calls) == 2  # nothing pending: no write
    h.deny()
    h.drain()
    assert h.api.calls[-1][3]["count"] == 5  # the next denial after a quiet spell is written at once


def test_each_vmi_and_each_reason_is_its_own_series():
    h = Harness()
    h.deny()
    h.deny(pod="virt-launcher-web-x")
    h.store.upsert(vmi_from_object(vmi_obj("db", "node-a", evacuation="node-a")))
    h.deny()  # db again, now evacuation_pending
    h.drain()
    creates = h.api.of("create_event")
    assert [(c[3]["involvedObject"]["name"], c[3]["message"].split("(")[1].split(")")[0]) for c in creates] == [
        ("db", "migration_in_progress"), ("web", "migration_in_progress"), ("db", "evacuation_pending")]


def test_an_expired_event_is_created_again():
    h = Harness(interval=1)
    h.deny()
    h.drain()
    h.api.errors.append(NotFound("404"))
    h.advance(5)
    h.deny()
    h.drain()
    assert [c[0] for c in h.api.calls] == ["create_event", "patch_event", "create_event"]
    assert h.api.calls[-1][3]["count"] == 1


def test_a_failed_write_keeps_the_count_for_the_retry():
    h = Harness(errors=[TransientApiError("503")])
    h.deny()
    h.drain()
    h.deny()
    h.advance(1)
    h.drain()
    assert [c[0] for c in h.api.calls] == ["create_event", "create_event"]
    assert h.api.calls[-1][3]["count"] == 2


def test_event_message_names_requester_user_and_descheduler_strategy():
    review, d = decided(evacuating_store(), POD)
    msg = event_message(review, d)
    assert msg.startswith(f"Eviction of pod {POD} denied (evacuation_pending): Evacuation in progress")
    assert msg.endswith("requested by sigs.k8s.io/descheduler as system:serviceaccount:kube-system:descheduler-sa"
                        f" ({EVICTION_REASON})")
    drain = review_of(POD, requested_by="", reason="", username="admin@example.com")
    assert event_message(drain, d).endswith("requested by admin@example.com")
    long = review_of(POD, reason="x" * 5000)
    assert len(event_message(long, d)) <= 1024


def test_series_memory_is_bounded():
    h = Harness()
    h.rec.max_series = 1
    h.deny()
    h.deny(pod="virt-launcher-web-x")
    assert len(h.rec._series) == 1


# ---- the hook ------------------------------------------------------------------------------


@pytest.mark.parametrize("dry", [{"dry_run": True}, {"body_dry_run": True}])
def test_dry_run_is_logged_and_causes_nothing(dry, caplog):
    caplog.set_level(logging.INFO)
    store, api = evacuating_store(), RecordingApi()
    fx = Effects(store, api, Metrics())
    review, d = decided(store, POD, **dry)
    assert d.denied and d.dry_run
    fx.on_decision(review, d)
    assert len(fx.queue) == 0 and api.calls == []
    assert any(getattr(r, "dry_run", None) is True for r in caplog.records)


def test_a_denial_queues_an_event_and_the_annotation_an_allow_queues_an_event_for_the_descheduler_only():
    store, api = evacuating_store(), RecordingApi()
    fx = Effects(store, api, Metrics())
    review, d = decided(store, POD)
    fx.on_decision(review, d)
    assert len(fx.queue) == 2
    allow_store = store_of(node_obj("node-a"), vmi_obj("db", "node-a"), pod_obj(POD, "db", "node-a"))
    fx2 = Effects(allow_store, api, Metrics())
    review, d = decided(allow_store, POD)
    assert d.allowed and d.reason == Reason.ALLOWED
    fx2.on_decision(review, d)
    assert len(fx2.queue) == 1, "the descheduler's allowed eviction: one EvictionAllowed flush"
    for kw in ({"requested_by": "", "reason": "", "username": "admin"},  # a user: no Event
               {"dry_run": True}):  # a dry run: no Event
        fx3 = Effects(allow_store, api, Metrics())
        review, d = decided(allow_store, POD, **kw)
        assert d.allowed
        fx3.on_decision(review, d)
        assert len(fx3.queue) == 0, kw
    fx4 = Effects(allow_store, api, Metrics(), descheduler_users=frozenset({"admin"}))
    review, d = decided(allow_store, POD, requested_by="", reason="", username="admin")
    fx4.on_decision(review, d)
    assert len(fx4.queue) == 1, "a user listed in deschedulerUsers counts as the descheduler"


def test_a_stuck_evacuation_denial_never_wants_the_annotation():
    """Rule 5a tells the descheduler to move on: the guard must not put the pod back into its in-flight
    cache by writing eviction-in-progress (an update event the descheduler's informer would see)."""
    from tests.builders import vmim
    from tests.effects.support import NOW as T0
    from tests.effects.support import ts as ago

    marked = vmi_obj("db", "node-a", evacuation="node-a")
    marked["metadata"]["annotations"] = {"kubevirt.io/eviction-source": "descheduler"}
    failed = []
    for i in range(3):
        m = vmim(f"e{i}", "db", "Failed", created=0, evacuation="node-a", priority="system-maintenance")
        m["metadata"]["creationTimestamp"] = ago(900 - 240 * i)
        failed.append(m)
    store = store_of(node_obj("node-a"), marked, pod_obj(POD, "db", "node-a"), *failed)
    _, d = decided(store, POD, now=T0)
    assert d.reason == Reason.EVACUATION_STUCK and d.denied and not d.background and not wanted(d)


def test_an_allowed_eviction_no_migration_follows_leaves_no_event_and_its_look_out_gives_up(caplog):
    """A review for an eviction that never happened (anyone who reaches the port can send one): the look-out looks
    at its intervals, gives up, writes nothing and leaves the VMI to a later eviction's own look-out."""
    h = Harness()
    h.store = store_of(node_obj("node-a"), vmi_obj("calm", "node-a"), pod_obj("virt-launcher-calm-x", "calm", "node-a"))
    review, d = decided(h.store, "virt-launcher-calm-x")
    assert d.allowed and d.reason == Reason.ALLOWED
    h.rec.record_allowed(h.store, review, d)
    with caplog.at_level(logging.INFO, logger="kubevirt_eviction_guard.effects"):
        for delay in CONFIRM_DELAYS:  # one look at each interval, the last one gives up
            assert len(h.queue) == 1
            h.advance(delay)
            h.drain()
    assert len(h.queue) == 0 and h.api.calls == []
    assert h.metrics.registry.get_sample_value("kubevirt_eviction_guard_side_effects_total",
                                               {"kind": "event", "outcome": "unconfirmed"}) == 1
    assert any("not followed by a migration" in r.getMessage() for r in caplog.records)
    # a later allowed eviction has a look-out of its own; the migration it starts confirms it, and only it counts
    h.rec.record_allowed(h.store, review, d)
    assert len(h.queue) == 1
    h.store.upsert(vmi_from_object(vmi_obj("calm", "node-a", evacuation="node-a")))
    h.advance(CONFIRM_DELAYS[0])
    h.drain()
    [(op, _, _, ev)] = h.api.calls
    assert (op, ev["reason"], ev["type"], ev["count"]) == ("create_event", ALLOWED_EVENT_REASON, "Normal", 1)
