"""Live cluster state: the real ``kubernetes`` client, over HTTP, against tests.fakeapi.

Each test starts a fake API server on 127.0.0.1 and the guard's four list+watch
loops with short timeouts and backoff, then drives the server (changes, cuts,
compactions, outages) and checks what the store, ``/readyz``, the decisions and
the metrics say. Everything is bounded by polling deadlines of a few seconds.
"""

from __future__ import annotations

import logging
import time

import orjson
import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from app.admission.server import GuardContext, create_app
from app.cluster.informer import ClusterWatch, LoopOptions
from app.metrics import Metrics
from app.policy.model import PolicySettings
from tests.builders import FIXTURES
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o
from tests.live_support import eventually

pytestmark = pytest.mark.timeout(60)

REQUEST = orjson.loads((FIXTURES / "admission/eviction-requested-by-descheduler.validating.json").read_bytes())
NS, POD = REQUEST["request"]["namespace"], REQUEST["request"]["name"]  # vms / virt-launcher-desched
VMI = "desched"
FAST = LoopOptions(page_size=2, watch_timeout=5, idle_timeout=5, backoff_base=0.05, backoff_cap=0.3, quick_end=0.05)




def seed(api: FakeApiServer, migrating: bool = False) -> None:
    """Two nodes, one VM on worker-a with its launcher pod (the one the fixture evicts)."""
    api.put(o.node("worker-a"))
    api.put(o.node("worker-b"))
    api.put(o.vmi(NS, VMI, node="worker-a", created=time.time() - 86400,
                  migration=o.migration_state(start=time.time() - 30, source_node="worker-a", target_node="worker-b",
                                              uid="m-1") if migrating else None))
    api.put(o.launcher_pod(NS, VMI, "worker-a", name=POD))
    for i in range(3):  # a few more, so lists take several pages
        api.put(o.vmi("other", f"vm-{i}", node="worker-b"))
        api.put(o.launcher_pod("other", f"vm-{i}", "worker-b"))


@pytest.fixture
def api():
    with FakeApiServer(bookmark_interval=0.2) as server:
        yield server


@pytest.fixture
def guard(api):
    """start(stale_after=...) -> (ClusterWatch, TestClient for the admission app, Metrics)."""
    started: list[ClusterWatch] = []

    def start(stale_after: float = 120.0, options: LoopOptions = FAST):
        cfg = api.configuration()
        cfg.retries = False
        metrics = Metrics()
        watch = ClusterWatch(client.ApiClient(cfg), metrics=metrics, stale_after=stale_after, options=options)
        ctx = GuardContext(view=watch.store, settings=PolicySettings(), health=watch.health,
                           readiness_detail=watch.readiness_detail, metrics=metrics)
        started.append(watch.start())
        return watch, TestClient(create_app(ctx)), metrics

    yield start
    for w in started:
        w.stop(timeout=5)


def decide(http: TestClient) -> dict:
    resp = http.post("/validate", content=orjson.dumps(REQUEST), headers={"Content-Type": "application/json"})
    assert resp.status_code == 200
    return resp.json()["response"]


def reason(http: TestClient) -> str:
    return decide(http)["auditAnnotations"]["reason"]


def restarts(metrics: Metrics, kind: str, cause: str) -> float:
    return metrics.registry.get_sample_value("kubevirt_eviction_guard_watch_restarts_total",
                                             {"kind": kind, "cause": cause}) or 0.0


# ---- the happy path ---------------------------------------------------------------------------------


