"""The canceller against the fake API server over HTTP, with the real ``kubernetes`` client.

The fake serves KubeVirt's ``evacuate/cancel`` subresource as virt-api does
(``tests/fakeapi/server.py``): 404 for an unknown VMI, 400 when the node carries
KubeVirt's drain taint, nothing done for an unmarked VMI, a tested JSON patch
that removes ``status.evacuationNodeName`` otherwise.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from app.backoff import Backoff
from app.cluster.listing import list_into
from app.cluster.store import ClusterStore
from app.effects import Effects, KubeEffectsApi
from app.metrics import Metrics
from app.policy import PolicySettings
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

pytestmark = pytest.mark.timeout(60)
NS = "vms"
NOW = time.time()
MAINT, CRIT = "system-maintenance", "system-critical"


def marked(name: str, node: str, *, from_descheduler: bool = True) -> dict:
    vmi = o.vmi(NS, name, node=node, uid=f"uid-{name}", evacuation_node=node, created=NOW - 86400)
    if from_descheduler:
        vmi["metadata"]["annotations"]["kubevirt.io/eviction-source"] = "descheduler"
    return vmi


def failed(vmi: str, node: str, attempts: int, priority: str = MAINT) -> list[dict]:
    """``attempts`` failed evacuation VMIMs, the first 15 minutes ago, one every 4 minutes."""
    out = []
    for i in range(attempts):
        created = NOW - 900 + i * 240
        out.append(o.vmim(NS, f"{vmi}-e{i}", vmi, phase="Failed", start=created + 30, end=created + 200,
                          source_node=node, target_node="node-b", evacuation_node=node, created=created,
                          priority=priority))
    return out


def cluster(api: FakeApiServer) -> None:
    api.put(o.node("node-a"))
    api.put(o.node("node-b"))
    api.put(o.node("node-c", unschedulable=True))
    tainted = o.node("node-k")
    tainted["spec"]["taints"] = [{"key": "kubevirt.io/drain", "effect": "NoSchedule"}]
    api.put(tainted)
    objects = [
        (marked("stuck", "node-a"), failed("stuck", "node-a", 3)),  # cancelled
        (marked("young", "node-a"), failed("young", "node-a", 2)),  # two failures: not yet
        (marked("drain", "node-a", from_descheduler=False), failed("drain", "node-a", 3, CRIT)),  # a drain's
        (marked("cordoned", "node-c"), failed("cordoned", "node-c", 3)),  # node being drained
        (marked("critical", "node-a"), [*failed("critical", "node-a", 3),
                                         o.vmim(NS, "critical-admin", "critical", phase="Pending", created=NOW - 10,
                                                priority=CRIT)]),  # a system-critical VMIM queued
        (marked("tainted", "node-k"), failed("tainted", "node-k", 3)),  # KubeVirt's drain taint: a drain
    ]
    for vmi, vmims in objects:
        api.put(vmi)
        name, node = vmi["metadata"]["name"], vmi["status"]["nodeName"]
        api.put(o.launcher_pod(NS, name, node, name=f"virt-launcher-{name}-aaaaa", vmi_uid=f"uid-{name}"))
        for m in vmims:
            api.put(m)


@pytest.fixture
def api():
    with FakeApiServer() as server:
        cluster(server)
        yield server


@pytest.fixture
def kube(api):
    with k8s.ApiClient(api.configuration()) as c:
        yield c


def listed(kube) -> ClusterStore:
    store = ClusterStore()
    list_into(kube, store)
    return store


def canceller(store, kube, metrics):
    fx = Effects(store, KubeEffectsApi(kube, timeout=(1.0, 2.0)), metrics, backoff=Backoff(base=0.05, cap=0.2))
    c = fx.cancel_stuck_evacuations(store, PolicySettings(), ready=lambda: True, interval=3600)
    return fx.start(), c


def cancels(metrics: Metrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        if family.name == "kubevirt_eviction_guard_evacuation_cancels":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.labels["outcome"], s.labels["node"], s.labels["namespace"])] = s.value
    return out


def test_cancels_only_the_stuck_descheduler_evacuation(api, kube):
    metrics = Metrics()
    store = listed(kube)
    fx, c = canceller(store, kube, metrics)
    try:
        assert c.scan() == 1  # stuck only: KubeVirt's drain taint is a drain (virt-api would refuse it)
        assert fx.queue.wait_idle(5)
    finally:
        fx.stop()
    done = {(r.name, r.status): r.body for r in api.cancels}
    assert done == {("stuck", 200): {"evacuationNodeName": "node-a"}}
    assert "evacuationNodeName" not in api.get("vmi", NS, "stuck")["status"]
    for name in ("young", "drain", "cordoned", "critical", "tainted"):
        assert api.get("vmi", NS, name)["status"]["evacuationNodeName"], name
    events = [e for e in api.events() if e.get("reason") == "EvacuationCancelled"]
    assert len(events) == 1 and events[0]["involvedObject"]["name"] == "stuck" and events[0]["type"] == "Warning"
    assert 'from node "node-a"' in events[0]["message"] and "3 failed attempts" in events[0]["message"]
    assert cancels(metrics) == {("cancelled", "node-a", NS): 1.0}


def test_a_cancelled_mark_is_not_cancelled_again_and_replicas_agree(api, kube):
    metrics = Metrics()
    first = listed(kube)
    fx, c = canceller(first, kube, metrics)
    try:
        c.scan()
        assert fx.queue.wait_idle(5)
        # a second replica whose store still shows the mark: virt-api does nothing for an unmarked VMI
        stale_fx, stale = canceller(first, kube, metrics)
        try:
            stale.scan()
            assert stale_fx.queue.wait_idle(5)
        finally:
            stale_fx.stop()
        # after the watch caught up, nothing is left to cancel
        fresh_fx, fresh = canceller(listed(kube), kube, metrics)
        try:
            assert fresh.scan() == 0
            assert fresh_fx.queue.wait_idle(5)
        finally:
            fresh_fx.stop()
    finally:
        fx.stop()
    stuck = [r for r in api.cancels if r.name == "stuck"]
    assert [r.status for r in stuck] == [200, 200]  # the second found nothing to remove
    assert "evacuationNodeName" not in api.get("vmi", NS, "stuck")["status"]


def test_forbidden_or_absent_subresource_is_refused_not_retried(api, kube):
    metrics = Metrics()
    api.evacuate_cancel_forbidden = True
    fx, c = canceller(listed(kube), kube, metrics)
    try:
        c.scan()
        assert fx.queue.wait_idle(5)
        api.evacuate_cancel_forbidden = False
        api.remove_api("subresources.kubevirt.io")  # KubeVirt < 1.8
        c.cancel(NS, "stuck")
    finally:
        fx.stop()
    assert api.get("vmi", NS, "stuck")["status"]["evacuationNodeName"] == "node-a"
    assert cancels(metrics)[("refused", "node-a", NS)] == 1.0  # 403 refused; the 404 path is "not found": nothing done
    assert not [e for e in api.events() if e.get("reason") == "EvacuationCancelled"]


def canceller_state(http) -> tuple[str, str] | None:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == "kubevirt_eviction_guard_evacuation_canceller_info":
            (sample,) = [x for x in family.samples if x.value == 1]
            return sample.labels["enabled"], sample.labels["reason"]
    return None


def test_probe_asks_discovery_then_both_access_reviews(api, kube):
    """What the API server authorizes for PUT .../virtualmachineinstances/NAME/evacuate/cancel: kube-apiserver takes
    the first segment after the name ("evacuate"), virt-api's own review all of them ("evacuate/cancel")."""
    from app.effects.cancel import ENABLED, FORBIDDEN, NO_SUBRESOURCE, UNKNOWN, probe

    effects_api = KubeEffectsApi(kube, timeout=(1.0, 2.0))
    assert probe(effects_api) == ENABLED
    assert [(a["verb"], a["group"], a["resource"], a["subresource"]) for a in api.access_reviews] == [
        ("update", "subresources.kubevirt.io", "virtualmachineinstances", "evacuate"),
        ("update", "subresources.kubevirt.io", "virtualmachineinstances", "evacuate/cancel")]
    assert all("namespace" not in a for a in api.access_reviews)  # every namespace: the ClusterRole's rule
    api.denied_access.add(("subresources.kubevirt.io", "virtualmachineinstances", "evacuate/cancel", "update"))
    assert probe(effects_api) == FORBIDDEN  # virt-api's review says no, whatever kube-apiserver allows
    api.denied_access.clear()
    api.kubevirt_subresources = tuple(n for n in api.kubevirt_subresources if "evacuate" not in n)  # KubeVirt 1.7
    assert probe(effects_api) == NO_SUBRESOURCE
    api.remove_api("subresources.kubevirt.io")  # no KubeVirt aggregated API at all
    assert probe(effects_api) == NO_SUBRESOURCE
    api.restore_api("subresources.kubevirt.io")
    api.fail(503, times=1)
    assert probe(effects_api) == UNKNOWN


