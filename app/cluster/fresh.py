"""`node_busy`'s count read again from the API server, for the moment an eviction is about to be let go.

The watch-fed store is a few milliseconds behind the API server. KubeVirt marks a VMI for evacuation while it
answers the eviction (before the descheduler gets its 429), and the descheduler sends its next eviction from the
same node right after; if that one reaches the guard before the watch has delivered the mark, the store shows the
node with room and a second VM leaves. The guard keeps no memory of its own answers (replicas and restarts must
agree), so it closes the window with the cluster itself: when the policy is about to allow a descheduler eviction
after counting a node's leavers, the VMIs on that node are listed once more, as a consistent read (no
``resourceVersion``: the API server answers from etcd's current revision, or from a watch cache it first brings
up to that revision), and the decision is taken again over them. A mark written before the descheduler's previous
eviction returned is in that answer.

Only VMIs are read: the mark is what KubeVirt writes inside the eviction; the VMIMs come later, from its
evacuation controller, long after the watch has delivered the mark. VMIs are selected by the label
``kubevirt.io/nodeName``, which KubeVirt keeps equal to ``status.nodeName``; the records are filtered by
``status.nodeName`` as well.

It costs at most one API call per allowed descheduler eviction (the rare answer: most are refused) and none for
denials, drains or other clients; ``app.admission.reads`` shares the reads of one node and bounds them per second. If the read fails or takes longer than its timeout, the store's answer stands: the guard
fails open, and says so (``leaver_reads_total{result="failed"}``, a warning).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from kubernetes.client import ApiClient, CustomObjectsApi

from app.domain.records import (
    KubeVirtRecord,
    LauncherPod,
    MigrationRecord,
    NodeRecord,
    RecordError,
    VMIRecord,
    vmi_from_object,
)
from app.domain.view import ClusterView

NODE_LABEL = "kubevirt.io/nodeName"


class FreshNodeView:
    """``base`` with the VMIs of one node as just read from the API server (they win over the store's)."""

    def __init__(self, base: ClusterView, node: str, vmis: Sequence[VMIRecord]) -> None:
        self.base = base
        self.node_name = node
        self.fresh = {v.key: v for v in vmis if v.node == node}

    def pod(self, namespace: str, name: str) -> LauncherPod | None:
        return self.base.pod(namespace, name)

    def vmi(self, namespace: str, name: str) -> VMIRecord | None:
        return self.fresh.get((namespace, name)) or self.base.vmi(namespace, name)

    def node(self, name: str) -> NodeRecord | None:
        return self.base.node(name)

    def migrations(self, namespace: str, vmi_name: str) -> Sequence[MigrationRecord]:
        return self.base.migrations(namespace, vmi_name)

    def unfinished_migration(self, uid: str) -> MigrationRecord | None:
        return self.base.unfinished_migration(uid)

    def leaving_candidates(self, node: str) -> Sequence[VMIRecord]:
        cached = self.base.leaving_candidates(node)
        if node != self.node_name:
            return cached
        out = {v.key: self.fresh.get(v.key, v) for v in cached}
        out.update(self.fresh)  # policy decides which of them count
        return list(out.values())

    def moves_from(self, node: str) -> Sequence[MigrationRecord]:
        return self.base.moves_from(node)

    def moves_to(self, node: str) -> Sequence[MigrationRecord]:
        return self.base.moves_to(node)

    def kubevirt(self) -> KubeVirtRecord | None:
        return self.base.kubevirt()


class LeaverRead:
    """``view_of(node)``: the store, with the node's VMIs read fresh (blocking; run it off the event loop)."""

    def __init__(self, client: ApiClient, base: ClusterView, timeout: float = 2.0) -> None:
        self.custom = CustomObjectsApi(client)
        self.base = base
        self.timeout = timeout

    def vmis_on(self, node: str) -> list[VMIRecord]:
        resp = self.custom.list_cluster_custom_object(
            "kubevirt.io", "v1", "virtualmachineinstances", label_selector=f"{NODE_LABEL}={node}",
            _preload_content=False, _request_timeout=self.timeout,
        )
        try:
            items = orjson.loads(resp.data).get("items") or []
        finally:
            resp.release_conn()
        out = []
        for item in items:
            try:
                out.append(vmi_from_object(item))
            except RecordError:
                continue  # the store skipped it too
        return out

    def view_of(self, node: str) -> ClusterView:
        return FreshNodeView(self.base, node, self.vmis_on(node))