def test_lists_in_pages_then_an_update_reaches_a_decision_through_the_open_watch(api, guard):
    seed(api)
    # watches that do not end by themselves during the test: any new watch or list would be the guard's doing
    watch, http, metrics = guard(options=LoopOptions(page_size=2, watch_timeout=600, idle_timeout=5, backoff_base=0.05,
                                                     backoff_cap=0.3, quick_end=0.05))
    assert watch.wait_synced(5)
    assert http.get("/readyz").status_code == 200
    assert reason(http) == "allowed"
    pod_lists = api.requests_for("pod", watch=False)
    assert len(pod_lists) == 2 and pod_lists[0].query["limit"] == "2" and "continue" in pod_lists[1].query
    watches = api.requests_for("vmi", watch=True)
    assert watches[0].query["allowWatchBookmarks"] == "true" and watches[0].query["resourceVersion"]

    vmi = api.get("vmi", NS, VMI)
    vmi["status"]["migrationState"] = o.migration_state(start=time.time(), source_node="worker-a",
                                                        target_node="worker-b", uid="m-2")
    lists, watches = len(api.requests_for("vmi", watch=False)), len(api.requests_for("vmi", watch=True))
    api.put(vmi)
    # no deadline but a hang's: the change must come by the watch that is open, neither a relist nor a new watch
    eventually(lambda: reason(http) == "migration_in_progress", timeout=60, what="the migration to be seen")
    assert (len(api.requests_for("vmi", watch=False)), len(api.requests_for("vmi", watch=True))) == (lists, watches)
    assert decide(http)["allowed"] is False
    text = metrics.render()[0].decode()
    assert 'kubevirt_eviction_guard_cache_objects{kind="vmi"} 4.0' in text
    assert 'kubevirt_eviction_guard_cache_synced{kind="node"} 1.0' in text


def test_bookmarks_let_a_quiet_kind_resume_without_relisting(api, guard):
    seed(api)
    watch, _, metrics = guard()
    assert watch.wait_synced(5)
    for i in range(20):  # VMIMs churn; nodes stay quiet, but their bookmarks follow the global version
        api.put(o.vmim("other", f"mig-{i}", "vm-0", phase="Running"))
    time.sleep(0.5)  # > bookmark_interval
    api.compact()
    api.cut_streams(clean=True)  # as at timeoutSeconds: a watch that ends is no break
    eventually(lambda: api.watch_count("node") == 1 and len(api.requests_for("node", watch=True)) >= 2,
               what="the node watch to reconnect")
    time.sleep(0.2)
    assert len(api.requests_for("node", watch=False)) == 1  # resumed from a bookmark: no relist
    assert restarts(metrics, "node", "expired") == 0
    assert restarts(metrics, "node", "timeout") + restarts(metrics, "node", "closed_early") == 1
    assert watch.health().stale == frozenset()


def test_a_broken_watch_relists_and_its_kind_fails_open_until_then(api, guard):
    """A stream cut mid-way may have lost events: the kind is stale at once and comes back by a list, never by a
    resume (which would count as fresh while replaying its backlog)."""
    seed(api, migrating=True)
    watch, http, metrics = guard()
    assert watch.wait_synced(5)
    def lists() -> int:  # lists begun (a list is several pages)
        return len([r for r in api.requests_for("vmi", watch=False) if "continue" not in r.query])

    before = lists()
    api.set_latency(0.5, kind="vmi")  # hold the relist so the window can be seen
    api.cut_streams("vmi", clean=False)
    eventually(lambda: reason(http) == "cache_stale", what="the broken kind to fail open")
    eventually(lambda: reason(http) == "migration_in_progress", what="the relist to make it current")
    assert lists() == before + 1
    assert restarts(metrics, "vmi", "connection") == 1


# ---- losing the watch ----------------------------------------------------------------------------------


def test_a_deletion_during_a_disconnect_is_seen_after_relist(api, guard):
    seed(api)
    watch, http, metrics = guard()
    assert watch.wait_synced(5)
    assert watch.store.vmi(NS, VMI) is not None
    api.down()
    api.delete("vmi", NS, VMI)  # while we cannot see it
    api.compact()  # and history moves on past our version: resuming would be impossible anyway
    api.up()
    eventually(lambda: watch.store.vmi(NS, VMI) is None, what="the deleted VMI to disappear")
    assert restarts(metrics, "vmi", "expired") == 0  # a break relists: it never tries to resume
    eventually(lambda: reason(http) == "vmi_not_found", what="the decision on the relisted state")


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
def test_410_gone_relists_and_carries_on(api, guard, as_http):
    api.expired_as_http = as_http
    seed(api)
    watch, _, metrics = guard()
    assert watch.wait_synced(5)
    lists_before = len(api.requests_for("vmim", watch=False))
    if as_http:
        # a watch that ends (timeoutSeconds) resumes; the resume reaches the server only after history moved on
        api.set_latency(1.0, kind="vmim")
        api.cut_streams("vmim", clean=True)
        eventually(lambda: api.watch_count("vmim") == 0, what="the watch to end")
        time.sleep(0.2)  # the resume is on its way, held by the latency
        api.put(o.vmim("other", "gone-while-away", "vm-0", phase="Running"))
        api.delete("vmim", "other", "gone-while-away")
        api.compact()
        api.set_latency(0, kind="vmim")  # later requests (the relist) are not held
    else:
        api.compact(expire_watches=True)  # open watches get an ERROR 410 event
    api.put(o.vmim("other", "after", "vm-0", phase="Succeeded"))
    eventually(lambda: [m.name for m in watch.store.migrations("other", "vm-0")] == ["after"],
               what="the VMIM after the relist")
    assert len(api.requests_for("vmim", watch=False)) > lists_before
    assert restarts(metrics, "vmim", "expired") >= 1
    eventually(lambda: watch.health().stale == frozenset(), what="every kind to be relisted")


