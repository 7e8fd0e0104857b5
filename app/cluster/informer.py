"""List+watch loops that keep the ``ClusterStore`` current, one per kind.

Four loops (VMIs and VMIMs through the kubevirt.io/v1 custom-objects API in
all namespaces, virt-launcher pods by label selector, nodes) each do the same
dance, the one client-go's reflector does. A fifth, for the KubeVirt CR (its
migration limits and default eviction strategy), is optional: it is not on the
health board, so it never holds readiness back, and when the CR is absent or
forbidden it says so once, at info level, and looks again every few minutes
(the rule that reads it fails open meanwhile):

1. **List** the kind in pages (``limit``/``continue``). Paging keeps every
   response small for the API server and for us, and the pages of one list are
   one consistent snapshot at one ``resourceVersion``. The records replace the
   kind in the store atomically (``ClusterStore.replace``), which is the only way
   objects deleted while we were not watching can disappear.
2. **Watch** from that ``resourceVersion`` with ``allowWatchBookmarks=true`` and a
   server-side ``timeoutSeconds``. Every event moves our resourceVersion forward;
   when the server ends the stream (it always does, at the timeout) we watch
   again from where we were, without listing again.

Why bookmarks: the resourceVersion is global to the cluster (etcd's revision).
A quiet kind (nodes, say) sees no events for an hour while VMIMs churn; without
bookmarks its last resourceVersion is an hour old when its watch reconnects,
that version has been compacted, and the reconnect costs a full relist. A
BOOKMARK is the server telling us "you are up to date as of version N" so that
a resume starts from N.

Why relist on 410 Gone: the API server keeps a bounded window of history (etcd
compaction, the watch cache's ring). When we ask to resume from a version
outside it, it answers 410 Expired (as an ``ERROR`` event in the stream, or as
the HTTP status). What happened in between is lost for good; only a fresh list
tells us the current state, including what was deleted meanwhile.

Why backoff with jitter: on connection errors, 5xx and 429 we retry with a
capped exponential backoff (0.8 s doubling to 30 s), half of it random. Without
the cap a long outage would leave us asleep long after the server is back;
without the jitter every replica of every controller would hit a recovering API
server in the same instant; without the backoff a dead server would make us
spin. A 429's ``Retry-After`` is honoured as a floor. We never give up: a
webhook whose state silently stopped updating is worse than one that keeps
trying and says so (``/readyz``, ``cache_stale``, the logs, the metrics).

Why a read timeout on an open watch: a TCP connection can die without a FIN
(a NAT table flushed, a node lost). The API server sends a BOOKMARK about every
minute on a watch that asked for them, so a watch that has been silent for
``idle_timeout`` (150 s), or for the staleness threshold if that is shorter, is
presumed dead and reopened; the time since it last spoke counts towards
staleness. Capping the silence at the threshold is what keeps a dead but open
watch (whose kind still looks healthy) from serving data older than it.

Why relist, not resume, after a break (a connection error, a 5xx, a 429, a
410): while the watch is broken the kind counts as stale and decisions that
need it fail open (health.py says why at once). A resumed watch would have to
count as fresh the moment it opens, while the backlog it replays (every change
made during the break) is still being applied, or after a kube-apiserver
restart is answered with a 410 anyway. A list replaces the whole kind in one
step, and only then is the kind fresh again. A watch that simply ends (the
server's ``timeoutSeconds``) is no break: it resumes from where it was.

Why a decision wakes a broken loop: the backoff below protects an API server
that is down, but a decision is a request *from* an API server. When one finds
a stale kind, the loop's wait is cut short (no sooner than ``min_retry`` after
the last attempt, and never before a 429's ``Retry-After``), so after an
outage the guard is current again about one list after the first eviction
instead of up to ``backoff_cap`` later.

Why raw JSON: ``_preload_content=False``, never the client's model classes.
Building ``V1Pod`` objects for 100,000 pods costs seconds of CPU and hundreds of
MB; the records keep a dozen fields.

Why typed decoding (msgspec, ``app/domain/wire.py``) for VMIs, VMIMs and pods:
they are 700,000 objects in a large cluster, and decoding each into a dict only
to read a dozen fields was most of a list's time. Decoding into Structs that
declare just those fields skips the rest while parsing. A page or event that
does not fit the types (a field of an unexpected type) is decoded again with
orjson and read by the lenient ``*_from_object`` path, which turns what is
malformed into empty values: the fast path never changes what a record says,
only how soon. Nodes and the KubeVirt CR, a few hundred objects, only take the
dict path.

Why the collector is left running during a list: the typed decode allocates few
objects the cyclic collector tracks (the Structs are ``gc=False``), so it seldom
runs. Pausing it for the whole process would also pause it for the admission
server answering beside the list, which is measured in bench/watch_bench.py
rather than assumed free.

Threads, not asyncio: the ``kubernetes`` client is synchronous, so each loop is
one daemon thread blocked in a socket read most of the time. The admission
server runs in uvicorn's event loop on another thread and reads the store
without locks (see ``store.py``); parsing holds the GIL, so a relist of a very
large kind adds some latency to concurrent admission requests, never wrong answers.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.backoff import EQUAL, Backoff
from app.cluster.health import CacheHealthBoard, KindStatus
from app.cluster.migrations import MigrationCounter
from app.cluster.store import ClusterStore, Record
from app.domain.kinds import KINDS, KUBEVIRT, NODE, OPTIONAL_KINDS, POD, VMI, VMIM
from app.domain import wire
from app.domain.records import (
    RecordError,
    kubevirt_from_object,
    migration_from_object,
    migration_from_wire,
    node_from_object,
    pod_from_object,
    pod_from_wire,
    vmi_from_object,
    vmi_from_wire,
)
from app.domain.view import CacheHealth
from app.metrics import Metrics

log = logging.getLogger("kubevirt_eviction_guard.cluster")

LAUNCHER_SELECTOR = "kubevirt.io=virt-launcher"
KUBEVIRT_GV = ("kubevirt.io", "v1")


# ---- what each kind is and how to ask for it -------------------------------------------------


def _custom(plural: str) -> Callable[[client.ApiClient, dict], Any]:
    def call(api: client.ApiClient, kw: dict) -> Any:
        return client.CustomObjectsApi(api).list_cluster_custom_object(*KUBEVIRT_GV, plural, **kw)

    return call


def _pods(api: client.ApiClient, kw: dict) -> Any:
    return client.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=LAUNCHER_SELECTOR, **kw)


def _nodes(api: client.ApiClient, kw: dict) -> Any:
    return client.CoreV1Api(api).list_node(**kw)


@dataclass(frozen=True)
class Typed:
    """The fast path of one kind: decoders for a list page and a watch event, and the record builder."""

    page: msgspec.json.Decoder
    event: msgspec.json.Decoder
    build: Callable[[Any], Record]

    @classmethod
    def of(cls, page: type, event: type, build: Callable[[Any], Record]) -> Typed:
        return cls(msgspec.json.Decoder(page), msgspec.json.Decoder(event), build)


@dataclass(frozen=True)
class KindSpec:
    kind: str  # store kind
    what: str  # how humans call the collection
    parse: Callable[[Any], Record]
    call: Callable[[client.ApiClient, dict], Any]  # list or watch, raw response
    if_absent: str = ""  # hint for a 404
    optional: bool = False  # not needed for readiness: absent or forbidden is a quiet, slow retry
    typed: Typed | None = None  # None: dicts only


OPTIONAL_RETRY = 300.0  # seconds between looks at an optional kind that is absent or forbidden

SPECS = {
    VMI: KindSpec(VMI, "kubevirt.io/v1 virtualmachineinstances", vmi_from_object, _custom("virtualmachineinstances"),
                  "is KubeVirt installed?", typed=Typed.of(wire.VMIList, wire.VMIEvent, vmi_from_wire)),
    VMIM: KindSpec(VMIM, "kubevirt.io/v1 virtualmachineinstancemigrations", migration_from_object,
                   _custom("virtualmachineinstancemigrations"), "is KubeVirt installed?",
                   typed=Typed.of(wire.VMIMList, wire.VMIMEvent, migration_from_wire)),
    POD: KindSpec(POD, f"v1 pods ({LAUNCHER_SELECTOR})", pod_from_object, _pods,
                  typed=Typed.of(wire.PodList, wire.PodEvent, pod_from_wire)),
    NODE: KindSpec(NODE, "v1 nodes", node_from_object, _nodes),
    KUBEVIRT: KindSpec(KUBEVIRT, "kubevirt.io/v1 kubevirts", kubevirt_from_object, _custom("kubevirts"),
                       "is KubeVirt installed?", optional=True),
}


@dataclass(frozen=True)
class LoopOptions:
    page_size: int = 500
    watch_timeout: int = 300  # seconds asked of the server; jittered down by up to 20%
    idle_timeout: float = 150.0  # silence after which an open watch is presumed dead
    connect_timeout: float = 10.0
    list_timeout: float = 60.0  # per page
    backoff_base: float = 0.8
    backoff_cap: float = 30.0
    quick_end: float = 1.0  # a watch that ends this fast without news is backed off, not retried at once
    min_retry: float = 1.0  # a decision may cut a backoff short, but no retry comes sooner than this after the last


# ---- outcomes of one list+watch round -------------------------------------------------------------


class _Expired(Exception):
    """410: our resourceVersion (or continue token) is older than the server's history."""


