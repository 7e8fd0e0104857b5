"""Live mode end to end: ``serve``'s wiring, watches feeding the store, HTTPS in, writes out.

The guard is built by ``app.serve.build_context`` from real flags (a kubeconfig
for the fake API server), so the effects write through their own ApiClient,
and the store they re-check is the one the watches keep current.
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from app.cli import build_parser
from app.cluster.informer import ClusterWatch, LoopOptions
from app.cluster.kube import api_client
from app.effects import KubeEffectsApi
from app.metrics import Metrics
from app.serve import build_context
from tests.effects.support import EIP, GuardServer, review_doc
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

pytestmark = pytest.mark.timeout(60)
NS, POD = "vms", "virt-launcher-evac-aaaaa"
FAST = LoopOptions(watch_timeout=5, idle_timeout=5, backoff_base=0.05, backoff_cap=0.3, quick_end=0.05)


def eventually(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def live(tmp_path):
    with FakeApiServer(bookmark_interval=0.2) as api:
        now = time.time()
        api.put(o.node("node-a"))
        api.put(o.vmi(NS, "evac", node="node-a", uid="uid-evac", evacuation_node="node-a", created=now - 86400,
                      migration=o.migration_state(start=now - 30, source_node="node-a", target_node="node-b",
                                                  uid="m1")))
        api.put(o.launcher_pod(NS, "evac", "node-a", name=POD, vmi_uid="uid-evac"))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        args = build_parser().parse_args(["serve", "--tls-cert", "x", "--tls-key", "y", "--kubeconfig",
                                          str(kubeconfig), "--event-interval", "1m"])
        cluster = ClusterWatch(api_client(str(kubeconfig)), metrics=Metrics(), options=FAST)
        ctx = build_context(args, cluster)
        cluster.start()
        ctx.effects.start()
        try:
            assert cluster.wait_synced(10)
            with GuardServer(ctx, tmp_path) as guard, httpx.Client(verify=guard.tls, timeout=5) as http:
                yield api, ctx, guard, http
        finally:
            ctx.effects.stop()
            cluster.stop()


def evict(guard, http, uid: str) -> dict:
    r = http.post(guard.url + "/mutate", content=orjson.dumps(review_doc(POD, uid=uid)),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    return r.json()["response"]


def test_a_live_denial_annotates_the_pod_and_records_an_event(live):
    api, ctx, guard, http = live
    assert isinstance(ctx.effects.api, KubeEffectsApi)
    resp = evict(guard, http, "u1")
    assert resp["allowed"] is False and "Eviction triggered evacuation" in resp["status"]["message"]
    eventually(lambda: EIP in api.get("pod", NS, POD)["metadata"]["annotations"])
    eventually(lambda: len(api.events()) == 1)
    [event] = api.events()
    assert event["involvedObject"]["uid"] == "uid-evac" and event["reason"] == "EvictionBlocked"
    # the watch brings the annotated pod back: the next denial does not patch again
    eventually(lambda: ctx.view.pod(NS, POD).eviction_in_progress)
    evict(guard, http, "u2")
    assert ctx.effects.queue.wait_idle(5, ready_only=True)
    assert len([p for p in api.patches if p.resource == "pods"]) == 1


def test_a_conflict_is_resolved_from_the_watched_store(live):
    api, ctx, guard, http = live
    api.fail(409, times=1, kind="pod", verbs=["patch"])  # the API server's own conflict: the pod did not change
    evict(guard, http, "u1")
    # the job waits for the store, which has nothing newer, then patches again under the same test op
    eventually(lambda: EIP in api.get("pod", NS, POD)["metadata"]["annotations"], timeout=15)
    statuses = [p.status for p in api.patches if p.resource == "pods"]
    assert statuses == [200]  # the injected 409 answered before the patch was recorded; one write landed
    assert ctx.metrics.registry.get_sample_value("kubevirt_eviction_guard_side_effect_errors_total",
                                                 {"kind": "annotation"}) == 1