def test_between_a_410_and_the_completed_relist_decisions_on_that_kind_answer_cache_stale(api, guard):
    """Events were lost: until the relist has completed, the old state of that kind is no ground for a decision.
    The API server holds the relist back (10 s) so that the window can be looked at."""
    seed(api, migrating=True)  # the old state denies: migration_in_progress
    watch, http, metrics = guard()
    assert watch.wait_synced(5)
    assert reason(http) == "migration_in_progress"
    api.set_latency(10.0, kind="vmi")  # the relist (and the watch after it) waits this long at the API server
    api.compact(expire_watches=True)  # the open watches get an ERROR 410 event
    eventually(lambda: restarts(metrics, "vmi", "expired") >= 1, timeout=8, what="the 410 on the VMI watch")
    assert "vmi" in watch.health().stale
    answer = decide(http)
    assert answer["allowed"] is True and answer["auditAnnotations"]["reason"] == "cache_stale", answer
    api.set_latency(0, kind="vmi")
    eventually(lambda: reason(http) == "migration_in_progress", timeout=30, what="the relisted state to decide")


def test_api_down_at_startup_then_up_flips_readiness(api, guard):
    seed(api)
    api.down()
    watch, http, metrics = guard()
    body = eventually(lambda: (r := http.get("/readyz")).status_code == 503
                      and "cannot reach" in r.json()["notSynced"].get("vmi", "") and r.json(),
                      what="readyz to explain why")
    assert set(body["notSynced"]) == {"vmi", "vmim", "pod", "node"}
    assert reason(http) == "cache_not_ready"
    time.sleep(0.3)
    restarted = restarts(metrics, "pod", "connection")
    assert 1 <= restarted < 20  # backed off, not spinning
    api.up()
    eventually(lambda: http.get("/readyz").status_code == 200, what="readiness after the API came back")
    assert reason(http) == "allowed"


def test_api_down_after_sync_stays_ready_and_fails_open_until_relisted(api, guard):
    seed(api, migrating=True)
    watch, http, metrics = guard()
    assert watch.wait_synced(5)
    assert reason(http) == "migration_in_progress"
    api.down()
    eventually(lambda: restarts(metrics, "vmi", "connection") >= 2, what="restarts to be counted")
    ready = http.get("/readyz")
    assert ready.status_code == 200 and set(ready.json()["stale"]) == {"vmi", "vmim", "pod", "node"}
    assert reason(http) == "cache_stale"  # a request proves an API server is up: the old state is no ground
    assert "cannot reach the API server" in watch.readiness_detail()["vmi"]
    api.up()
    eventually(lambda: not watch.readiness_detail(), what="all watches to recover")
    assert reason(http) == "migration_in_progress"


def test_a_change_right_after_an_outage_is_never_judged_on_the_old_state(api, guard):
    """The kube-apiserver restart case: the API comes back, the VMI changes at once, and an eviction follows while
    the loops are still backing off (here 150 to 300 s after the first failure). The answer is the fail-open
    ``cache_stale`` or the new state, never the old one; and the decision wakes the loops, so the new state decides
    long before the backoff would end (the wait below is only a guard against a hang, far inside the backoff)."""
    seed(api)
    slow = LoopOptions(page_size=2, watch_timeout=30, idle_timeout=30, backoff_base=300.0, backoff_cap=600.0)
    watch, http, metrics = guard(options=slow)
    assert watch.wait_synced(5)
    assert reason(http) == "allowed"
    api.down()
    eventually(lambda: restarts(metrics, "vmi", "connection") >= 1, timeout=20, what="the loops to back off")
    api.up()
    vmi = api.get("vmi", NS, VMI)
    vmi["status"]["migrationState"] = o.migration_state(start=time.time(), source_node="worker-a",
                                                        target_node="worker-b", uid="m-after")
    api.put(vmi)
    assert reason(http) in ("cache_stale", "migration_in_progress")
    eventually(lambda: reason(http) == "migration_in_progress", timeout=60, what="the new state to decide")
    assert watch.informer("vmi").failures >= 1 or restarts(metrics, "vmi", "connection") >= 1


