"""Objects, stores, reviews and a recording API for the side-effect tests."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.admission import review as rv
from app.cluster.store import ClusterStore
from app.domain.records import migration_from_object, node_from_object, pod_from_object, vmi_from_object
from app.policy import PolicySettings, decide
from app.timefmt import format_timestamp

NS = "vms"
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DESCHEDULER = "sigs.k8s.io/descheduler"
DESCHEDULER_USER = "system:serviceaccount:kube-system:descheduler-sa"
EVICTION_REASON = "triggered by default/LowNodeUtilization: node is overutilized"
EIP = "descheduler.alpha.kubernetes.io/eviction-in-progress"


def ts(seconds_ago: float) -> str:
    return format_timestamp(NOW - seconds_ago)


def pod_obj(name: str, vmi: str, node: str, rv_: str = "100", annotations: dict | None = None,
            eviction_in_progress: bool = False, phase: str = "Running", ready: bool | None = None,
            job: str = "") -> dict:
    ready = phase == "Running" if ready is None else ready
    ann = {"kubevirt.io/domain": vmi} if annotations is None else dict(annotations)
    if eviction_in_progress:
        ann[EIP] = "true"
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": rv_,
                            "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": f"uid-{vmi}"}}
    if ann:
        meta["annotations"] = ann
    if job:
        meta["labels"]["kubevirt.io/migrationJobUID"] = job
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def vmi_obj(name: str, node: str, evacuation: str = "", migrating_from: str = "", ended_ago: float | None = None,
            duration: float = 600) -> dict:
    status: dict[str, Any] = {"phase": "Running", "nodeName": node}
    if evacuation:
        status["evacuationNodeName"] = evacuation
    if migrating_from:
        status["migrationState"] = {"migrationUid": f"mig-{name}", "sourceNode": migrating_from, "targetNode": "other",
                                    "startTimestamp": ts(120)}
    elif ended_ago is not None:
        status["migrationState"] = {"migrationUid": f"mig-{name}", "sourceNode": "elsewhere", "targetNode": node,
                                    "startTimestamp": ts(ended_ago + duration), "endTimestamp": ts(ended_ago),
                                    "completed": True}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "creationTimestamp": ts(86400 * 3),
                         "resourceVersion": "50"},
            "status": status}


def node_obj(name: str, cordoned: bool = False) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"unschedulable": cordoned}}


def store_of(*objs: dict) -> ClusterStore:
    parsers = {"Pod": pod_from_object, "VirtualMachineInstance": vmi_from_object, "Node": node_from_object,
               "VirtualMachineInstanceMigration": migration_from_object}
    store = ClusterStore()
    for o in objs:
        store.upsert(parsers[o["kind"]](o))
    return store


def review_doc(pod: str, *, uid: str = "uid-1", requested_by: str = DESCHEDULER, username: str = DESCHEDULER_USER,
               reason: str = EVICTION_REASON, dry_run: bool = False, body_dry_run: bool = False,
               namespace: str = NS) -> dict:
    annotations = {}
    if requested_by:
        annotations["requested-by"] = requested_by
    if reason:
        annotations["reason"] = reason
    obj: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": pod, "namespace": namespace, "annotations": annotations},
                           "deleteOptions": {"dryRun": ["All"]} if body_dry_run else {}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "eviction",
        "name": pod, "namespace": namespace, "operation": "CREATE",
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
        "object": obj, "oldObject": None, "dryRun": dry_run,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}}


def review_of(pod: str, **kw) -> rv.Review:
    return rv.decode(orjson.dumps(review_doc(pod, **kw)))


def decided(store: ClusterStore, pod: str, now: float = NOW, **kw):
    review = review_of(pod, **kw)
    return review, decide(review.eviction, store, now, PolicySettings())


@dataclass
class RecordingApi:
    """An EffectsApi that records calls and raises the scripted errors, in order."""

    calls: list[tuple[str, str, str, Any]] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)

    def _do(self, op: str, ns: str, name: str, body: Any) -> None:
        self.calls.append((op, ns, name, copy.deepcopy(body)))
        if self.errors:
            raise self.errors.pop(0)

    def patch_pod(self, namespace, name, patch):
        self._do("patch_pod", namespace, name, patch)

    def create_event(self, namespace, event):
        self._do("create_event", namespace, event["metadata"]["name"], event)

    def patch_event(self, namespace, name, patch):
        self._do("patch_event", namespace, name, patch)

    def read_vmi(self, namespace, name):
        return None  # like LogOnlyApi: the store's VMI stands

    def of(self, op: str) -> list:
        return [c for c in self.calls if c[0] == op]


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


# ---- a real HTTPS guard server ---------------------------------------------------------


class GuardServer:
    """The real app under uvicorn with real TLS, on 127.0.0.1, in a thread."""

    def __init__(self, ctx, cert_dir) -> None:
        import socket
        import ssl
        import threading

        import uvicorn

        from app.admission.server import create_app
        from app.transport.tls import issue_certs, write_certs

        paths = write_certs(issue_certs("guard", "test"), cert_dir)
        self.ca = str(paths["ca"])
        self.tls = ssl.create_default_context(cafile=self.ca)  # for httpx.Client(verify=...)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(ctx), ssl_certfile=str(paths["cert"]), ssl_keyfile=str(paths["key"]),
                                log_config=None, access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> "GuardServer":
        import time

        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("guard server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self._sock.close()
