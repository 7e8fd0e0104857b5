"""``EvictionBlocked`` and ``EvictionAllowed`` Events on the VMI, rate-limited and aggregated.

Every denial is an Event on the VMI (type Warning, reason ``EvictionBlocked``)
saying what was decided and who asked, because ``kubectl describe vmi`` is
where an admin looks when a VM did not move. Every allowed descheduler
eviction of a VM's pod is a Normal ``EvictionAllowed`` Event saying who asked,
as which user, the descheduler's ``reason`` (profile and strategy) and the
node: the answer to "why did my VM move?" that KubeVirt's own
``system-initiated migration`` Events do not give. It is written only once the
watch shows the migration the eviction started (``ConfirmJob``): a review sent
by anyone who can reach the port, for an eviction that never happened, moves
no VM and so leaves no Event. What the request says (requester, user, reason,
pod name) is escaped and cut (``text.printable``) on its way into a message.

A descheduler loop asks about the same VM every few minutes, and a drain
retries every few seconds. One Event object per (VMI, decision reason) series
absorbs them: the first denial creates it, later ones bump its ``count`` and
``lastTimestamp`` (and refresh the message), as client-go's EventCorrelator
does, and at most one API write per series per ``interval`` (default one
minute) reaches the API server. Denials in between are counted in memory and
written by the next flush, which is scheduled on the queue for the moment the
interval ends, so the count is right even when the loop stops.

API choice: core/v1 Events with ``count``/``firstTimestamp``/``lastTimestamp``.
``kubectl describe`` and ``kubectl get events`` of every version print these
fields ("x5 over 10m"), the API server validates core/v1 Events leniently, and
the aggregation is one merge patch of three fields. events.k8s.io/v1 would need
the ``series`` protocol (a series only from the second occurrence, with its own
heartbeat rules) for the same result on the same storage.

Writes are bounded globally too: forged reviews of thousands of distinct VMs are thousands of series, each
entitled to its first write at once. At most ``budget`` Event writes per second leave (a token bucket holding
``budget_burst``); a flush past it drops its occurrences and counts them
(``side_effects_dropped_total{kind="event"}``, outcome ``over_budget``). Nothing else is dropped for it: the
annotation and history jobs have their own lane in the queue.

State is bounded: at most ``max_series`` series are remembered (least recently
used evicted); a forgotten series simply starts a new Event. If the Event
expired (the API server's event TTL, 1h by default), the patch gets a 404 and
the flush creates a new one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.domain.records import VMIRecord
from app.domain.view import ClusterView
from app.effects.kubeapi import EffectsApi, NotFound
from app.effects.queue import EffectQueue
from app.effects.text import MAX_MESSAGE, printable
from app.metrics import Metrics
from app.policy.model import Decision, Review
from app.ratelimit import TokenBucket
from app.timefmt import format_timestamp

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "event"
EVENT_REASON = "EvictionBlocked"
ALLOWED_EVENT_REASON = "EvictionAllowed"
COMPONENT = "kubevirt-eviction-guard"
CONFIRM_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0)  # seconds between looks for the migration an allowed eviction starts
CONFIRM_SKEW = 5.0  # seconds a VMIM's creationTimestamp (the API server's clock) may read earlier than ours
DEFAULT_INTERVAL = 60.0
DEFAULT_MAX_SERIES = 4096
DEFAULT_BUDGET = 10.0  # Event writes per second, all series together
DEFAULT_BUDGET_BURST = 100


def requester_text(review: Review) -> str:
    """Who asked, as the request says: user, requested-by, and the descheduler's reason (each escaped and cut
    to ``text.MAX_FIELD`` characters: ``text.printable``)."""
    ev = review.eviction
    requested_by, username = printable(ev.requested_by), printable(ev.username)
    parts = []
    if requested_by:
        parts.append(requested_by)
    if username and username != requested_by:
        parts.append(f"as {username}" if parts else username)
    who = " ".join(parts) or "unknown requester"
    if ev.eviction_reason:
        who += f" ({printable(ev.eviction_reason)})"
    return who


def event_message(review: Review, decision: Decision) -> str:
    pod = printable(review.eviction.name)
    if decision.allowed:
        node = decision.pod.node if decision.pod is not None and decision.pod.node else "-"
        text = (f"Eviction of pod {pod} on node {node} allowed, the VM is live-migrating: "
                f"{decision.message}; requested by {requester_text(review)}")
    else:
        text = f"Eviction of pod {pod} denied ({decision.reason}): {decision.message}; requested by {requester_text(review)}"
    return printable(text, MAX_MESSAGE)


def migration_followed(view: ClusterView, vmi: VMIRecord, since: float) -> bool:
    """What the watch shows after an allowed eviction of ``vmi``'s pod at ``since``: KubeVirt marked the VMI
    for evacuation, or a migration of it began (a VMIM created, a migration started) since then."""
    now = view.vmi(vmi.namespace, vmi.name)
    if now is None or (vmi.uid and now.uid != vmi.uid):
        return False
    if now.evacuation_node:
        return True
    after = since - CONFIRM_SKEW
    if now.migration is not None and now.migration.start is not None and now.migration.start >= after:
        return True
    return any(m.created is not None and m.created >= after for m in view.migrations(vmi.namespace, vmi.name))


@dataclass
class Series:
    """One Event object's worth of decisions: same VMI, same decision reason."""

    namespace: str
    vmi_name: str
    vmi_uid: str
    reason: str  # decision reason label: the rate-limit key, not the Event's reason
    allowed: bool = False  # EvictionAllowed (Normal) rather than EvictionBlocked (Warning)
    message: str = ""
    first: float = 0.0  # wall time of the first occurrence not yet in an Event
    last: float = 0.0  # wall time of the latest occurrence
    pending: int = 0  # occurrences not written yet
    written: int = 0  # count the Event in the API server has
    event_name: str = ""  # "" until created
    last_write: float | None = None  # monotonic time of the last write attempt