def test_serve_cancels_by_default_where_it_can(api, tmp_path):
    """The real ``serve`` over the fake API: by default it asks, finds evacuate/cancel served and allowed, cancels
    the stuck evacuation and tells."""
    from tests.live_support import eventually, start_guard

    guard = start_guard(tmp_path / "cancel", api, "--cancel-interval", "1s")
    try:
        eventually(lambda: any(r.name == "stuck" and r.status == 200 for r in api.cancels), timeout=15,
                   what="the stuck evacuation to be cancelled")
        eventually(lambda: [e for e in api.events() if e.get("reason") == "EvacuationCancelled"], timeout=5,
                   what="the EvacuationCancelled Event")
        with guard.client() as http:
            metrics = http.get("/metrics").text
            assert canceller_state(http) == ("true", "enabled")
        assert ('kubevirt_eviction_guard_evacuation_cancels_total{namespace="vms",node="node-a",outcome="cancelled"} 1.0'
                in metrics)
    finally:
        guard.stop()
    assert {r.name for r in api.cancels} == {"stuck"}  # not "tainted": KubeVirt's drain taint is a drain
    assert "evacuationNodeName" not in api.get("vmi", NS, "stuck")["status"]
    assert api.get("vmi", NS, "drain")["status"]["evacuationNodeName"] == "node-a"