class _ErrorEvent(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass(frozen=True)
class Outcome:
    cause: str  # label of watch_restarts_total
    problem: str = ""  # non-empty: the kind cannot get data; why, for /readyz and logs
    relist: bool = False
    retry_after: float = 0.0
    since: float | None = None  # when data last arrived, if earlier than now
    level: int = logging.WARNING
    detail: str = ""  # the server's own words, for the log


def _status_message(body: Any) -> str:
    try:
        data = orjson.loads(body) if isinstance(body, (str, bytes)) else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data["message"]
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    return text.strip()[:200]


def _retry_after(headers: Any) -> float:
    try:
        return max(0.0, float((headers or {}).get("Retry-After")))
    except (TypeError, ValueError):
        return 0.0


_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


def _rv_of(obj: Any) -> str:
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            rv = meta.get("resourceVersion")
            if isinstance(rv, str) and rv:
                return rv
    return ""


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


# ---- one kind's loop --------------------------------------------------------------------------------


class Informer:
    """The list+watch loop of one kind, in its own daemon thread."""

    def __init__(
        self,
        spec: KindSpec,
        api: client.ApiClient,
        store: ClusterStore,
        status: KindStatus,
        metrics: Metrics | None = None,
        options: LoopOptions = LoopOptions(),
        list_gate: threading.Semaphore | None = None,
        stale_after: Callable[[], float] = lambda: math.inf,
    ) -> None:
        self.spec, self.api, self.store, self.status = spec, api, store, status
        # one (re)list at a time across kinds: parsing holds the GIL anyway, and interleaving four
        # lists' temporary objects fragments the heap (tens of MB of RSS never given back)
        self.list_gate = list_gate if list_gate is not None else threading.Semaphore(1)
        self.metrics = metrics
        self.opts = options
        self.stale_after = stale_after  # the health board's threshold, read when needed (settings may change it)
        self.backoff = Backoff(options.backoff_base, options.backoff_cap, EQUAL)
        self.failures = 0  # consecutive; the next delay grows with it
        self.resource_version: str | None = None  # None: must (re)list
        self.last_heard = 0.0  # monotonic time of the last byte from a watch
        self._suspect_since: float | None = None  # wall time the last idle watch went quiet
        self._stop = threading.Event()
        self._wake = threading.Event()
        status.wake = self.wake
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self._last_problem = ""
        self._expired_in_a_row = 0
        self._streaming = False  # a watch response is open (a read timeout then means silence, not failure)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.spec.kind}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop to end and unblock its socket read (urllib3's ``shutdown`` exists for this)."""
        self._stop.set()
        self._wake.set()
        resp = self._response
        if resp is not None:
            try:
                getattr(resp, "shutdown", resp.close)()
            except Exception:  # already closed or half torn down: the flag is enough
                pass

    def wake(self) -> None:
        """Retry now if backing off (a decision needs this kind; see the module docstring)."""
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self.resource_version is None:
                    with self.list_gate:
                        self.resource_version = self._list()
                    self._expired_in_a_row = 0
                news = self._watch()
                outcome = self._clean_end(started, news)
            except Exception as exc:  # every failure is classified; none ends the loop
                if self._stop.is_set():
                    break
                outcome = self._classify(exc)
            if self._stop.is_set():
                break
            self._after(outcome)

    # ---- list ---------------------------------------------------------------------------------

    def _list(self) -> str:
        began = time.monotonic()
        self._streaming = False
        records: list[Record] = []
        token, pages, skipped = "", 0, 0
        rv = ""
        while True:
            kw: dict[str, Any] = {"limit": self.opts.page_size, "_preload_content": False,
                                  "_request_timeout": (self.opts.connect_timeout, self.opts.list_timeout)}
            if token:
                kw["_continue"] = token
            resp = self.spec.call(self.api, kw)
            self._response = resp
            try:
                data = resp.data
            finally:
                self._response = None
                resp.release_conn()
            pages += 1
            page_rv, token, page_skipped = self._page(data, records)
            rv = page_rv or rv
            skipped += page_skipped
            if not token or self._stop.is_set():
                break
        if self._stop.is_set():
            return rv
        self.store.replace(self.spec.kind, records)
        self.status.listed()
        if self.metrics is not None:
            self.metrics.cache_synced.labels(self.spec.kind).set(1)
        log.info("listed", extra={"kind": self.spec.kind, "objects": len(records), "skipped": skipped, "pages": pages,
                                  "resource_version": rv, "seconds": round(time.monotonic() - began, 3)})
        self._recovered()
        return rv

    def _page(self, data: bytes, records: list[Record]) -> tuple[str, str, int]:
        """Append one list page's records; returns its resourceVersion, continue token and how many were skipped."""
        typed = self.spec.typed
        if typed is not None:
            try:
                page = typed.page.decode(data)
                built = [typed.build(item) for item in page.items]
            except (*wire.NotTheShape, RecordError):
                pass  # the lenient path below reads the same bytes, and names what it skips
            else:
                records += built
                return page.metadata.resourceVersion, page.metadata.continue_, 0
        doc = orjson.loads(data)
        skipped = 0
        parse = self.spec.parse
        for obj in doc.get("items") or ():
            try:
                records.append(parse(obj))
            except RecordError as e:
                skipped += 1
                self._malformed("list item", str(e), obj)
        meta = doc.get("metadata") or {}
        return meta.get("resourceVersion") or "", meta.get("continue") or "", skipped

    # ---- watch ---------------------------------------------------------------------------------

    def _watch(self) -> int:
        """Stream events until the server ends the watch. Returns how many events (bookmarks included) arrived."""
        timeout = max(1, int(self.opts.watch_timeout * (0.8 + 0.2 * random.random())))
        self._streaming = False
        resp = self.spec.call(self.api, {
            "watch": True,
            "resource_version": self.resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
            "_preload_content": False,
            "_request_timeout": (self.opts.connect_timeout,
                                 min(self.opts.idle_timeout, timeout + 30, self.stale_after())),
        })
        self._response = resp
        if self._stop.is_set():  # stop() ran before there was a response to shut down
            resp.release_conn()
            return 0
        self._streaming = True
        self.last_heard = time.monotonic()
        self._suspect_since = None  # the kind is not made healthy here: after a break only a list does that
        self._recovered()
        news = 0
        pending: list[bytes] = []
        try:
            for chunk in resp.stream(None, decode_content=True):
                self.last_heard = time.monotonic()
                if self._stop.is_set():
                    break
                if b"\n" not in chunk:
                    pending.append(chunk)
                    continue
                if pending:
                    pending.append(chunk)
                    chunk = b"".join(pending)
                    pending = []
                lines = chunk.split(b"\n")
                tail = lines.pop()
                if tail:
                    pending.append(tail)
                for line in lines:
                    if line:
                        news += 1
                        self._event(line)
        finally:
            self._response = None
            resp.release_conn()
        return news

    def _event(self, line: bytes) -> None:
        typed = self.spec.typed
        if typed is not None:
            try:
                event = typed.event.decode(line)
                if event.type in _CHANGES and event.object is not None:
                    record = typed.build(event.object)
                    return self._apply(event.type, record, event.object.metadata.resourceVersion)
            except wire.NotTheShape:
                pass  # read again below, leniently
            except RecordError:
                pass  # the lenient path below says why and moves past its version
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            return self._malformed("watch event", f"not JSON: {e}", line)
        if not isinstance(event, dict):
            return self._malformed("watch event", "not an object", line)
        kind, obj = event.get("type"), event.get("object")
        if kind == "BOOKMARK":
            rv = _rv_of(obj)
            if rv:
                self.resource_version = rv
            return
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            if code == 410:
                raise _Expired(_status_message(orjson.dumps(obj)))
            raise _ErrorEvent(code if isinstance(code, int) else 0, _status_message(orjson.dumps(obj)))
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return self._malformed("watch event", f"unknown type {kind!r}", line)
        rv = _rv_of(obj)
        try:
            record = self.spec.parse(obj)
        except RecordError as e:
            self._malformed("watch event", f"{kind}: {e}", line)
            if rv:  # even a skipped object moves us past its version
                self.resource_version = rv
        else:
            self._apply(kind, record, rv)

    def _apply(self, kind: str, record: Record, rv: str) -> None:
        if kind == "DELETED":
            self.store.delete(self.spec.kind, record.key)
        else:
            self.store.upsert(record)
        if rv:
            self.resource_version = rv

    def _malformed(self, where: str, why: str, raw: Any) -> None:
        preview = raw if isinstance(raw, (bytes, str)) else orjson.dumps(raw, default=str)
        if isinstance(preview, bytes):
            preview = preview[:300].decode("utf-8", "replace")
        log.warning("skipping malformed object", extra={"kind": self.spec.kind, "where": where, "why": why,
                                                        "object": preview[:300]})

    # ---- what to do next ----------------------------------------------------------------------

    def _clean_end(self, started: float, news: int) -> Outcome:
        if news == 0 and time.monotonic() - started < self.opts.quick_end:
            # ended at once with nothing to say: do not spin on a server that does this
            return Outcome("closed_early", problem="", level=logging.DEBUG)
        return Outcome("timeout", level=logging.DEBUG)

    def _classify(self, exc: BaseException) -> Outcome:
        what = self.spec.what
        if isinstance(exc, _Expired):
            return Outcome("expired", relist=True, level=logging.INFO, detail=str(exc))
        if isinstance(exc, _ErrorEvent):
            return Outcome("error_event", problem=f"watch ERROR event {exc.code}: {exc.message}")
        if isinstance(exc, ApiException):
            code, message = exc.status or 0, _status_message(exc.body)
            if code == 410:
                return Outcome("expired", relist=True, level=logging.INFO, detail=f"410: {message}")
            if code == 429:
                return Outcome("throttled", problem=f"429 too many requests: {message}",
                               retry_after=_retry_after(exc.headers))
            if code >= 500:
                return Outcome("server_error", problem=f"{code} from the API server: {message}")
            if code in (403, 404) and self.spec.optional:
                return Outcome("not_found" if code == 404 else "forbidden", retry_after=OPTIONAL_RETRY,
                               problem=f"{code}: cannot read {what} (optional: the rules that read it fail open)",
                               level=logging.INFO)
            if code == 404:
                hint = f": {self.spec.if_absent}" if self.spec.if_absent else ""
                return Outcome("not_found", problem=f"404: {what} not found{hint}", level=logging.ERROR)
            if code == 403:
                # also what a kube-apiserver answers for a second or so after it started, before its RBAC is loaded
                return Outcome("forbidden", problem=f"403 forbidden: list/watch of {what} refused (RBAC, or an API "
                               f"server that has just started and not yet loaded it): {message}", level=logging.ERROR)
            if code == 401:
                return Outcome("unauthorized", problem="401 unauthorized: the API server rejected our credentials",
                               level=logging.ERROR)
            if code == 0:
                return Outcome("connection", problem=f"cannot reach the API server: {exc.reason}")
            return Outcome(f"http_{code}", problem=f"{code} from the API server: {message}", level=logging.ERROR)
        if isinstance(exc, urllib3.exceptions.ReadTimeoutError) and self._streaming:
            # an open watch went silent for idle_timeout: reopen it at once; staleness counts from its last word
            quiet = time.monotonic() - self.last_heard
            self._suspect_since = self.status.clock() - quiet
            return Outcome("idle", level=logging.INFO)
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
            return Outcome("connection", problem=f"cannot reach the API server: {_short(exc)}")
        if isinstance(exc, (orjson.JSONDecodeError, AttributeError, TypeError)):
            return Outcome("bad_response", problem=f"unreadable response for {what}: {_short(exc)}")
        log.exception("watch loop failed unexpectedly; retrying", extra={"kind": self.spec.kind})
        return Outcome("internal", problem=f"internal error: {_short(exc)}", level=logging.ERROR)

    def _after(self, outcome: Outcome) -> None:
        kind = self.spec.kind
        if self.metrics is not None:
            self.metrics.watch_restarts.labels(kind, outcome.cause).inc()
        if outcome.relist:
            self.resource_version = None
            self._expired_in_a_row += 1
            self.status.broken(f"resourceVersion expired ({outcome.detail}): events were lost; relisting")
            log.info("resourceVersion expired; relisting", extra={"kind": kind, "why": outcome.detail})
            if self._expired_in_a_row <= 1:
                return  # relist at once; a second 410 in a row backs off like any failure
        delay = 0.0
        if outcome.problem:
            since = self._suspect_since if outcome.cause != "idle" else None
            self.status.broken(outcome.problem, since)
            self.resource_version = None  # a break may have lost events: relist, never resume
            self._report(outcome)
            delay = max(self._next_delay(), outcome.retry_after)
        elif outcome.cause in ("closed_early",) or outcome.relist:
            delay = self._next_delay()
        else:
            self.failures = 0
        if delay:
            log.debug("retrying", extra={"kind": kind, "cause": outcome.cause, "delay_s": round(delay, 2)})
            self._back_off(delay, floor=max(min(delay, self.opts.min_retry), outcome.retry_after))

    def _back_off(self, delay: float, floor: float) -> None:
        """Wait ``delay``, or only ``floor`` if ``wake()`` is called meanwhile."""
        self._wake.clear()
        if self._stop.wait(floor) or delay <= floor:
            return
        if self._wake.wait(delay - floor):
            log.debug("woken by a decision: retrying now", extra={"kind": self.spec.kind})

    def _next_delay(self) -> float:
        self.failures += 1
        return self.backoff.delay(self.failures)

    def _report(self, outcome: Outcome) -> None:
        """One log line per distinct problem, not one per retry."""
        if outcome.problem == self._last_problem:
            log.debug(outcome.problem, extra={"kind": self.spec.kind, "cause": outcome.cause})
            return
        self._last_problem = outcome.problem
        log.log(outcome.level, f"{self.spec.kind} watch: {outcome.problem}; retrying with backoff",
                extra={"kind": self.spec.kind, "cause": outcome.cause, "retry_after_s": outcome.retry_after or None})

    def _recovered(self) -> None:
        if self._last_problem:
            log.info(f"{self.spec.kind} watch recovered", extra={"kind": self.spec.kind, "was": self._last_problem})
            self._last_problem = ""
        self.failures = 0


# ---- all kinds together ----------------------------------------------------------------------------


class ClusterWatch:
    """The store, one ``Informer`` per kind, and the health board ``GuardContext`` reads.

    ``health`` and ``readiness_detail`` plug into ``GuardContext``; the gauges
    ``cache_objects`` read the store at scrape time (no cost per event).
    """

    def __init__(
        self,
        api: client.ApiClient,
        store: ClusterStore | None = None,
        metrics: Metrics | None = None,
        *,
        stale_after: float = 120.0,
        kinds: Iterable[str] = KINDS,
        optional: Iterable[str] = OPTIONAL_KINDS,
        options: LoopOptions = LoopOptions(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store if store is not None else ClusterStore()
        self.metrics = metrics
        statuses = [KindStatus(k, clock) for k in kinds]
        self.board = CacheHealthBoard(statuses, stale_after)
        self.optional = {k: KindStatus(k, clock) for k in optional}  # off the board: never a readiness condition
        gate = threading.Semaphore(1)
        self.informers = [Informer(SPECS[s.kind], api, self.store, s, metrics, options, gate,
                                   stale_after=lambda: self.board.stale_after)
                          for s in [*statuses, *self.optional.values()]]
        if metrics is not None:
            self.store.on_migration_finished = MigrationCounter(metrics)
            for s in statuses:
                metrics.cache_synced.labels(s.kind).set(0)
                metrics.cache_objects.labels(s.kind).set_function(lambda k=s.kind: self.store.counts()[k])

    def start(self) -> ClusterWatch:
        for inf in self.informers:
            inf.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        for inf in self.informers:
            inf.stop()
        deadline = time.monotonic() + timeout
        for inf in self.informers:
            inf.join(max(0.0, deadline - time.monotonic()))

    def health(self, now: float | None = None) -> CacheHealth:
        return self.board.health(now)

    def readiness_detail(self) -> dict[str, str]:
        return self.board.readiness_detail()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.board.health().not_synced:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def informer(self, kind: str) -> Informer:
        return next(i for i in self.informers if i.spec.kind == kind)