class EventRecorder:
    def __init__(
        self,
        api: EffectsApi,
        queue: EffectQueue,
        metrics: Metrics,
        interval: float = DEFAULT_INTERVAL,
        max_series: int = DEFAULT_MAX_SERIES,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        instance: str = "",
        budget: float = DEFAULT_BUDGET,
        budget_burst: float = DEFAULT_BUDGET_BURST,
    ) -> None:
        self.api = api
        self.budget = TokenBucket(budget, budget_burst, monotonic)
        self.queue = queue
        self.metrics = metrics
        self.interval = interval
        self.max_series = max_series
        self.clock = clock
        self.monotonic = monotonic
        self.instance = instance or os.environ.get("HOSTNAME", "") or COMPONENT
        self._series: OrderedDict[tuple[str, str, str], Series] = OrderedDict()
        self._confirming: dict[tuple[str, str], ConfirmJob] = {}  # allowed evictions waiting for their migration
        self._lock = threading.Lock()

    # ---- request path -------------------------------------------------------------

    def record(self, review: Review, decision: Decision, times: int = 1) -> None:
        """Count one decision and make sure a flush is queued; never blocks on I/O."""
        vmi = decision.vmi
        if vmi is None:
            return
        key = (vmi.namespace, vmi.name, decision.reason)
        now = self.clock()
        with self._lock:
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = Series(vmi.namespace, vmi.name, vmi.uid, decision.reason, decision.allowed)
                while len(self._series) > self.max_series:
                    self._series.popitem(last=False)
            else:
                self._series.move_to_end(key)
            if s.pending == 0:
                s.first = now
            s.pending += times
            s.last = now
            s.message = event_message(review, decision)
            s.vmi_uid = vmi.uid or s.vmi_uid
            delay = 0.0 if s.last_write is None else max(0.0, s.last_write + self.interval - self.monotonic())
        queued = self.queue.submit(FlushJob(self, key), delay)  # False: a flush for the series is waiting
        if delay > 0 or not queued:
            self.metrics.events_rate_limited_by(decision.reason).inc()

    def record_allowed(self, view: ClusterView, review: Review, decision: Decision) -> None:
        """An allowed eviction becomes an Event only once the watch shows the migration it started: anyone
        who reaches the webhook can send a review, but only a real eviction makes KubeVirt move the VM."""
        vmi = decision.vmi
        if vmi is None:
            return
        key = (vmi.namespace, vmi.name)
        with self._lock:
            job = self._confirming.get(key)
            if job is not None and self.clock() - job.since < 2 * sum(CONFIRM_DELAYS):  # (else: lost to a full queue)
                # one look-out per VMI, however many reviews name it: it counts them
                job.review, job.decision, job.occurrences = review, decision, job.occurrences + 1
                return
            job = self._confirming[key] = ConfirmJob(self, view, review, decision, self.clock())
        self.queue.submit(job, CONFIRM_DELAYS[0])

    def settle(self, job: ConfirmJob, found: bool) -> None:
        """The look-out ``job`` ended: the migration showed (``found``) or it gave up."""
        with self._lock:
            self._confirming.pop(job.key[1:], None)
            review, decision, times = job.review, job.decision, job.occurrences
        if found:
            self.record(review, decision, times)

    # ---- worker -------------------------------------------------------------------

    def flush(self, key: tuple[str, str, str]) -> str:
        with self._lock:
            s = self._series.get(key)
            if s is None or s.pending == 0:
                return "not_needed"
            taken, first, last, message = s.pending, s.first, s.last, s.message
            name, written, previous_write = s.event_name, s.written, s.last_write
            s.pending = 0
            s.last_write = self.monotonic()  # the rate limit runs from the attempt
        if not self.budget.take():
            self.metrics.side_effects_dropped_by(KIND).inc()
            return "over_budget"
        try:
            name, written = self._write(s, name, written, taken, first, last, message)
        except Exception:
            with self._lock:  # nothing was written: put the occurrences back for the retry
                s.pending += taken
                s.first = first  # older than any occurrence recorded meanwhile
                s.last_write = previous_write
            raise
        with self._lock:
            s.event_name, s.written = name, written
        return "applied"

    def _write(self, s: Series, name: str, written: int, taken: int, first: float, last: float,
               message: str) -> tuple[str, int]:
        if name:
            patch = {"count": written + taken, "lastTimestamp": format_timestamp(last), "message": message}
            try:
                self.api.patch_event(s.namespace, name, patch)
                return name, written + taken
            except NotFound:
                pass  # expired (event TTL): start a new Event
        name = f"{s.vmi_name}.{time.time_ns():x}"
        self.api.create_event(s.namespace, self._event(s, name, taken, first, last, message))
        return name, taken

    def _event(self, s: Series, name: str, count: int, first: float, last: float, message: str) -> dict[str, Any]:
        return vmi_event(s.namespace, s.vmi_name, s.vmi_uid, ALLOWED_EVENT_REASON if s.allowed else EVENT_REASON,
                         message, first, self.instance, kind="Normal" if s.allowed else "Warning", count=count,
                         last=last, event_name=name)