@pytest.mark.parametrize("setup, args, reason", [
    ("forbidden", (), "forbidden"),  # RBAC without the rule (chart: cancelStuckEvacuations.enabled false elsewhere)
    ("old-kubevirt", (), "no_subresource"),  # KubeVirt < 1.8: not in virt-api's discovery
    ("", ("--no-cancel-stuck-evacuations",), "disabled"),
])
def test_serve_leaves_the_canceller_off_and_says_why(api, tmp_path, setup, args, reason):
    """Off: no cancel is ever sent, and evacuation_canceller_info says why. The signal that the guard has made up
    its mind is that metric itself: the canceller asks before it would scan, and scans only when the answer is yes."""
    from tests.live_support import eventually, start_guard

    if setup == "forbidden":
        api.evacuate_cancel_forbidden = True
    elif setup == "old-kubevirt":
        api.kubevirt_subresources = tuple(n for n in api.kubevirt_subresources if "evacuate" not in n)
    guard = start_guard(tmp_path / "off", api, "--cancel-interval", "1s", *args)
    try:
        with guard.client() as http:
            eventually(lambda: canceller_state(http) == ("false", reason), timeout=15,
                       what=f"the canceller to report {reason}")
    finally:
        guard.stop()
    assert api.cancels == []
    assert api.get("vmi", NS, "stuck")["status"]["evacuationNodeName"] == "node-a"


def test_a_refusal_carries_virt_apis_reason(api, kube):
    """The log line of a refused cancel says why: virt-api's Status message, not only "400 Bad Request"."""
    from app.effects.kubeapi import PermanentApiError

    effects_api = KubeEffectsApi(kube, timeout=(1.0, 2.0))
    with pytest.raises(PermanentApiError) as refused:
        effects_api.cancel_evacuation(NS, "tainted", "node-k")
    assert str(refused.value) == ('400 Bad Request: Node "node-k" has NodeDrainTaintKey '
                                  '"&Taint{Key:kubevirt.io/drain,Value:,Effect:NoSchedule,TimeAdded:<nil>,}"')
