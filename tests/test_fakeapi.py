"""The fake API server itself, driven by the real ``kubernetes`` client: if it lies, every informer test lies."""

from __future__ import annotations

import orjson
import pytest
from kubernetes import client

from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

pytestmark = pytest.mark.timeout(30)
KV = ("kubevirt.io", "v1", "virtualmachineinstances")


@pytest.fixture
def api():
    with FakeApiServer(bookmark_interval=0.2) as server:
        yield server


@pytest.fixture
def k8s(api):
    ac = client.ApiClient(api.configuration())
    yield client.CoreV1Api(ac), client.CustomObjectsApi(ac)
    ac.close()


def _lines(resp) -> list[dict]:
    buf = b"".join(resp.stream(None, decode_content=False))
    return [orjson.loads(line) for line in buf.splitlines() if line]


def test_paginated_list_is_one_consistent_snapshot(api, k8s):
    _, co = k8s
    for i in range(5):
        api.put(o.vmi("vms", f"vm-{i}", node="n1"))
    first = orjson.loads(co.list_cluster_custom_object(*KV, limit=2, _preload_content=False).data)
    api.put(o.vmi("vms", "vm-late", node="n1"))  # after the snapshot: not in later pages
    names = [i["metadata"]["name"] for i in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = orjson.loads(co.list_cluster_custom_object(*KV, limit=2, _continue=token, _preload_content=False).data)
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    assert names == [f"vm-{i}" for i in range(5)]


def test_continue_token_expires_with_compaction(api, k8s):
    _, co = k8s
    for i in range(3):
        api.put(o.vmi("vms", f"vm-{i}"))
    first = orjson.loads(co.list_cluster_custom_object(*KV, limit=1, _preload_content=False).data)
    api.put(o.vmi("vms", "other"))
    api.compact()
    with pytest.raises(client.ApiException) as e:
        co.list_cluster_custom_object(*KV, limit=1, _continue=first["metadata"]["continue"], _preload_content=False)
    assert e.value.status == 410 and "Expired" in str(e.value.body)


def test_watch_replays_history_then_ends_cleanly_at_timeout(api, k8s):
    _, co = k8s
    api.put(o.vmi("vms", "a"))
    rv = api.resource_version
    api.put(o.vmi("vms", "b"))
    api.delete("vmi", "vms", "a")
    resp = co.list_cluster_custom_object(*KV, watch=True, resource_version=str(rv), timeout_seconds=1,
                                         _preload_content=False)
    events = [(e["type"], e["object"]["metadata"]["name"]) for e in _lines(resp)]
    assert events == [("ADDED", "b"), ("DELETED", "a")]


def test_watch_from_compacted_version_gets_410_error_event(api, k8s):
    _, co = k8s
    api.put(o.vmi("vms", "a"))
    old = api.resource_version
    api.put(o.vmi("vms", "b"))
    api.compact()
    resp = co.list_cluster_custom_object(*KV, watch=True, resource_version=str(old - 1), timeout_seconds=5,
                                         _preload_content=False)
    (event,) = _lines(resp)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"


def test_bookmarks_carry_the_global_version(api, k8s):
    _, co = k8s
    rv = api.resource_version
    api.put(o.node("n1"))  # another kind moves the global version
    resp = co.list_cluster_custom_object(*KV, watch=True, resource_version=str(rv), allow_watch_bookmarks=True,
                                         timeout_seconds=1, _preload_content=False)
    bookmarks = [e for e in _lines(resp) if e["type"] == "BOOKMARK"]
    assert bookmarks and bookmarks[-1]["object"]["metadata"]["resourceVersion"] == str(api.resource_version)


def test_label_selected_watch_sees_objects_leave_the_selection(api, k8s):
    core, _ = k8s
    pod = api.put(o.launcher_pod("vms", "a", "n1", name="virt-launcher-a"))
    rv = api.resource_version
    pod["metadata"]["labels"]["kubevirt.io"] = "something-else"
    api.put(pod)
    resp = core.list_pod_for_all_namespaces(label_selector="kubevirt.io=virt-launcher", watch=True,
                                            resource_version=str(rv), timeout_seconds=1, _preload_content=False)
    assert [e["type"] for e in _lines(resp)] == ["DELETED"]


def test_json_patch_test_op_422_and_stale_version_409(api, k8s):
    core, _ = k8s
    pod = api.put(o.launcher_pod("vms", "a", "n1", name="virt-launcher-a"))
    rv = pod["metadata"]["resourceVersion"]
    ok = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
          {"op": "add", "path": "/metadata/annotations/x", "value": "true"}]
    core.patch_namespaced_pod("virt-launcher-a", "vms", ok)
    assert api.get("pod", "vms", "virt-launcher-a")["metadata"]["annotations"]["x"] == "true"
    with pytest.raises(client.ApiException) as e:
        core.patch_namespaced_pod("virt-launcher-a", "vms", ok)  # the version moved on
    assert e.value.status == 422
    with pytest.raises(client.ApiException) as e:
        core.patch_namespaced_pod("virt-launcher-a", "vms", [{"op": "replace", "path": "/metadata/resourceVersion",
                                                              "value": rv}])
    assert e.value.status == 409
    assert [p.status for p in api.patches] == [200, 422, 409]


def test_events_are_created_and_recorded(api, k8s):
    core, _ = k8s
    body = {"metadata": {"generateName": "db."}, "involvedObject": {"kind": "VirtualMachineInstance", "name": "db"},
            "reason": "EvictionBlocked", "message": "no", "type": "Warning"}
    core.create_namespaced_event("vms", body)
    ev_api = client.EventsV1Api(client.ApiClient(api.configuration()))
    ev_api.create_namespaced_event("vms", {"metadata": {"name": "db.2"}, "reason": "EvictionBlocked", "note": "no",
                                           "eventTime": "2026-11-21T12:00:00.000000Z", "action": "Evict",
                                           "reportingController": "x", "reportingInstance": "y"})
    events = api.events()
    assert [e["reason"] for e in events] == ["EvictionBlocked", "EvictionBlocked"]
    assert {e["apiVersion"] for e in events} == {"v1", "events.k8s.io/v1"}


def test_absent_and_forbidden_apis(api, k8s):
    core, co = k8s
    api.remove_api("kubevirt.io")
    with pytest.raises(client.ApiException) as e:
        co.list_cluster_custom_object(*KV, _preload_content=False)
    assert e.value.status == 404
    api.forbid("node")
    with pytest.raises(client.ApiException) as e:
        core.list_node(_preload_content=False)
    assert e.value.status == 403 and "cannot list resource" in str(e.value.body)


def test_down_refuses_connections_and_up_serves_the_same_state(api, k8s):
    core, _ = k8s
    api.put(o.node("n1"))
    api.down()
    with pytest.raises(Exception):
        core.list_node(_preload_content=False, _request_timeout=2)
    api.up()
    assert [n["metadata"]["name"] for n in orjson.loads(core.list_node(_preload_content=False).data)["items"]] == ["n1"]


def test_injected_faults_and_retry_after(api):
    cfg = api.configuration()
    cfg.retries = False  # urllib3 would otherwise honour Retry-After itself
    core = client.CoreV1Api(client.ApiClient(cfg))
    api.fail(429, kind="node", verbs=["list"], retry_after=3)
    with pytest.raises(client.ApiException) as e:
        core.list_node(_preload_content=False)
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "3"
    core.list_node(_preload_content=False)  # only once
