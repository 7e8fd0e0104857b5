"""Rule 8 read again before an allow: a mark the watch has not delivered yet still holds the node.

KubeVirt marks a VMI while it answers the descheduler's eviction; the descheduler's next eviction from the same
node can reach the guard before its watch has brought that mark. Here the store is simply not told (the watch's
lag, as long as the test wants it); the fake API server has the mark. ``app/cluster/fresh.py`` reads the node's
VMIs from the API server before an allow, and the decision is taken again over them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import orjson
import pytest
from kubernetes import client

from app.admission.server import GuardContext, create_app
from app.cluster.fresh import LeaverRead
from app.metrics import Metrics
from app.policy import PolicySettings
from app.policy.decide import decide
from app.policy.model import Reason
from tests.builders import NOW, node, pod, store_of, vmi
from tests.effects.support import review_doc, review_of
from tests.fakeapi import FakeApiServer

JSON = {"Content-Type": "application/json"}
NODE = "worker-a"


def labelled(obj: dict) -> dict:
    """A VMI as KubeVirt writes it: the label ``kubevirt.io/nodeName`` mirrors ``status.nodeName``."""
    obj["metadata"].setdefault("labels", {})["kubevirt.io/nodeName"] = obj["status"]["nodeName"]
    return obj


def objects() -> list[dict]:
    return [node(NODE), node("worker-b"),
            labelled(vmi("a", NODE)), pod("a", NODE),
            labelled(vmi("b", NODE)), pod("b", NODE),
            labelled(vmi("c", "worker-b")), pod("c", "worker-b")]


@pytest.fixture
def api():
    with FakeApiServer() as server:
        for obj in objects():
            server.put(obj)
        yield server


def guard(api: FakeApiServer | None, metrics: Metrics, **kw) -> httpx.AsyncClient:
    store = store_of(*objects())  # what the watch had delivered: nobody marked yet
    if api is not None:
        kw.setdefault("fresh_view", LeaverRead(client.ApiClient(api.configuration()), store).view_of)
    ctx = GuardContext(view=store, settings=PolicySettings(), clock=lambda: NOW, metrics=metrics, **kw)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ctx)), base_url="https://guard")


def evict(c: httpx.AsyncClient, pod_name: str, timed: list | None = None, **kw) -> dict:
    async def go():
        async with c:
            started = time.monotonic()
            r = await c.post("/mutate", content=orjson.dumps(review_doc(pod_name, **kw)), headers=JSON)
            if timed is not None:
                timed.append(time.monotonic() - started)
            assert r.status_code == 200
            return r.json()["response"]

    return asyncio.run(go())


def reads(metrics: Metrics) -> dict[str, float]:
    return {s.labels["result"]: s.value for m in metrics.leaver_reads.collect() for s in m.samples
            if s.name.endswith("_total")}


def test_a_mark_the_watch_has_not_brought_refuses_the_second_vm(api) -> None:
    api.update_status("virtualmachineinstances", "vms", "a", {"phase": "Running", "nodeName": NODE,
                                                               "evacuationNodeName": NODE})
    metrics = Metrics()
    resp = evict(guard(api, metrics), "virt-launcher-b-abcde")
    assert resp["allowed"] is False and resp["auditAnnotations"]["reason"] == Reason.NODE_BUSY
    assert f'node "{NODE}" already has 1 VM(s) leaving (vms/a' in resp["status"]["message"]
    assert reads(metrics) == {"changed": 1.0}


def test_a_mark_on_the_evicted_vm_itself_is_read_too(api) -> None:
    """Another eviction of the same VM (a drain, a second descheduler) had KubeVirt mark it: the answer is the
    background text of a VM already leaving, from the VMI as the API server has it, not as the watch had it."""
    api.update_status("virtualmachineinstances", "vms", "b", {"phase": "Running", "nodeName": NODE,
                                                               "evacuationNodeName": NODE})
    metrics = Metrics()
    resp = evict(guard(api, metrics), "virt-launcher-b-abcde")
    assert resp["allowed"] is False and resp["auditAnnotations"]["reason"] == Reason.EVACUATION_PENDING, resp
    assert reads(metrics) == {"changed": 1.0}


def test_nothing_new_on_the_api_server_keeps_the_allow(api) -> None:
    metrics = Metrics()
    resp = evict(guard(api, metrics), "virt-launcher-b-abcde")
    assert resp["allowed"] is True and resp["auditAnnotations"]["reason"] == Reason.ALLOWED
    assert reads(metrics) == {"same": 1.0}


def test_a_mark_on_another_node_does_not_hold_this_one(api) -> None:
    api.update_status("virtualmachineinstances", "vms", "c", {"phase": "Running", "nodeName": "worker-b",
                                                               "evacuationNodeName": "worker-b"})
    metrics = Metrics()
    resp = evict(guard(api, metrics), "virt-launcher-b-abcde")
    assert resp["allowed"] is True and reads(metrics) == {"same": 1.0}


def test_only_allows_after_rule_8_read_again(api) -> None:
    """An admin's eviction (rule 8 does not apply) is answered from the store alone; so is a denial."""
    api.update_status("virtualmachineinstances", "vms", "a", {"phase": "Running", "nodeName": NODE,
                                                               "evacuationNodeName": NODE})
    metrics = Metrics()
    admin = evict(guard(api, metrics), "virt-launcher-b-abcde", requested_by="", username="admin")
    assert admin["allowed"] is True and reads(metrics) == {}
    calls = []
    denied = evict(guard(api, metrics, fresh_view=lambda n: calls.append(n)), "no-such-pod")
    assert denied["auditAnnotations"]["reason"] == Reason.NOT_A_VM_POD and calls == []