def test_a_stale_kind_makes_decisions_fail_open(api, guard):
    seed(api, migrating=True)
    watch, http, _ = guard(stale_after=0.3)
    assert watch.wait_synced(5)
    assert reason(http) == "migration_in_progress"
    api.down()
    eventually(lambda: reason(http) == "cache_stale", what="the decision to fail open as stale")
    assert decide(http)["allowed"] is True
    ready = http.get("/readyz")
    assert ready.status_code == 200 and set(ready.json()["stale"]) == {"vmi", "vmim", "pod", "node"}
    api.up()
    eventually(lambda: reason(http) == "migration_in_progress", what="fresh state to decide again")


def test_server_errors_and_throttling_are_retried(api, guard):
    seed(api)
    api.fail(500, times=2, kind="vmi", verbs=["list"])
    api.fail(429, times=1, kind="node", verbs=["list"], retry_after=1)
    api.set_latency(0.2, kind="pod")
    started = time.monotonic()
    watch, _, metrics = guard()
    assert watch.wait_synced(10)
    assert time.monotonic() - started >= 1.0  # Retry-After honoured
    assert restarts(metrics, "vmi", "server_error") == 2
    assert restarts(metrics, "node", "throttled") == 1


# ---- bad data and missing APIs ------------------------------------------------------------------------------


def test_a_malformed_object_is_skipped_and_logged(api, guard, caplog):
    seed(api)
    watch, _, metrics = guard()
    assert watch.wait_synced(5)
    caplog.set_level(logging.WARNING, logger="kubevirt_eviction_guard.cluster")
    api.wait_for_watches("vmi")  # listed is not yet watching: junk sent before the watch opens reaches nobody
    assert api.emit_raw("vmi", b'{"type":"ADDED","object":{"kind":"VirtualMachineInstance","metadata":{"namespace":"x"}}}') == 1
    assert api.emit_raw("vmi", b'{"type":"MODIFIED","object":{"metadata":') == 1  # cut short
    assert api.emit_raw("vmi", b'["not", "an", "event"]') == 1
    api.put(o.vmi("other", "after-the-junk", node="worker-b"))
    eventually(lambda: watch.store.vmi("other", "after-the-junk"), what="the loop to survive the junk")
    skipped = [r for r in caplog.records if r.getMessage() == "skipping malformed object"]
    assert len(skipped) == 3 and all(r.kind == "vmi" for r in skipped)
    assert sum(v for k, v in _samples(metrics, "vmi").items()) == 0  # no restart needed


def _samples(metrics: Metrics, kind: str) -> dict:
    out = {}
    for family in metrics.registry.collect():
        if family.name == "kubevirt_eviction_guard_watch_restarts":
            for s in family.samples:
                if s.name.endswith("_total") and s.labels["kind"] == kind:
                    out[s.labels["cause"]] = s.value
    return out


def test_absent_kubevirt_api_and_forbidden_kinds_are_named_in_readyz(api, guard, caplog):
    seed(api)
    api.remove_api("kubevirt.io")
    api.forbid("node")
    caplog.set_level(logging.ERROR, logger="kubevirt_eviction_guard.cluster")
    watch, http, metrics = guard()
    body = eventually(lambda: (r := http.get("/readyz")).status_code == 503 and len(r.json()["notSynced"]) == 3
                      and all(not v.startswith("not listed") for v in r.json()["notSynced"].values()) and r.json(),
                      what="readyz to name the missing kinds")
    assert body["notSynced"]["vmi"] == "404: kubevirt.io/v1 virtualmachineinstances not found: is KubeVirt installed?"
    assert body["notSynced"]["vmim"].startswith("404: kubevirt.io/v1 virtualmachineinstancemigrations not found")
    assert body["notSynced"]["node"].startswith("403 forbidden: list/watch of v1 nodes refused (RBAC")
    eventually(lambda: restarts(metrics, "vmi", "not_found") >= 3, what="retries to continue")
    vmi_errors = [r for r in caplog.records if getattr(r, "kind", None) == "vmi" and r.levelno >= logging.ERROR]
    assert len(vmi_errors) == 1  # one clear error per kind, not one per retry
    api.restore_api("kubevirt.io")
    api.allow("node")
    eventually(lambda: http.get("/readyz").status_code == 200, what="readiness once KubeVirt is there")


