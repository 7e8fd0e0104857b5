"""The canceller (``--cancel-stuck-evacuations``, on by default where it can work): ends stuck descheduler
evacuations.

Why: KubeVirt retries a marked VM for ever. When the descheduler caused the
mark and the migrations keep failing (a guest that dirties memory faster than
the NIC copies it, a VM pinned to its node), the retries only burn bandwidth
and hold the descheduler's in-flight slots; that is the first of the "two
retry loops" of the kubevirt-dev thread. KubeVirt v1.8 offers
``PUT /apis/subresources.kubevirt.io/v1/namespaces/NS/virtualmachineinstances/NAME/evacuate/cancel``
with ``{"evacuationNodeName": NODE}``: it clears the mark, so no new migration
is created (a running one is not aborted), and virt-controller drops the
launcher pod's ``eviction-in-progress`` annotation.

What is stuck, and safe to cancel, is decided by policy
(``app.policy.cancel.evacuations_to_cancel``): descheduler-caused, failing for
``evacuationStaleAfterFailures`` attempts or ``evacuationStaleAfter``, never a
drain (node cordoned or drain-tainted, or a ``system-critical`` VMIM). This
module only carries it out: every ``interval`` seconds it asks policy, queues
one job per VMI on the shared effects queue, and each job asks again from the
store just before the call (the VMI may have moved, or a drain begun). Every
cancel is a Warning Event ``EvacuationCancelled`` on the VMI and a count in
``evacuation_cancels_total{outcome,node,namespace}``. Replicas may both
cancel the same mark: the second finds it gone and virt-api does nothing.

Where it can work: before it scans, it asks the API server (and again every
``probe_every`` seconds while the answer is no) whether KubeVirt serves the
subresource (discovery of ``subresources.kubevirt.io/v1`` lists
``virtualmachineinstances/evacuate/cancel``: KubeVirt >= 1.8) and whether the
guard may call it. Two checks authorize that PUT, so the guard asks both
with SelfSubjectAccessReviews: kube-apiserver, which proxies the aggregated
API, takes only the first path segment after the name as the subresource
(``update`` on ``virtualmachineinstances/evacuate``), and virt-api's own
SubjectAccessReview joins the rest (``virtualmachineinstances/evacuate/cancel``;
before KubeVirt PR #17571 it, too, asked for ``evacuate``). Until both say yes
it stays off, and ``evacuation_canceller_info{enabled,reason}`` says why
(``no_subresource``, ``forbidden``, ``unknown`` for an API error; ``disabled``
when turned off).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from app.domain.records import MigrationRecord, NodeRecord, VMIRecord
from app.effects.events import COMPONENT, vmi_event
from app.effects.kubeapi import EffectsApi, NotFound, PermanentApiError, TransientApiError
from app.effects.loop import BackgroundLoop
from app.effects.queue import EffectQueue
from app.metrics import Metrics
from app.policy.cancel import evacuations_to_cancel
from app.policy.decide import StuckEvacuation
from app.policy.model import PolicySettings

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "cancel"
EVENT_REASON = "EvacuationCancelled"
DEFAULT_INTERVAL = 30.0
DEFAULT_PROBE_EVERY = 300.0
CANCELLED, REFUSED = "cancelled", "refused"
# the canceller's state, the reason label of evacuation_canceller_info
ENABLED, DISABLED, SNAPSHOT, NO_SUBRESOURCE, FORBIDDEN, UNKNOWN = (
    "enabled", "disabled", "snapshot", "no_subresource", "forbidden", "unknown")
SUBRESOURCES = ("subresources.kubevirt.io", "v1")
CANCEL_SUBRESOURCE = "virtualmachineinstances/evacuate/cancel"  # its name in virt-api's discovery document
# (verb, group, resource, subresource) authorized for PUT .../virtualmachineinstances/NAME/evacuate/cancel:
# kube-apiserver's request info (first segment after the name), then virt-api's own review (all of them)
CANCEL_ACCESS = (("update", SUBRESOURCES[0], "virtualmachineinstances", "evacuate"),
                 ("update", SUBRESOURCES[0], "virtualmachineinstances", "evacuate/cancel"))


def probe(api: EffectsApi) -> str:
    """Whether the canceller can work here: ENABLED, NO_SUBRESOURCE, FORBIDDEN, or UNKNOWN (the API failed)."""
    try:
        if not api.serves(*SUBRESOURCES, CANCEL_SUBRESOURCE):
            return NO_SUBRESOURCE
        for verb, group, resource, subresource in CANCEL_ACCESS:
            if not api.allowed(verb, group, resource, subresource):
                return FORBIDDEN
    except (TransientApiError, PermanentApiError, NotFound) as e:
        log.warning("evacuation canceller: cannot tell whether evacuate/cancel can be used", extra={"error": str(e)})
        return UNKNOWN
    return ENABLED


class CancelView(Protocol):
    def vmi(self, namespace: str, name: str) -> VMIRecord | None: ...

    def vmis(self) -> list[VMIRecord]: ...

    def node(self, name: str) -> NodeRecord | None: ...

    def migrations(self, namespace: str, vmi_name: str) -> Sequence[MigrationRecord]: ...


def cancel_event(stuck: StuckEvacuation, uid: str, now: float, instance: str) -> dict[str, Any]:
    message = (f'Cancelled the evacuation of this VMI from node "{stuck.node}" (evacuate/cancel): it was caused by '
               f"the descheduler and is stuck ({stuck.why}); KubeVirt creates no new migration for it"
               + ("; the attempt already created still runs" if stuck.running else ""))
    return vmi_event(stuck.namespace, stuck.name, uid, EVENT_REASON, message, now, instance)


class CancelJob:
    kind = KIND

    def __init__(self, canceller: StuckCanceller, namespace: str, name: str) -> None:
        self.canceller = canceller
        self.namespace, self.name = namespace, name
        self.key = (KIND, namespace, name)

    def run(self) -> str:
        return self.canceller.cancel(self.namespace, self.name)


class StuckCanceller(BackgroundLoop):
    thread_name = "evacuation-canceller"

    def __init__(self, view: CancelView, api: EffectsApi, queue: EffectQueue, metrics: Metrics,
                 settings: PolicySettings, *, clock: Callable[[], float] = time.time,
                 ready: Callable[[], bool] = lambda: True, interval: float = DEFAULT_INTERVAL,
                 instance: str = "", probe_every: float = DEFAULT_PROBE_EVERY, probed: bool = True) -> None:
        """``probed`` False: trust that evacuate/cancel works (tests of the cancel itself); else ask first."""
        self.view, self.api, self.queue, self.metrics, self.settings = view, api, queue, metrics, settings
        self.clock, self.ready, self.interval = clock, ready, interval
        self.instance = instance or os.environ.get("HOSTNAME", "") or COMPONENT
        self.probe_every = probe_every
        self.state = UNKNOWN if probed else ENABLED
        self._next_probe = float("-inf") if probed else float("inf")
        metrics.set_canceller(self.state)
        super().__init__()

    def check(self) -> str:
        """Ask again whether evacuate/cancel can be used, when due; returns the state."""
        now = time.monotonic()
        if self.state == ENABLED or now < self._next_probe:
            return self.state
        state = probe(self.api)
        self._next_probe = now + self.probe_every
        if state != self.state:
            (log.info if state == ENABLED else log.warning)(
                "evacuation canceller %s", "on" if state == ENABLED else f"off: {state}",
                extra={"reason": state, "fix": "" if state == ENABLED else FIXES.get(state, "")})
        self.state = state
        self.metrics.set_canceller(state)
        return state

    def scan(self) -> int:
        """Queue a cancel for every evacuation policy calls stuck; returns how many were queued."""
        stuck = evacuations_to_cancel(self.view.vmis(), self.view, self.clock(), self.settings)  # type: ignore[arg-type]
        return sum(1 for s in stuck if self.queue.submit(CancelJob(self, s.namespace, s.name)))

    def cancel(self, namespace: str, name: str) -> str:
        """One VMI: ask policy again from the store, then cancel, count and tell."""
        vmi = self.view.vmi(namespace, name)
        if vmi is None:
            return "not_needed"
        now = self.clock()
        found = evacuations_to_cancel([vmi], self.view, now, self.settings)  # type: ignore[arg-type]
        if not found:
            return "not_needed"  # moved, cancelled meanwhile, or a drain began
        stuck = found[0]
        try:
            self.api.cancel_evacuation(namespace, name, stuck.node)
        except NotFound:
            return "not_needed"
        except PermanentApiError as e:  # 400 (KubeVirt's drain taint on the node), 403 (RBAC), 404 path (< v1.8)
            self.metrics.evacuation_cancels.labels(REFUSED, stuck.node, namespace).inc()
            log.warning("evacuation cancel refused", extra={"namespace": namespace, "vmi": name, "node": stuck.node,
                                                            "error": str(e)})
            return "failed"
        self.metrics.evacuation_cancels.labels(CANCELLED, stuck.node, namespace).inc()
        log.info("cancelled a stuck evacuation", extra={"namespace": namespace, "vmi": name, "node": stuck.node,
                                                        "why": stuck.why})
        try:
            self.api.create_event(namespace, cancel_event(stuck, vmi.uid, now, self.instance))
        except Exception as e:  # noqa: BLE001 - the cancel is done: a failed Event must not make the job retry it
            self.metrics.side_effect_errors.labels("event").inc()
            log.warning("could not write the EvacuationCancelled Event", extra={"namespace": namespace, "vmi": name,
                                                                                 "error": str(e)})
        return "applied"

    def _run(self) -> None:
        try:
            self.check()  # at once, so the metric says what is so from the start; the first scan after an interval
        except Exception:
            log.exception("evacuation canceller probe failed")
        while not self._stop.wait(self.interval):
            try:
                if self.check() == ENABLED and self.ready():
                    self.scan()
                    self.metrics.background_passes.labels("canceller").inc()
            except Exception:  # a bug must not end the loop
                log.exception("evacuation canceller scan failed")


FIXES = {
    NO_SUBRESOURCE: "KubeVirt serves evacuate/cancel from v1.8: upgrade KubeVirt, or cancel by hand (virtctl evacuate-cancel)",
    FORBIDDEN: ("grant update on virtualmachineinstances/evacuate and virtualmachineinstances/evacuate/cancel in "
                "subresources.kubevirt.io (the chart's canceller.enabled: true does)"),
    UNKNOWN: "the API server did not answer; the guard asks again in a few minutes",
}
