"""A small Kubernetes API server over real HTTP, for tests and benchmarks.

See the package docstring (``tests/fakeapi/__init__.py``) for the API. Design
notes for whoever extends it:

- One global, strictly increasing resourceVersion, as etcd gives: a change to
  any object of any kind bumps it. That is what makes bookmarks matter (a quiet
  kind's watch falls behind compaction without them) and what makes "410 Gone"
  happen in the same situations as on a real cluster.
- Objects are kept as their serialized JSON (``bytes``) plus their labels, so a
  synthetic cluster of 700,000 objects fits in the benchmark's memory and a
  list page is a ``b",".join``.
- Every change is appended to a per-resource history and pushed, under the
  state lock, into the queue of every matching open watch. Bookmarks are pushed
  through the same queue under the same lock, so a bookmark can never overtake
  an event it claims to cover.
- Handlers run one thread per connection (``ThreadingHTTPServer``); the control
  surface is called from the test's thread. One lock guards all state.
"""

from __future__ import annotations

import base64
import bisect
import collections
import copy
import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch
import orjson

from tests.fakeapi import resources as res
from tests.fakeapi.resources import Resource

DEFAULT_USER = "system:serviceaccount:kubevirt-eviction-guard:kubevirt-eviction-guard"
DEFAULT_WATCH_TIMEOUT = 1800  # kube-apiserver's --min-request-timeout
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- records for assertions ---------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    status: int

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass(frozen=True)
class PatchRecord:
    resource: str  # Resource.id
    namespace: str
    name: str
    content_type: str
    body: Any  # decoded JSON of the patch
    status: int  # what the server answered


@dataclass
class Fault:
    """An injected failure: answer ``status`` to the next ``times`` matching requests."""

    status: int
    times: int
    resource: Resource | None
    verbs: frozenset[str] | None
    retry_after: int | None
    message: str

    def matches(self, resource: Resource | None, verb: str) -> bool:
        if self.times <= 0:
            return False
        if self.resource is not None and resource != self.resource:
            return False
        return self.verbs is None or verb in self.verbs


# ---- state ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Obj:
    raw: bytes
    labels: dict
    rv: int


@dataclass(slots=True)
class _Change:
    rv: int
    type: str
    raw: bytes
    namespace: str
    labels: dict
    old_labels: dict | None  # labels before a MODIFIED


_CUT_CLEAN, _CUT_ABRUPT = object(), object()


@dataclass(eq=False)
class _Watcher:
    resource: Resource
    namespace: str
    selector: list
    bookmarks: bool
    queue: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    stalled: bool = False  # a dead connection: nothing more reaches the client, not even its end

    def wants(self, change: _Change) -> str | None:
        """The event type this watcher should see for a change, or None.

        With a label selector, an object that starts or stops matching shows up
        as ADDED or DELETED, as the real watch cache reports it."""
        if self.namespace and change.namespace != self.namespace:
            return None
        if not self.selector:
            return change.type
        now = res.selector_matches(self.selector, change.labels)
        if change.type != "MODIFIED" or change.old_labels is None:
            return change.type if now else None
        before = res.selector_matches(self.selector, change.old_labels)
        if now and before:
            return "MODIFIED"
        if now:
            return "ADDED"
        return "DELETED" if before else None


def _frame(event_type: str, raw: bytes) -> bytes:
    return b'{"type":"' + event_type.encode() + b'","object":' + raw + b"}\n"


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.rv = 1000  # like a real cluster, versions do not start at 1
        self.compacted_rv = 0  # watches from below this get 410 Expired
        self.objects: dict[Resource, dict[tuple[str, str], _Obj]] = {r: {} for r in res.ALL}
        self.history: dict[Resource, list[_Change]] = {r: [] for r in res.ALL}
        self.history_rvs: dict[Resource, list[int]] = {r: [] for r in res.ALL}
        self.watchers: set[_Watcher] = set()
        self.snapshots: dict[str, tuple[int, list[tuple[tuple[str, str], bytes]]]] = {}

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def record(self, resource: Resource, change: _Change) -> None:
        self.history[resource].append(change)
        self.history_rvs[resource].append(change.rv)
        frames: dict[str, bytes] = {}
        for w in self.watchers:
            if w.resource != resource:
                continue
            kind = w.wants(change)
            if kind is None:
                continue
            if kind not in frames:
                frames[kind] = _frame(kind, change.raw)
            w.queue.put(frames[kind])

    def changes_since(self, resource: Resource, rv: int) -> list[_Change]:
        rvs = self.history_rvs[resource]
        return self.history[resource][bisect.bisect_right(rvs, rv):]

    def compact(self, rv: int) -> None:
        self.compacted_rv = max(self.compacted_rv, rv)
        for r in res.ALL:
            cut = bisect.bisect_right(self.history_rvs[r], rv)
            del self.history[r][:cut]
            del self.history_rvs[r][:cut]
        for token, (snap_rv, _) in list(self.snapshots.items()):
            if snap_rv < self.compacted_rv:
                del self.snapshots[token]


