"""What a decision causes besides the answer: a log line, an Event, the annotation;
and, apart from decisions, the VMIs' migration history (``history.py``), the cause of each evacuation on its
VMIM (``cause.py``) and the removal of KubeVirt's stale ``eviction-source`` annotation (``source.py``).

Denials get an ``EvictionBlocked`` Event; allowed descheduler evictions of a VM's
pod (reason ``allowed``) an ``EvictionAllowed`` one, once the watch shows the
migration they started (``events.py``).

``Effects.on_decision`` is the admission server's hook. It runs on the request
path, so it only logs and queues: the API writes happen on the background
queue (``queue.py``), re-checked against the store when they run, and neither
their failures nor their latency can reach the admission answer.

Dry-run evictions get the log line and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from app.backoff import Backoff
from app.domain.view import ClusterView
from app.effects.annotate import AnnotateJob, wanted
from app.effects.cancel import StuckCanceller
from app.effects.cause import CauseRecorder
from app.effects.decision_log import log_decision
from app.effects.failing import FailingEvacuationWatch
from app.effects.events import DEFAULT_INTERVAL, EventRecorder
from app.effects.held import HeldNodeWatch
from app.effects.history import HistoryRecorder, HistoryView
from app.effects.kubeapi import EffectsApi, KubeEffectsApi, LogOnlyApi
from app.effects.queue import EffectQueue
from app.effects.source import StaleSourceCleaner
from app.metrics import Metrics
from app.policy.model import DESCHEDULER_REQUESTER, Decision, PolicySettings, Reason, Review

# Steering's refusals choose which VM the descheduler moves; they block nothing about the VM refused. An Event on every
# VMI of a hot node, each cycle, would read as trouble with each, and cost an API write per refusal: they are in the
# decision log and decisions_total only (docs/steering.md, "What a refusal costs").
CHOICES = frozenset({Reason.BETTER_CANDIDATE, Reason.NO_GAIN})

log = logging.getLogger("kubevirt_eviction_guard.effects")

__all__ = ["Effects", "EffectsApi", "KubeEffectsApi", "LogOnlyApi", "log_decision"]


class Effects:
    def __init__(
        self,
        view: ClusterView,
        api: EffectsApi,
        metrics: Metrics,
        *,
        queue_capacity: int = 1000,
        max_attempts: int = 5,
        backoff: Backoff = Backoff(),
        event_interval: float = DEFAULT_INTERVAL,
        annotate: bool = True,
        events: bool = True,
        clock: Callable[[], float] = time.time,
        descheduler_users: frozenset[str] = frozenset(),
    ) -> None:
        self.view = view
        self.api = api
        self.queue = EffectQueue(metrics, capacity=queue_capacity, max_attempts=max_attempts, backoff=backoff)
        self.events = EventRecorder(api, self.queue, metrics, interval=event_interval, clock=clock) if events else None
        self.annotate = annotate
        self.descheduler_users = descheduler_users  # the policy setting: users counted as the descheduler
        self.clock = clock
        self.history: HistoryRecorder | None = None
        self.canceller: StuckCanceller | None = None
        self.held: HeldNodeWatch | None = None
        self.sources: StaleSourceCleaner | None = None
        self.causes: CauseRecorder | None = None
        self.failing: FailingEvacuationWatch | None = None
        self.metrics = metrics

    def record_history(self, store: HistoryView, settings: PolicySettings, ready: Callable[[], bool],
                       interval: float | None = None) -> HistoryRecorder:
        """Keep the VMIs' history annotation (live mode): ``store`` must offer ``add_listener``."""
        kw = {"interval": interval} if interval is not None else {}
        self.history = HistoryRecorder(store, self.api, self.queue, settings, clock=self.clock, ready=ready,
                                       passes=self.metrics.background_passes.labels("history_reconcile"), **kw)
        store.add_listener(self.history.on_change)  # type: ignore[attr-defined]
        return self.history

    def record_causes(self, store: HistoryView) -> CauseRecorder:
        """Record who caused each evacuation on its VMIM while it runs (live mode; ``cause.py``): ``store`` must
        offer ``add_listener``."""
        self.causes = CauseRecorder(store, self.api, self.queue)
        store.add_listener(self.causes.on_change)  # type: ignore[attr-defined]
        return self.causes

    def clean_stale_sources(self, store: HistoryView) -> StaleSourceCleaner:
        """Remove ``kubevirt.io/eviction-source`` from VMIs it no longer speaks for (live mode; ``source.py``):
        ``store`` must offer ``add_listener``."""
        self.sources = StaleSourceCleaner(store, self.api, self.queue)
        store.add_listener(self.sources.on_change)  # type: ignore[attr-defined]
        return self.sources

    def cancel_stuck_evacuations(self, store, settings: PolicySettings, ready: Callable[[], bool],
                                 interval: float | None = None, probed: bool = True) -> StuckCanceller:
        """Cancel stuck descheduler evacuations (``--cancel-stuck-evacuations``, live mode), once the API
        server says KubeVirt serves evacuate/cancel and the guard may call it (``probed``)."""
        kw = {"interval": interval} if interval is not None else {}
        self.canceller = StuckCanceller(store, self.api, self.queue, self.metrics, settings, clock=self.clock,
                                        ready=ready, probed=probed, **kw)
        return self.canceller

    def watch_held_nodes(self, store, settings: PolicySettings, ready: Callable[[], bool],
                         interval: float | None = None) -> HeldNodeWatch:
        """Make nodes held longer than ``evacuationStaleAfter`` visible (gauge, Events); count unmovable VMs."""
        kw = {"interval": interval} if interval is not None else {}
        self.held = HeldNodeWatch(store, self.api, self.queue, self.metrics, settings, clock=self.clock,
                                  ready=ready, **kw)
        return self.held

    def watch_failing_evacuations(self, store, settings: PolicySettings, ready: Callable[[], bool],
                                  interval: float | None = None) -> FailingEvacuationWatch:
        """Make evacuations that keep failing visible, whatever their cause (gauge, Events); cancels nothing."""
        kw = {"interval": interval} if interval is not None else {}
        self.failing = FailingEvacuationWatch(store, self.api, self.queue, self.metrics, settings, clock=self.clock,
                                              ready=ready, **kw)
        return self.failing

    def start(self) -> Effects:
        self.queue.start()
        if self.history is not None:
            self.history.start()
        if self.canceller is not None:
            self.canceller.start()
        if self.held is not None:
            self.held.start()
        if self.failing is not None:
            self.failing.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self.failing is not None:
            self.failing.stop(timeout)
        if self.held is not None:
            self.held.stop(timeout)
        if self.canceller is not None:
            self.canceller.stop(timeout)
        if self.history is not None:
            self.history.stop(timeout)
        self.queue.stop(timeout)

    def on_decision(self, review: Review, decision: Decision) -> None:
        """The server's hook: log, then queue the side effects (never wait for them)."""
        log_decision(review, decision)
        if decision.dry_run or review.eviction.dry_run:
            return
        if decision.allowed:
            if self.events is not None and decision.reason == Reason.ALLOWED and self._from_descheduler(review):
                self.events.record_allowed(self.view, review, decision)  # once the watch shows the migration
            return
        if self.events is not None and decision.reason not in CHOICES:
            self.events.record(review, decision)
        if self.annotate and wanted(decision):
            ev = review.eviction
            self.queue.submit(AnnotateJob(self.view, self.api, ev.namespace, ev.name))

    def _from_descheduler(self, review: Review) -> bool:
        ev = review.eviction
        return ev.requested_by == DESCHEDULER_REQUESTER or ev.username in self.descheduler_users