class FlushJob:
    kind = KIND

    def __init__(self, recorder: EventRecorder, key: tuple[str, str, str]) -> None:
        self.recorder = recorder
        self.key = (KIND, *key)
        self._series_key = key

    def run(self) -> str:
        return self.recorder.flush(self._series_key)



class ConfirmJob:
    """Looks for the migration an allowed eviction started (``migration_followed``), at growing intervals for
    about half a minute; found, the evictions that named the VMI meanwhile are recorded like denials (one
    aggregated Event per VMI). At most one per VMI is waiting, so forged reviews cannot crowd the queue."""

    kind = KIND

    def __init__(self, recorder: EventRecorder, view: ClusterView, review: Review, decision: Decision,
                 since: float) -> None:
        self.recorder, self.view, self.review, self.decision = recorder, view, review, decision
        self.since, self.attempt, self.occurrences = since, 0, 1
        vmi = decision.vmi
        assert vmi is not None
        self.vmi = vmi
        self.key = ("event-confirm", vmi.namespace, vmi.name)

    def run(self) -> str:
        if migration_followed(self.view, self.vmi, self.since):
            self.recorder.settle(self, True)
            return "confirmed"
        self.attempt += 1
        if self.attempt >= len(CONFIRM_DELAYS):
            self.recorder.settle(self, False)
            log.info("allowed eviction not followed by a migration; no EvictionAllowed Event",
                     extra={"namespace": self.vmi.namespace, "vmi": self.vmi.name, "uid": printable(self.review.uid)})
            return "unconfirmed"
        if not self.recorder.queue.submit(self, CONFIRM_DELAYS[self.attempt]):
            self.recorder.settle(self, False)  # cannot happen: the key is ours alone
        return "waiting"


def vmi_event(namespace: str, name: str, uid: str, reason: str, message: str, now: float, instance: str,
              kind: str = "Warning", *, count: int = 1, last: float | None = None,
              event_name: str | None = None) -> dict[str, Any]:
    """A core/v1 Event on a VMI: every Event the guard writes (a series' aggregate, or a one-off from the
    canceller, the held-node and the failing-evacuation watches) has this body."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name or f"{name}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                           "namespace": namespace, "name": name, "uid": uid},
        "reason": reason,
        "message": message,
        "type": kind,
        "count": count,
        "firstTimestamp": format_timestamp(now),
        "lastTimestamp": format_timestamp(now if last is None else last),
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
    }


class VMIEventJob:
    """Writes one one-off Event (``vmi_event``); ``key_kind`` keys it in the queue beside its writer's other jobs."""

    kind = "event"

    def __init__(self, api: EffectsApi, namespace: str, event: dict[str, Any], key_kind: str) -> None:
        self.api, self.namespace, self.event = api, namespace, event
        obj = event["involvedObject"]
        self.key = (key_kind, obj["namespace"], obj["name"])

    def run(self) -> str:
        try:
            self.api.create_event(self.namespace, self.event)
        except NotFound:
            return "not_needed"  # the namespace is gone
        return "applied"