def _key(resource: Resource, obj: dict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError("object has no metadata.name")
    return (meta.get("namespace", "") if resource.namespaced else "", name)


# ---- the server ---------------------------------------------------------------------------


class FakeApiServer:
    """See the package docstring. Use as a context manager, or call ``start()``/``stop()``."""

    def __init__(
        self,
        *,
        port: int = 0,
        bookmark_interval: float = 60.0,
        expired_as_http: bool = False,
        user: str = DEFAULT_USER,
        record_requests: bool = True,
    ) -> None:
        self.bookmark_interval = bookmark_interval
        self.expired_as_http = expired_as_http
        self.user = user
        self.record_requests = record_requests
        self.requests: collections.deque[RequestRecord] = collections.deque(maxlen=20000)
        self.patches: list[PatchRecord] = []
        self.cancels: list[PatchRecord] = []  # every evacuate/cancel PUT, with what was answered
        self.evacuate_cancel_forbidden = False  # RBAC without the evacuate/cancel rule: 403 (and SSAR says no)
        # virt-api's discovery of subresources.kubevirt.io/v1; drop the evacuate/cancel entries for KubeVirt < 1.8
        self.kubevirt_subresources: tuple[str, ...] = res.KUBEVIRT_SUBRESOURCES
        # SelfSubjectAccessReviews: each request's resourceAttributes, and which (group, resource, subresource,
        # verb) to answer "denied" for (besides evacuate/cancel when evacuate_cancel_forbidden)
        self.access_reviews: list[dict] = []
        self.denied_access: set[tuple[str, str, str, str]] = set()
        self._state = _State()
        self._faults: list[Fault] = []
        self._latency: list[tuple[float, Resource | None]] = []
        self._absent_groups: set[str] = set()
        self._forbidden: dict[Resource, frozenset[str]] = {}
        self._port = port
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        self._httpd = _HTTPServer(("127.0.0.1", self._port), _Handler, self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fakeapi:{self._port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.down()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def is_up(self) -> bool:
        return self._httpd is not None

    def down(self) -> None:
        """Stop listening (connection refused) and drop every open connection, watches included."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        self.cut_streams(clean=False)
        with self._conn_lock:
            conns, self._connections = self._connections, set()
        for conn in conns:
            _shutdown(conn)

    def up(self) -> None:
        """Listen again on the same port; state and history are kept, as after an API server restart."""
        if self._httpd is None:
            self.start()

    def configuration(self):
        """A ``kubernetes.client.Configuration`` pointing at this server."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        return cfg

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """A kubeconfig file for this server (plain HTTP, a dummy bearer token)."""
        p = Path(path)
        p.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
            f"contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n"
            "users:\n- name: fake\n  user:\n    token: fake-token\n",
            encoding="utf-8",
        )
        return p

    # ---- objects ------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._state.rv

    def put(self, obj: dict) -> dict:
        """Create or replace an object (ADDED or MODIFIED to watchers). Returns the stored copy."""
        resource = res.resource_of(obj)
        with self._state.lock:
            return self._store(resource, copy.deepcopy(obj))

    def create(self, obj: dict) -> dict:
        resource = res.resource_of(obj)
        with self._state.lock:
            if _key(resource, obj) in self._state.objects[resource]:
                raise KeyError(f"{resource.id} {_key(resource, obj)} already exists")
            return self._store(resource, copy.deepcopy(obj))

    def load(self, objects: Iterable[dict | bytes], kind: str | Resource | None = None, copy_objects: bool = True) -> int:
        """Bulk-load objects without history (for benchmarks): a watch from before this needs a relist.

        Items may be dicts or already-serialized JSON bytes (then ``kind`` names
        the resource and the bytes must already carry resourceVersion, uid, name).
        """
        n = 0
        st = self._state
        with st.lock:
            for item in objects:
                if isinstance(item, (bytes, bytearray)):
                    resource = res.resolve(kind) if kind is not None else None
                    obj = orjson.loads(item)
                    resource = resource or res.resource_of(obj)
                    rv = st.next_rv()
                    st.objects[resource][_key(resource, obj)] = _Obj(bytes(item), (obj.get("metadata") or {}).get("labels") or {}, rv)
                else:
                    resource = res.resource_of(item)
                    obj = copy.deepcopy(item) if copy_objects else item
                    meta = self._stamp(obj)
                    st.objects[resource][_key(resource, obj)] = _Obj(orjson.dumps(obj), meta.get("labels") or {},
                                                                     int(meta["resourceVersion"]))
                n += 1
            st.compact(st.rv)
        return n

    def delete(self, kind: str | Resource, namespace: str, name: str) -> bool:
        """Delete an object (DELETED to watchers, carrying the object at its deletion's version)."""
        resource = res.resolve(kind)
        with self._state.lock:
            return self._delete(resource, ("" if not resource.namespaced else namespace, name)) is not None

    def update_status(self, kind: str | Resource, namespace: str, name: str, status: dict) -> dict:
        """Replace an object's ``status`` and nothing else, as a write to the status subresource
        does (what KubeVirt's controllers do): annotations others wrote stay. Returns the stored copy."""
        resource = res.resolve(kind)
        with self._state.lock:
            o = self._state.objects[resource].get(("" if not resource.namespaced else namespace, name))
            if o is None:
                raise KeyError(f"{resource.id} {namespace}/{name} not found")
            obj = orjson.loads(o.raw)
            obj["status"] = copy.deepcopy(status)
            return self._store(resource, obj)

    def gc_finished_migrations(self, namespace: str, vmi_name: str, keep: int = 5) -> list[str]:
        """Delete the finished (Succeeded/Failed) VMIMs of one VMI except the ``keep`` most recent,
        as KubeVirt's migration controller does (by creationTimestamp, 5 kept). Returns the names deleted."""
        with self._state.lock:
            finished = [m for m in self.objects(res.VMIMS)
                        if m["metadata"].get("namespace") == namespace and (m.get("spec") or {}).get("vmiName") == vmi_name
                        and (m.get("status") or {}).get("phase") in ("Succeeded", "Failed")]
            finished.sort(key=lambda m: (m["metadata"].get("creationTimestamp") or "", m["metadata"]["name"]))
            doomed = [m["metadata"]["name"] for m in finished[:max(0, len(finished) - keep)]]
            for name in doomed:
                self.delete(res.VMIMS, namespace, name)
        return doomed

    def get(self, kind: str | Resource, namespace: str, name: str) -> dict | None:
        resource = res.resolve(kind)
        with self._state.lock:
            o = self._state.objects[resource].get(("" if not resource.namespaced else namespace, name))
        return orjson.loads(o.raw) if o else None

    def objects(self, kind: str | Resource) -> list[dict]:
        resource = res.resolve(kind)
        with self._state.lock:
            raws = [o.raw for o in self._state.objects[resource].values()]
        return [orjson.loads(r) for r in raws]

    def events(self) -> list[dict]:
        """Every Event object now stored, core/v1 and events.k8s.io/v1, oldest first."""
        out = self.objects(res.EVENTS) + self.objects(res.EVENTS_V1)
        return sorted(out, key=lambda e: int(e["metadata"]["resourceVersion"]))

    # ---- watch control ------------------------------------------------------------------------

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK at the current resourceVersion to every watch that asked for bookmarks."""
        st = self._state
        with st.lock:
            for w in st.watchers:
                if w.bookmarks:
                    w.queue.put(_bookmark(w.resource, st.rv))

    def cut_streams(self, kind: str | Resource | None = None, clean: bool = False) -> int:
        """End open watches: ``clean`` ends the chunked body properly (as at timeoutSeconds), otherwise
        the TCP connection is dropped mid-stream. Returns how many were cut."""
        resource = res.resolve(kind) if kind is not None else None
        st = self._state
        with st.lock:
            hit = [w for w in st.watchers if resource is None or w.resource == resource]
            for w in hit:
                w.queue.put(_CUT_CLEAN if clean else _CUT_ABRUPT)
        return len(hit)

    def stall_streams(self, kind: str | Resource | None = None) -> int:
        """Open watches go silent without closing, as when a NAT or conntrack entry is dropped: no event, no
        bookmark, no end at ``timeoutSeconds`` ever reaches the client; what they would have sent is lost
        (a new watch replays it from history). Only a cut or ``down()`` ends them. Returns how many."""
        resource = res.resolve(kind) if kind is not None else None
        st = self._state
        with st.lock:
            hit = [w for w in st.watchers if resource is None or w.resource == resource]
            for w in hit:
                w.stalled = True
                w.queue.put(None)  # wake the handler so it notices now
        return len(hit)

    def compact(self, rv: int | None = None, expire_watches: bool = False) -> None:
        """Forget history up to ``rv`` (default: now). A watch resuming from an older version then gets
        ``410 Expired``; with ``expire_watches`` every open watch gets that ERROR event right away."""
        st = self._state
        with st.lock:
            st.compact(st.rv if rv is None else rv)
            if expire_watches:
                for w in st.watchers:
                    w.queue.put(_expired_frame(st.compacted_rv, st.compacted_rv))
                    w.queue.put(_CUT_CLEAN)

    def emit_raw(self, kind: str | Resource, line: bytes) -> int:
        """Push one raw line (for malformed events) into every open watch of ``kind``."""
        resource = res.resolve(kind)
        if not line.endswith(b"\n"):
            line += b"\n"
        st = self._state
        with st.lock:
            hit = [w for w in st.watchers if w.resource == resource]
            for w in hit:
                w.queue.put(line)
        return len(hit)

    def hold_streams(self) -> None:
        """Stop writing to open watches; their events queue up (a slow or stalled server)."""
        self._flowing.clear()

    def release_streams(self) -> None:
        """Write everything held back, in big chunks, as a server catching up does."""
        self._flowing.set()

    def watch_count(self, kind: str | Resource | None = None) -> int:
        resource = res.resolve(kind) if kind is not None else None
        with self._state.lock:
            return sum(1 for w in self._state.watchers if resource is None or w.resource == resource)

    def wait_for_watches(self, kind: str | Resource, count: int = 1, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.watch_count(kind) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} watch(es) on {kind} after {timeout}s")
            time.sleep(0.01)

    # ---- faults -------------------------------------------------------------------------------

    def fail(
        self,
        status: int,
        times: int = 1,
        kind: str | Resource | None = None,
        verbs: Iterable[str] | None = None,
        retry_after: int | None = None,
        message: str | None = None,
    ) -> Fault:
        """Answer ``status`` (500, 429, 503, 410...) to the next ``times`` requests matching ``kind``/``verbs``
        (get, list, watch, create, update, patch, delete). ``times=-1``: until ``clear_faults()``."""
        fault = Fault(status, times if times >= 0 else 1 << 62, res.resolve(kind) if kind is not None else None,
                      frozenset(verbs) if verbs is not None else None, retry_after, message or f"injected {status}")
        with self._state.lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._state.lock:
            self._faults.clear()
            self._latency.clear()

    def set_latency(self, seconds: float, kind: str | Resource | None = None) -> None:
        """Delay every response (to ``kind``, or all) by ``seconds`` before the status line; 0 removes it."""
        resource = res.resolve(kind) if kind is not None else None
        with self._state.lock:
            self._latency = [(s, r) for s, r in self._latency if r != resource]
            if seconds > 0:
                self._latency.append((seconds, resource))

    def remove_api(self, group: str) -> None:
        """Stop serving an API group (``kubevirt.io``): every path under it answers 404, as when a CRD is absent."""
        self._absent_groups.add(group)

    def restore_api(self, group: str) -> None:
        self._absent_groups.discard(group)

    def forbid(self, kind: str | Resource, verbs: Iterable[str] = ("get", "list", "watch")) -> None:
        """RBAC says no: 403 Forbidden for these verbs on ``kind``."""
        self._forbidden[res.resolve(kind)] = frozenset(verbs)

    def allow(self, kind: str | Resource) -> None:
        self._forbidden.pop(res.resolve(kind), None)

    def requests_for(self, kind: str | Resource, watch: bool | None = None) -> list[RequestRecord]:
        """Recorded requests to ``kind``'s collection (list and watch), oldest first."""
        r = res.resolve(kind)
        return [q for q in list(self.requests) if _path_resource(q.path) == r and (watch is None or q.watch == watch)]

    # ---- internals ----------------------------------------------------------------------------

    def _stamp(self, obj: dict) -> dict:
        meta = obj.setdefault("metadata", {})
        if not meta.get("uid"):
            meta["uid"] = str(uuid.uuid4())
        if not meta.get("creationTimestamp"):
            meta["creationTimestamp"] = _now_rfc3339()
        meta["resourceVersion"] = str(self._state.next_rv())
        return meta

    def _store(self, resource: Resource, obj: dict) -> dict:
        st = self._state
        key = _key(resource, obj)
        old = st.objects[resource].get(key)
        if old is not None:
            old_meta = orjson.loads(old.raw).get("metadata", {})
            obj.setdefault("metadata", {}).setdefault("uid", old_meta.get("uid"))
            obj["metadata"].setdefault("creationTimestamp", old_meta.get("creationTimestamp"))
        meta = self._stamp(obj)
        raw = orjson.dumps(obj)
        labels = dict(meta.get("labels") or {})
        rv = int(meta["resourceVersion"])
        st.objects[resource][key] = _Obj(raw, labels, rv)
        st.record(resource, _Change(rv, "MODIFIED" if old else "ADDED", raw, key[0], labels,
                                    old.labels if old else None))
        return orjson.loads(raw)

    def _delete(self, resource: Resource, key: tuple[str, str]) -> dict | None:
        st = self._state
        old = st.objects[resource].pop(key, None)
        if old is None:
            return None
        obj = orjson.loads(old.raw)
        obj["metadata"]["resourceVersion"] = str(st.next_rv())
        raw = orjson.dumps(obj)
        st.record(resource, _Change(st.rv, "DELETED", raw, key[0], old.labels, None))
        return obj

    def _take_fault(self, resource: Resource | None, verb: str) -> Fault | None:
        with self._state.lock:
            for f in self._faults:
                if f.matches(resource, verb):
                    f.times -= 1
                    return f
        return None

    def _latency_for(self, resource: Resource | None) -> float:
        with self._state.lock:
            return max((s for s, r in self._latency if r is None or r == resource), default=0.0)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conn_lock:
            (self._connections.add if add else self._connections.discard)(conn)


def _bookmark(resource: Resource, rv: int) -> bytes:
    obj = {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": {"resourceVersion": str(rv)}}
    return _frame("BOOKMARK", orjson.dumps(obj))


def _expired_frame(asked: int, oldest: int) -> bytes:
    return _frame("ERROR", res.status_bytes(410, f"too old resource version: {asked} ({oldest})", "Expired"))


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        conn.close()
    except OSError:
        pass


EVACUATE_CANCEL = "virtualmachineinstances/evacuate/cancel"
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
KUBEVIRT_DRAIN_TAINT = "kubevirt.io/drain"  # KubeVirt's default migrations.nodeDrainTaintKey


def _evacuate_cancel_path(path: str) -> tuple[str, str] | None:
    """(namespace, name) for KubeVirt's evacuate/cancel subresource path, else None."""
    segs = [s for s in path.split("/") if s]
    if (len(segs) == 9 and segs[:4] == ["apis", "subresources.kubevirt.io", "v1", "namespaces"]
            and segs[5] == "virtualmachineinstances" and segs[7:] == ["evacuate", "cancel"]):
        return segs[4], segs[6]
    return None


def _path_resource(path: str) -> Resource | None:
    try:
        route = _parse_path(path)
    except ValueError:
        return None
    return route[0] if route else None


def _parse_path(path: str) -> tuple[Resource, str, str, str] | None:
    """URL path -> (resource, namespace, name, subresource); None for discovery paths.

    Raises ValueError for paths the server does not serve (404)."""
    segs = [s for s in path.split("/") if s]
    if segs[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", segs[2:]
    elif len(segs) >= 3 and segs[0] == "apis":
        group, version, rest = segs[1], segs[2], segs[3:]
    else:
        if segs in ([], ["api"], ["apis"], ["version"]) or (len(segs) == 2 and segs[0] == "apis"):
            return None
        raise ValueError(path)
    if not rest:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else ""), (rest[2] if len(rest) > 2 else "")
    if len(rest) > 3:
        raise ValueError(path)
    for r in res.ALL:
        if r.group == group and r.version == version and r.plural == plural:
            if namespace and not r.namespaced:
                raise ValueError(path)
            return r, namespace, name, sub
    raise ValueError(path)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], handler: type, fake: FakeApiServer) -> None:
        self.fake = fake
        super().__init__(addr, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up mid-request (a watch closed, a reset) is routine here, not a traceback on stderr."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        self.fake._track(request, True)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.fake._track(request, False)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stalls
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # ---- plumbing -----------------------------------------------------------------------------

    @property
    def fake(self) -> FakeApiServer:
        return self.server.fake

    def _record(self, status: int) -> None:
        if self.fake.record_requests:
            self.fake.requests.append(RequestRecord(self.command, self._path, self._query, status))

    def _send(self, status: int, body: bytes | dict, headers: dict | None = None) -> None:
        data = body if isinstance(body, (bytes, bytearray)) else orjson.dumps(body)
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        self._path = url.path
        self._query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        body = self._body() if self.command in ("POST", "PUT", "PATCH") else b""
        cancel = _evacuate_cancel_path(url.path)
        if cancel is not None:
            return self._evacuate_cancel(*cancel, body)
        if url.path.rstrip("/") == SSAR_PATH and self.command == "POST":
            return self._self_subject_access_review(body)
        try:
            route = _parse_path(url.path)
        except ValueError:
            return self._send(404, res.not_found_api())
        resource = route[0] if route else None
        if resource is not None and resource.group in self.fake._absent_groups:
            return self._send(404, res.not_found_api())
        verb = self._verb(route)
        delay = self.fake._latency_for(resource)
        if delay:
            time.sleep(delay)
        fault = self.fake._take_fault(resource, verb)
        if fault is not None:
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
            return self._send(fault.status, res.status(fault.status, fault.message), headers)
        if route is None:
            return self._discovery(url.path)
        resource, namespace, name, sub = route
        if verb in self.fake._forbidden.get(resource, ()):
            return self._send(403, res.forbidden(resource, verb, namespace, self.fake.user))
        if sub:
            return self._send(404, res.status(404, f"{resource.id} subresource {sub!r} is not served by the fake", "NotFound"))
        handler = getattr(self, "_" + verb, None)
        if handler is None:
            return self._send(405, res.status(405, "the server does not allow this method on the requested resource"))
        return handler(resource, namespace, name, body)

    def _verb(self, route: tuple | None) -> str:
        method = self.command
        if route is None:
            return "get"
        name = route[2]
        if method == "GET":
            if name:
                return "get"
            return "watch" if self._query.get("watch") in ("true", "1") else "list"
        return {"POST": "create" if not name else "post", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, method.lower())

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch  # type: ignore[assignment]

    # ---- discovery ----------------------------------------------------------------------------

    def _discovery(self, path: str) -> None:
        segs = [s for s in path.split("/") if s]
        groups = sorted({r.group for r in res.ALL if r.group and r.group not in self.fake._absent_groups}
                        | ({res.SUBRESOURCES_GROUP} - self.fake._absent_groups))
        if segs == ["version"]:
            return self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fakeapi"})
        if segs == ["api"]:
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
        if segs == ["apis"]:
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}} for g in groups]})
        group, version = ("", "v1") if segs[:1] == ["api"] else (segs[1], segs[2] if len(segs) > 2 else "")
        if group == res.SUBRESOURCES_GROUP and version == "v1" and group not in self.fake._absent_groups:
            return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/v1",
                                    "resources": [{"name": n, "namespaced": True}
                                                  for n in self.fake.kubevirt_subresources]})
        if group and group not in groups:
            return self._send(404, res.not_found_api())
        rs = [r for r in res.ALL if r.group == group and r.version == version]
        if not rs:
            return self._send(404, res.not_found_api())
        return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": rs[0].api_version,
                                "resources": [{"name": r.plural, "namespaced": r.namespaced, "kind": r.kind,
                                               "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                                              for r in rs]})

    # ---- list ---------------------------------------------------------------------------------

    def _list(self, resource: Resource, namespace: str, name: str, body: bytes) -> None:
        st = self.fake._state
        q = self._query
        try:
            selector = res.parse_selector(q.get("labelSelector"))
            limit = int(q.get("limit") or 0)
        except (res.SelectorError, ValueError) as e:
            return self._send(400, res.status(400, f"invalid list options: {e}"))
        token = q.get("continue") or ""
        with st.lock:
            if token:
                try:
                    decoded = orjson.loads(base64.urlsafe_b64decode(token.encode()))
                    snap_id, offset = decoded["id"], int(decoded["offset"])
                except Exception:
                    return self._send(400, res.status(400, "continue key is not valid: illegal base64 data"))
                snap = st.snapshots.get(snap_id)
                if snap is None:
                    return self._send(410, res.status(410, EXPIRED_CONTINUE, "Expired"))
                rv, items = snap
            else:
                rv = st.rv
                objs = st.objects[resource]
                items = sorted(
                    (k, o.raw) for k, o in objs.items()
                    if (not namespace or k[0] == namespace) and (not selector or res.selector_matches(selector, o.labels))
                )
                offset, snap_id = 0, uuid.uuid4().hex
            page = items[offset: offset + limit] if limit else items[offset:]
            rest = len(items) - offset - len(page)
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if rest > 0:
                st.snapshots[snap_id] = (rv, items)
                meta["continue"] = base64.urlsafe_b64encode(
                    orjson.dumps({"id": snap_id, "offset": offset + len(page), "rv": rv})).decode()
                meta["remainingItemCount"] = rest
            else:
                st.snapshots.pop(snap_id, None)
        head = orjson.dumps({"kind": resource.list_kind, "apiVersion": resource.api_version, "metadata": meta})
        data = head[:-1] + b',"items":[' + b",".join(raw for _, raw in page) + b"]}"
        self._send(200, data)

    # ---- watch --------------------------------------------------------------------------------

    def _watch(self, resource: Resource, namespace: str, name: str, body: bytes) -> None:
        fake, st, q = self.fake, self.fake._state, self._query
        try:
            selector = res.parse_selector(q.get("labelSelector"))
            timeout = float(q.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        except (res.SelectorError, ValueError) as e:
            return self._send(400, res.status(400, f"invalid watch options: {e}"))
        rv_param = q.get("resourceVersion") or ""
        watcher = _Watcher(resource, namespace, selector, q.get("allowWatchBookmarks") in ("true", "1"))
        with st.lock:
            if rv_param not in ("", "0"):
                try:
                    start = int(rv_param)
                except ValueError:
                    return self._send(400, res.status(400, f"invalid resource version: {rv_param!r}"))
                if start < st.compacted_rv:
                    if fake.expired_as_http:
                        return self._send(410, res.status(410, f"too old resource version: {start} ({st.compacted_rv})", "Expired"))
                    replay = [_expired_frame(start, st.compacted_rv)]
                    watcher = None  # type: ignore[assignment]
                else:
                    replay = []
                    for ch in st.changes_since(resource, start):
                        kind = _Watcher.wants(watcher, ch)
                        if kind:
                            replay.append(_frame(kind, ch.raw))
            else:  # "any version": synthetic ADDED for what exists now
                replay = [_frame("ADDED", o.raw) for k, o in st.objects[resource].items()
                          if (not namespace or k[0] == namespace) and res.selector_matches(selector, o.labels)]
            if watcher is not None:
                st.watchers.add(watcher)
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if replay:
                self._chunk(b"".join(replay))
            if watcher is None:  # expired: the ERROR event, then a clean end
                return self._end()
            self._stream(watcher, time.monotonic() + timeout)
        except OSError:
            self.close_connection = True
        finally:
            if watcher is not None:
                with st.lock:
                    st.watchers.discard(watcher)

    def _stream(self, watcher: _Watcher, deadline: float) -> None:
        fake = self.fake
        next_bookmark = time.monotonic() + fake.bookmark_interval
        while True:
            if watcher.stalled:
                return self._stalled(watcher)
            now = time.monotonic()
            if now >= deadline:
                return self._end()
            if watcher.bookmarks and now >= next_bookmark:
                with fake._state.lock:
                    watcher.queue.put(_bookmark(watcher.resource, fake._state.rv))
                next_bookmark = now + fake.bookmark_interval
            if not fake._flowing.is_set():
                fake._flowing.wait(min(0.05, max(deadline - now, 0.001)))
                continue
            wait = min(deadline, next_bookmark if watcher.bookmarks else deadline) - now
            try:
                item = watcher.queue.get(timeout=max(wait, 0.001))
            except queue.Empty:
                continue
            batch = []
            while True:
                if item is None:  # a wake-up from stall_streams
                    break
                if item is _CUT_CLEAN:
                    if batch:
                        self._chunk(b"".join(batch))
                    return self._end()
                if item is _CUT_ABRUPT:
                    if batch:
                        self._chunk(b"".join(batch))
                    self.close_connection = True
                    _shutdown(self.connection)
                    return
                batch.append(item)
                if len(batch) >= 2000:
                    break
                try:
                    item = watcher.queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._chunk(b"".join(batch))

    def _stalled(self, watcher: _Watcher) -> None:
        """Say nothing until a cut, then drop the connection (a dead one has no clean end)."""
        while watcher.queue.get() not in (_CUT_CLEAN, _CUT_ABRUPT):
            pass
        self.close_connection = True
        _shutdown(self.connection)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # ---- single objects -----------------------------------------------------------------------

    def _get(self, resource: Resource, namespace: str, name: str, body: bytes) -> None:
        with self.fake._state.lock:
            o = self.fake._state.objects[resource].get((namespace, name))
        if o is None:
            return self._send(404, _not_found(resource, name))
        self._send(200, o.raw)

    def _create(self, resource: Resource, namespace: str, name: str, body: bytes) -> None:
        try:
            obj = orjson.loads(body)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except (orjson.JSONDecodeError, ValueError) as e:
            return self._send(400, res.status(400, f"the body of the request was in an unknown format: {e}"))
        meta = obj.setdefault("metadata", {})
        if resource.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                return self._send(400, res.status(400, "the namespace of the provided object does not match the namespace sent on the request"))
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            return self._send(422, res.status(422, f"{resource.kind} \"\" is invalid: metadata.name: Required value: name or generateName is required"))
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        meta.pop("resourceVersion", None)
        with self.fake._state.lock:
            if (namespace if resource.namespaced else "", meta["name"]) in self.fake._state.objects[resource]:
                return self._send(409, res.status(409, f'{resource.id} "{meta["name"]}" already exists', "AlreadyExists",
                                                  {"name": meta["name"], "group": resource.group, "kind": resource.plural}))
            stored = self.fake._store(resource, obj)
        self._send(201, stored)

    def _update(self, resource: Resource, namespace: str, name: str, body: bytes) -> None:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return self._send(400, res.status(400, f"the body of the request was in an unknown format: {e}"))
        with self.fake._state.lock:
            current = self.fake._state.objects[resource].get((namespace, name))
            if current is None:
                return self._send(404, _not_found(resource, name))
            asked = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if asked and asked != str(current.rv):
                return self._send(409, _conflict(resource, name))
            stored = self.fake._store(resource, obj)
        self._send(200, stored)

    def _patch(self, resource: Resource, namespace: str, name: str, body: bytes) -> None:
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            patch = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return self._patched(resource, namespace, name, ctype, None, 400, res.status(400, f"error decoding patch: {e}"))
        with self.fake._state.lock:
            current = self.fake._state.objects[resource].get((namespace, name))
            if current is None:
                return self._patched(resource, namespace, name, ctype, patch, 404, _not_found(resource, name))
            obj = orjson.loads(current.raw)
            if ctype == "application/json-patch+json":
                if not isinstance(patch, list):
                    return self._patched(resource, namespace, name, ctype, patch, 400,
                                         res.status(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch"))
                try:
                    patched = jsonpatch.JsonPatch(patch).apply(obj)
                except jsonpatch.JsonPatchTestFailed as e:
                    return self._patched(resource, namespace, name, ctype, patch, 422, res.status(422, f"testing value failed: {e}"))
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError, TypeError) as e:
                    return self._patched(resource, namespace, name, ctype, patch, 422, res.status(422, str(e)))
            elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if not isinstance(patch, dict):
                    return self._patched(resource, namespace, name, ctype, patch, 400, res.status(400, "patch is not an object"))
                patched = _merge(obj, patch)  # strategic merge treated as JSON merge (lists replaced)
            else:
                return self._patched(resource, namespace, name, ctype, patch, 415,
                                     res.status(415, "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"))
            asked = str((patched.get("metadata") or {}).get("resourceVersion") or "")
            if asked and asked != str(current.rv):
                return self._patched(resource, namespace, name, ctype, patch, 409, _conflict(resource, name))
            if patched == obj:  # no-op: the real server does not bump the version
                return self._patched(resource, namespace, name, ctype, patch, 200, current.raw)
            stored = self.fake._store(resource, patched)
        self._patched(resource, namespace, name, ctype, patch, 200, stored)

    def _patched(self, resource: Resource, namespace: str, name: str, ctype: str, patch: Any, status: int,
                 body: bytes | dict) -> None:
        self.fake.patches.append(PatchRecord(resource.id, namespace, name, ctype, patch, status))
        self._send(status, body)

    # ---- authorization.k8s.io/v1 SelfSubjectAccessReview ------------------------------------------------

    def _self_subject_access_review(self, body: bytes) -> None:
        """The API server's answer for the caller: allowed unless the test denied these attributes."""
        fake = self.fake
        try:
            review = orjson.loads(body)
            attrs = review["spec"]["resourceAttributes"]
            if not isinstance(attrs, dict):
                raise TypeError
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return self._send(400, res.status(400, "SelfSubjectAccessReview: spec.resourceAttributes required"))
        fake.access_reviews.append(attrs)
        key = (attrs.get("group", ""), attrs.get("resource", ""), attrs.get("subresource", ""), attrs.get("verb", ""))
        cancel = (key[0] == res.SUBRESOURCES_GROUP and key[1] == "virtualmachineinstances"
                  and key[2] in ("evacuate", "evacuate/cancel"))
        allowed = key not in fake.denied_access and not (cancel and fake.evacuate_cancel_forbidden)
        review["status"] = {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule matched"})}
        review.setdefault("apiVersion", "authorization.k8s.io/v1")
        review.setdefault("kind", "SelfSubjectAccessReview")
        self._send(201, review)

    # ---- KubeVirt's aggregated API: virtualmachineinstances/NAME/evacuate/cancel (v1.8) ----------------

    def _evacuate_cancel(self, namespace: str, name: str, body: bytes) -> None:
        """``PUT /apis/subresources.kubevirt.io/v1/namespaces/NS/virtualmachineinstances/NAME/evacuate/cancel``
        with ``{"evacuationNodeName": NODE}``, as virt-api serves it: 404 for an unknown VMI; 400
        when the node being left carries KubeVirt's drain taint (``kubevirt.io/drain:NoSchedule``, the
        default NodeDrainTaintKey); 200 and nothing done when the VMI is not marked; else a JSON
        patch that tests ``/status/evacuationNodeName`` against the body's node and removes it
        (a mismatch is the 500 InternalError virt-api answers for a failed patch); 406 to an ``Accept``
        that does not allow ``*/*``."""
        fake = self.fake
        vmi_resource = res.resolve("vmi")
        if "subresources.kubevirt.io" in fake._absent_groups:  # KubeVirt < 1.8 serves no evacuate/cancel
            return self._send(404, res.status(404, "the server could not find the requested resource", "NotFound"))
        if self.command != "PUT":
            return self._send(405, res.status(405, "the server does not allow this method on the requested resource"))
        fault = fake._take_fault(None, "update")
        if fault is not None:
            return self._send(fault.status, res.status(fault.status, fault.message))
        if fake.evacuate_cancel_forbidden:
            return self._send(403, res.status(403, f'virtualmachineinstances.subresources.kubevirt.io "{name}" is '
                                                   f'forbidden: User "{fake.user}" cannot update resource '
                                                   '"virtualmachineinstances/evacuate" in API group '
                                                   f'"subresources.kubevirt.io" in the namespace "{namespace}"',
                                              "Forbidden"))
        accept = self.headers.get("Accept")
        if accept and not any(t.split(";", 1)[0].strip() == "*/*" for t in accept.split(",")):
            # virt-api's route declares no Produces (pkg/virt-api/api.go): go-restful serves it only to an Accept
            # that allows */* (route.go matchesAccept), else 406 with a plain-text body
            return self._send(406, b"406: Not Acceptable\n\nAvailable representations: ")
        with fake._state.lock:
            current = fake._state.objects[vmi_resource].get((namespace, name))
            if current is None:
                return self._cancelled(namespace, name, body, 404, _not_found(vmi_resource, name))
            obj = orjson.loads(current.raw)
            status = obj.get("status") or {}
            left = status.get("evacuationNodeName") or status.get("nodeName") or ""
            node = fake._state.objects[res.resolve("node")].get(("", left))
            taints = ((orjson.loads(node.raw).get("spec") or {}).get("taints") or []) if node is not None else []
            if any(t.get("key") == KUBEVIRT_DRAIN_TAINT and t.get("effect") == "NoSchedule" for t in taints):
                return self._cancelled(namespace, name, body, 400, res.status(
                    400, f'Node "{left}" has NodeDrainTaintKey '  # virt-api prints the *Taint's String()
                    f'"&Taint{{Key:{KUBEVIRT_DRAIN_TAINT},Value:,Effect:NoSchedule,TimeAdded:<nil>,}}"', "BadRequest"))
            if not status.get("evacuationNodeName"):
                return self._cancelled(namespace, name, body, 200, b"")
            try:
                opts = orjson.loads(body) if body else None
            except orjson.JSONDecodeError as e:
                return self._cancelled(namespace, name, body, 400, res.status(400, f"Can not unmarshal Request body to struct: {e}", "BadRequest"))
            if not isinstance(opts, dict):
                return self._cancelled(namespace, name, body, 400, res.status(400, "No body", "BadRequest"))
            if opts.get("evacuationNodeName") != status.get("evacuationNodeName"):
                return self._cancelled(namespace, name, opts, 500, res.status(
                    500, "Internal error occurred: testing value /status/evacuationNodeName failed", "InternalError"))
            del status["evacuationNodeName"]
            fake._store(vmi_resource, obj)
        self._cancelled(namespace, name, opts, 200, b"")

    def _cancelled(self, namespace: str, name: str, body: Any, status: int, answer: bytes | dict) -> None:
        if isinstance(body, (bytes, bytearray)):
            try:
                body = orjson.loads(body) if body else None
            except orjson.JSONDecodeError:
                body = body.decode("utf-8", "replace")
        self.fake.cancels.append(PatchRecord(EVACUATE_CANCEL, namespace, name, self.headers.get("Content-Type") or "",
                                             body, status))
        self._send(status, answer)

    def _delete(self, resource: Resource, namespace: str, name: str, body: bytes) -> None:
        with self.fake._state.lock:
            obj = self.fake._delete(resource, (namespace, name))
        if obj is None:
            return self._send(404, _not_found(resource, name))
        self._send(200, obj)


def _not_found(resource: Resource, name: str) -> dict:
    return res.status(404, f'{resource.id} "{name}" not found', "NotFound",
                      {"name": name, "group": resource.group, "kind": resource.plural})


def _conflict(resource: Resource, name: str) -> dict:
    return res.status(409, f'Operation cannot be fulfilled on {resource.id} "{name}": the object has been modified; '
                           "please apply your changes to the latest version and try again", "Conflict",
                      {"name": name, "group": resource.group, "kind": resource.plural})


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out
