"""Kubernetes' EvictionRequests (lifecycle.k8s.io/v1alpha1) in ``explain`` and ``report``: listed as pending with
their requester, never changing the decision.

The objects are recorded from kube-apiserver v1.37.2 with the ``EvictionRequestAPI`` gate on
(tests/fixtures/lifecycle/): what ``kubectl get evictionrequests -o json`` returned for three requests aimed at one
launcher pod (one pending, one withdrawn, one ended by a ``TargetEvicted`` status) and one at another pod."""

from __future__ import annotations

import json

import pytest

from app.domain.evictionrequests import eviction_request_from_object, requests_for_pod
from app.domain.records import RecordError
from app.inspect import explanation, report_model
from app.inspect.explain import explanation_text, requester_request
from app.inspect.report import report_text
from app.policy.model import PolicySettings
from tests.builders import FIXTURES, NOW, NS, node, pod, store_of, vmi

RECORDED = json.loads((FIXTURES / "lifecycle" / "evictionrequests.json").read_text())
POD = "virt-launcher-db-abcde"
POD_UID = "5b0b4fd2-6f0c-4c1e-9d0a-6c1f2f6b1a01"  # the uid the recorded requests name
JUDGEMENT = ("allowed", "code", "reason", "message")


def recorded():
    return [eviction_request_from_object(o) for o in RECORDED["items"]]


def launcher(uid: str = POD_UID) -> dict:
    p = pod("db", "worker-a", name=POD)
    p["metadata"]["uid"] = uid
    return p


def cluster(uid: str = POD_UID):
    return store_of(node("worker-a"), node("worker-b"), vmi("db", "worker-a"), launcher(uid))


def test_the_recorded_requests_parse_as_the_api_server_wrote_them() -> None:
    by_name = {r.name: r for r in recorded()}
    pending, withdrawn, evicted = by_name["db-balance"], by_name["db-withdrawn"], by_name["db-evicted"]
    assert (pending.namespace, pending.pod, pending.pod_uid, pending.requester, pending.intent) == \
        (NS, POD, POD_UID, "descheduler.example.io/balance", "Eviction")
    assert pending.pending and pending.created is not None and not pending.ended
    assert (withdrawn.intent, withdrawn.pending) == ("Withdrawn", False)
    assert (evicted.ended, evicted.pending) == ("TargetEvicted", False)
    assert by_name["web-balance"].pod == "web-1"


def test_requests_for_a_pod_match_its_name_and_uid() -> None:
    requests = recorded()
    assert {r.name for r in requests_for_pod(requests, NS, POD, POD_UID)} == {"db-balance", "db-withdrawn",
                                                                             "db-evicted"}
    assert {r.name for r in requests_for_pod(requests, NS, POD)} == {"db-balance", "db-withdrawn", "db-evicted"}
    # a pod of the same name with another uid: the requests were for its predecessor
    assert requests_for_pod(requests, NS, POD, "00000000-0000-0000-0000-000000000000") == []
    assert requests_for_pod(requests, "other", POD, POD_UID) == []


def test_explain_lists_them_and_decides_as_without_them() -> None:
    store, settings = cluster(), PolicySettings()
    req = requester_request(NS, POD, "descheduler")
    without = explanation(req, store, NOW, settings)
    with_requests = explanation(req, store, NOW, settings, eviction_requests=recorded())
    assert without["evictionRequests"] is None
    assert {k: without[k] for k in JUDGEMENT} == {k: with_requests[k] for k in JUDGEMENT}
    listed = with_requests["evictionRequests"]
    assert [(r["name"], r["requester"], r["pending"]) for r in listed if r["pending"]] == \
        [("db-balance", "descheduler.example.io/balance", True)]
    assert {r["name"]: r["ended"] or r["intent"] for r in listed if not r["pending"]} == \
        {"db-withdrawn": "Withdrawn", "db-evicted": "TargetEvicted"}
    text = explanation_text(with_requests)
    assert "eviction requests (lifecycle.k8s.io/v1alpha1): 1 pending of 3" in text
    assert "db-balance: requester descheduler.example.io/balance, pending" in text
    assert "eviction requests" not in explanation_text(without)
    # none for this pod: an empty list, and nothing printed
    other = explanation(req, cluster("00000000-0000-0000-0000-000000000000"), NOW, settings, eviction_requests=recorded())
    assert other["evictionRequests"] == [] and "eviction requests" not in explanation_text(other)


def test_report_lists_the_pending_ones_by_vm() -> None:
    store, settings = cluster(), PolicySettings()
    without = report_model(store, NOW, settings)
    model = report_model(store, NOW, settings, eviction_requests=recorded())
    assert without["evictionRequests"] is None and "EvictionRequests" not in report_text(without)
    assert [(p["vmi"], p["pod"], p["name"], p["requester"]) for p in model["evictionRequests"]] == \
        [("db", POD, "db-balance", "descheduler.example.io/balance")]
    (row,) = model["vmis"]
    (before,) = without["vmis"]
    assert row["notes"] == [*before["notes"], "eviction-requested"]
    assert {k: row[k] for k in JUDGEMENT} == {k: before[k] for k in JUDGEMENT}
    text = report_text(model)
    assert "Pending EvictionRequests (lifecycle.k8s.io/v1alpha1)" in text and "db-balance" in text
    assert "db-withdrawn" not in text and "db-evicted" not in text


@pytest.mark.parametrize("obj", [{"metadata": {"name": "x", "namespace": NS}}, {"spec": {}}, "text"])
def test_objects_without_a_name_or_spec_are_refused(obj) -> None:
    with pytest.raises(RecordError):
        eviction_request_from_object(obj)


def test_odd_fields_become_empty_not_errors() -> None:
    r = eviction_request_from_object({"metadata": {"name": "x", "namespace": NS, "creationTimestamp": "yesterday"},
                                      "spec": {"target": {"pod": "web"}, "requester": 7, "intent": None},
                                      "status": {"conditions": ["TargetEvicted", {"type": "Failed"}]}})
    assert (r.pod, r.requester, r.intent, r.created, r.ended, r.pending) == ("", "", "", None, "", False)
