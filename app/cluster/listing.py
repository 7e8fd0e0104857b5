"""Cluster state from one list of each kind through the API (``report``/``explain --kubeconfig``).

A one-shot read for humans at a terminal: list VMIs, VMIMs, virt-launcher pods
and nodes once, page by page (``limit``/``continue``), project every item into
its record, and hand back a ``ClusterStore``. The long-running guard keeps its
store current with watches instead; this module only lists.

Items come back as raw JSON (``_preload_content=False``) and are parsed with
orjson: the records need a dozen fields of each object, and building the
client's model classes for 30 KB VMIs would be most of the cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson
import urllib3
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from app.cluster.snapshot import SnapshotStats
from app.cluster.store import ClusterStore
from app.domain.descheduler import descheduler_from_object
from app.domain.evictionrequests import GROUP, PLURAL, VERSION, EvictionRequestRecord, eviction_request_from_object
from app.domain.kinds import DESCHEDULER, KUBEVIRT, NODE, POD, VMI, VMIM
from app.domain.records import (
    LAUNCHER_LABEL,
    LAUNCHER_VALUE,
    RecordError,
    kubevirt_from_object,
    migration_from_object,
    node_from_object,
    pod_from_object,
    vmi_from_object,
)

PAGE = 500
TIMEOUT = (5.0, 60.0)
KUBEVIRT_GV = ("kubevirt.io", "v1")
DESCHEDULER_API = ("operator.openshift.io", "v1", "openshift-kube-descheduler-operator", "kubedeschedulers", "cluster")
OPTIONAL_MISSING = (403, 404)  # not installed, or not ours to read: the optional kinds are left out


class ListError(RuntimeError):
    """The API server could not be listed; the text names the resource and the error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, when the API server answered


def _pages(what: str, call: Callable[..., Any]) -> Iterator[dict]:
    token = None
    while True:
        try:
            resp = call(limit=PAGE, _continue=token, _preload_content=False, _request_timeout=TIMEOUT)
            doc = orjson.loads(resp.read())
            resp.release_conn()
        except ApiException as e:
            raise ListError(f"listing {what}: {e.status} {e.reason}", e.status) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ListError(f"listing {what}: {type(e).__name__}: {e}") from None
        except orjson.JSONDecodeError as e:
            raise ListError(f"listing {what}: response is not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ListError(f"listing {what}: response is not a List")
        yield from doc.get("items") or ()
        token = (doc.get("metadata") or {}).get("continue")
        if not token:
            return


def list_store(client: ApiClient) -> tuple[ClusterStore, SnapshotStats]:
    store = ClusterStore()
    return store, list_into(client, store)


def list_into(client: ApiClient, store: ClusterStore) -> SnapshotStats:
    """List every kind and replace it in ``store`` (one kind at a time, each atomically)."""
    core, custom = CoreV1Api(client), CustomObjectsApi(client)
    sources = (
        (VMI, vmi_from_object, "virtualmachineinstances.kubevirt.io",
         lambda **kw: custom.list_cluster_custom_object(*KUBEVIRT_GV, "virtualmachineinstances", **kw)),
        (VMIM, migration_from_object, "virtualmachineinstancemigrations.kubevirt.io",
         lambda **kw: custom.list_cluster_custom_object(*KUBEVIRT_GV, "virtualmachineinstancemigrations", **kw)),
        (POD, pod_from_object, "pods",
         lambda **kw: core.list_pod_for_all_namespaces(label_selector=f"{LAUNCHER_LABEL}={LAUNCHER_VALUE}", **kw)),
        (NODE, node_from_object, "nodes", lambda **kw: core.list_node(**kw)),
    )
    stats = SnapshotStats()
    for kind, parse, what, call in sources:
        _list_kind(store, stats, kind, parse, what, call)
    list_optional(custom, store, stats)
    return stats


def _list_kind(store: ClusterStore, stats: SnapshotStats, kind: str, parse: Callable[[Any], Any], what: str,
               call: Callable[..., Any]) -> None:
    records = []
    for item in _pages(what, call):
        try:
            records.append(parse(item))
        except RecordError:
            stats.skipped_malformed += 1
    store.replace(kind, records)
    stats.loaded[kind] = len(records)


def list_optional(custom: CustomObjectsApi, store: ClusterStore, stats: SnapshotStats) -> None:
    """The KubeVirt CR and the KubeDescheduler, when they exist and we may read them: report shows their
    limits beside each other. Absent or forbidden, they are left out (report says "unknown")."""
    try:
        _list_kind(store, stats, KUBEVIRT, kubevirt_from_object, "kubevirts.kubevirt.io",
                   lambda **kw: custom.list_cluster_custom_object(*KUBEVIRT_GV, "kubevirts", **kw))
    except ListError as e:
        if e.status not in OPTIONAL_MISSING:
            raise
    group, version, namespace, plural, name = DESCHEDULER_API
    try:
        obj = custom.get_namespaced_custom_object(group, version, namespace, plural, name, _request_timeout=TIMEOUT)
    except ApiException as e:
        if e.status not in OPTIONAL_MISSING:
            raise ListError(f"reading {plural}.{group} {namespace}/{name}: {e.status} {e.reason}") from None
        return
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ListError(f"reading {plural}.{group}: {type(e).__name__}: {e}") from None
    if isinstance(obj, dict):
        store.replace(DESCHEDULER, [descheduler_from_object(obj)])
        stats.loaded[DESCHEDULER] = 1


def list_eviction_requests(client: ApiClient) -> list[EvictionRequestRecord] | None:
    """Every ``lifecycle.k8s.io/v1alpha1`` EvictionRequest, or None when the API server does not serve them (before
    1.37, or the ``EvictionRequestAPI`` gate or the API version off: 404) or we may not list them (403)."""
    custom = CustomObjectsApi(client)
    records = []
    try:
        for item in _pages(f"{PLURAL}.{GROUP}",
                           lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw)):
            try:
                records.append(eviction_request_from_object(item))
            except RecordError:
                continue
    except ListError as e:
        if e.status in OPTIONAL_MISSING:
            return None
        raise
    return records