def test_a_silent_watch_is_presumed_dead_and_reopened(api, guard):
    api.bookmark_interval = 3600  # a server that never sends bookmarks: silence is all we get
    seed(api)
    quiet = LoopOptions(page_size=100, watch_timeout=30, idle_timeout=0.3, backoff_base=0.05, backoff_cap=0.3)
    watch, _, metrics = guard(options=quiet)
    assert watch.wait_synced(5)
    eventually(lambda: restarts(metrics, "node", "idle") >= 2, what="idle watches to be reopened")
    assert len(api.requests_for("node", watch=False)) == 1  # resumed, not relisted
    assert watch.health().stale == frozenset() and "node" not in watch.readiness_detail()
    api.put(o.node("worker-c"))
    eventually(lambda: watch.store.node("worker-c"), what="a change after the reopen")


# ---- the optional KubeVirt CR ---------------------------------------------------------------------------


def kubevirt_cr(strategy: str, outbound: int | None = None) -> dict:
    migrations = {} if outbound is None else {"parallelOutboundMigrationsPerNode": outbound}
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"evictionStrategy": strategy, "migrations": migrations}}}


def test_the_kubevirt_cr_is_watched_and_a_change_reaches_a_decision(api, guard):
    """A VMI without its own evictionStrategy: the CR's default decides rule 7n, live."""
    seed(api)
    own = o.vmi(NS, VMI, node="worker-a", created=time.time() - 86400)
    del own["spec"]["evictionStrategy"]
    api.put(own)
    api.put(kubevirt_cr("LiveMigrate", outbound=1))
    watch, http, _ = guard()
    assert watch.wait_synced(60)  # every kind listed (a hang guard): before that the answer is cache_not_ready
    eventually(lambda: watch.store.kubevirt() is not None, what="the KubeVirt CR")
    assert watch.store.kubevirt().effective_outbound_per_node == 1 and reason(http) == "allowed"
    api.put(kubevirt_cr("None"))
    eventually(lambda: watch.store.kubevirt().effective_eviction_strategy == "None", what="the change")
    assert reason(http) == "not_migratable", decide(http)
    assert watch.store.kubevirt().effective_outbound_per_node == 2  # unset again: KubeVirt's default


@pytest.mark.parametrize("how", ["forbidden", "absent"])
def test_an_unreadable_kubevirt_cr_never_holds_readiness_and_rules_fail_open(api, guard, caplog, how):
    seed(api)
    own = o.vmi(NS, VMI, node="worker-a", created=time.time() - 86400)
    del own["spec"]["evictionStrategy"]  # the cluster's default would decide, if it could be read
    api.put(own)
    api.put(kubevirt_cr("None"))
    if how == "forbidden":
        api.forbid("kubevirt")
    else:
        api.delete("kubevirt", "kubevirt", "kubevirt")
    caplog.set_level(logging.INFO, logger="kubevirt_eviction_guard.cluster")
    watch, http, metrics = guard()
    eventually(lambda: http.get("/readyz").status_code == 200, what="readiness without the KubeVirt CR")
    assert "kubevirt" not in http.get("/readyz").json().get("notSynced", {})
    assert watch.store.kubevirt() is None and reason(http) == "allowed"  # no CR known: rule 7n fails open
    if how == "forbidden":
        eventually(lambda: restarts(metrics, "kubevirt", "forbidden") >= 1, what="the 403 to be counted")
        said = [r for r in caplog.records if getattr(r, "kind", None) == "kubevirt"]
        assert said and all(r.levelno == logging.INFO for r in said), [r.getMessage() for r in said]
        assert "optional: the rules that read it fail open" in said[0].getMessage()