def test_an_unreachable_api_server_fails_open_and_says_so(api, caplog) -> None:
    metrics = Metrics()
    c = guard(api, metrics)
    api.down()
    with caplog.at_level(logging.WARNING, logger="kubevirt_eviction_guard.admission"):
        resp = evict(c, "virt-launcher-b-abcde")
    assert resp["allowed"] is True and resp["auditAnnotations"]["reason"] == Reason.ALLOWED
    assert reads(metrics) == {"failed": 1.0}
    assert any(f"could not read the VMIs of node {NODE} again" in r.getMessage() for r in caplog.records)


def test_a_slow_read_is_cut_at_its_timeout() -> None:
    """Answered at the guard's own timeout while the read still hangs (not when the read gave up): the read only
    ends once the answer is in."""
    release, finished = threading.Event(), threading.Event()

    def hanging(node: str):
        release.wait(120)
        finished.set()

    metrics = Metrics()
    c = guard(None, metrics, fresh_view=hanging, fresh_view_timeout=0.2)

    async def go() -> tuple[dict, bool]:
        async with c:
            try:
                r = await c.post("/mutate", content=orjson.dumps(review_doc("virt-launcher-b-abcde")), headers=JSON)
                return r.json()["response"], finished.is_set()
            finally:
                release.set()  # (asyncio.run waits for the read's thread)

    resp, read_had_ended = asyncio.run(go())
    assert not read_had_ended
    assert resp["allowed"] is True and reads(metrics) == {"failed": 1.0}


def test_the_policy_names_the_node_it_counted_only_on_an_allow_after_rule_8() -> None:
    store = store_of(*objects())
    desched = decide(review_of("virt-launcher-b-abcde").eviction, store, NOW, PolicySettings())
    admin = decide(review_of("virt-launcher-b-abcde", requested_by="", username="admin").eviction, store, NOW,
                   PolicySettings())
    no_budget = decide(review_of("virt-launcher-b-abcde").eviction, store, NOW,
                       PolicySettings(pending_evacuations_per_node=0))
    assert (desched.allowed, desched.budget_node) == (True, NODE)
    assert (admin.allowed, admin.budget_node) == (True, "")
    assert (no_budget.allowed, no_budget.budget_node) == (True, "")


def evict_many(c: httpx.AsyncClient, pod_name: str, n: int) -> list[dict]:
    async def go():
        async with c:
            rs = await asyncio.gather(*(c.post("/mutate", content=orjson.dumps(review_doc(pod_name)), headers=JSON)
                                        for _ in range(n)))
            return [r.json()["response"] for r in rs]

    return asyncio.run(go())


def test_reads_of_one_node_are_shared_two_in_flight_and_the_next() -> None:
    """50 allows of one node at once: the first read, a second started at once for the next request (the first was
    sent before it came), and one more, started when one of them ends, that the 48 others share."""
    metrics, calls = Metrics(), []
    store = store_of(*objects())

    def slow(node):
        calls.append(node)
        time.sleep(0.2)
        return store

    answers = evict_many(guard(None, metrics, fresh_view=slow), "virt-launcher-b-abcde", 50)
    assert all(a["allowed"] for a in answers), answers
    assert calls == [NODE, NODE, NODE], calls
    assert reads(metrics) == {"same": 50.0}, reads(metrics)


def test_a_read_that_outlived_its_request_does_not_hold_up_the_next_ones() -> None:
    """The first read of a node is slow (a new connection to a lagging API server) and its request is answered at
    the timeout; the descheduler's next eviction from that node, sent right after, gets a read of its own at once,
    which finds virt-api's mark: refused ``node_busy``, not let through behind the slow read."""
    metrics, calls = Metrics(), []
    marked = store_of(*[labelled(vmi("a", NODE, evacuation=NODE)) if o["kind"] == "VirtualMachineInstance" and
                        o["metadata"]["name"] == "a" else o for o in objects()])
    release = threading.Event()

    def read(node):
        calls.append(node)
        if len(calls) == 1:
            release.wait(30)  # the slow one: still running when the second request comes
        return marked

    c = guard(None, metrics, fresh_view=read, fresh_view_timeout=1.0)

    async def go() -> list[dict]:
        async with c:
            try:
                out = []
                for _ in range(2):
                    r = await c.post("/mutate", content=orjson.dumps(review_doc("virt-launcher-b-abcde")), headers=JSON)
                    out.append(r.json()["response"])
                return out
            finally:
                release.set()

    first, second = asyncio.run(go())
    got = (first, second, calls, reads(metrics))
    assert first["allowed"] is True and reads(metrics)["failed"] == 1.0, got  # the slow read: the store's answer stood
    assert second["allowed"] is False and second["auditAnnotations"]["reason"] == Reason.NODE_BUSY, got
    assert calls == [NODE, NODE] and reads(metrics).get("changed") == 1.0, got


def test_past_the_reads_per_second_the_cached_answer_stands_and_is_counted(caplog) -> None:
    metrics, calls = Metrics(), []
    store = store_of(*objects())

    def read(node):
        calls.append(node)
        return store

    with caplog.at_level(logging.WARNING, logger="kubevirt_eviction_guard.admission"):
        c = guard(None, metrics, fresh_view=read, fresh_reads_per_second=5)

        async def go():
            async with c:
                out = []
                for _ in range(40):  # one after the other: no sharing, only the bound
                    r = await c.post("/mutate", content=orjson.dumps(review_doc("virt-launcher-b-abcde")), headers=JSON)
                    out.append(r.json()["response"])
                return out

        answers = asyncio.run(go())
    assert all(a["allowed"] for a in answers)
    got = reads(metrics)
    assert len(calls) < 15 and got == {"same": len(calls), "over_budget": 40 - len(calls)}, got
    assert any("not reading the VMIs of node" in r.getMessage() for r in caplog.records)
