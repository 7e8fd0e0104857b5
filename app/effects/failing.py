"""Evacuations that keep failing, whoever caused them, made visible (``app.policy.failing``).

Every ``interval`` seconds this asks policy about every VMI and:

- sets ``failing_evacuations{cause}`` and ``failing_evacuation_oldest_seconds`` (the chart's
  ``KubevirtEvictionGuardEvacuationFailing`` alert reads the first), and ``vms_in_cooldown`` on the same walk;
- writes a Warning Event ``EvacuationFailing`` on each such VMI, with the node, the failure count, the age, the
  cause and what to do (``virtctl evacuate-cancel``): once per VMI, node and failure count, and again every
  ``repeat`` seconds while it goes on (replicas each write theirs).

It never cancels anything: the canceller (``cancel.py``) ends the descheduler's stuck evacuations only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from app.effects.events import COMPONENT, VMIEventJob, vmi_event
from app.effects.kubeapi import EffectsApi
from app.effects.loop import BackgroundLoop
from app.effects.queue import EffectQueue
from app.metrics import Metrics
from app.policy.cause import CAUSES
from app.policy.cooldown import cooldown_state, relevant_migrations, vm_settings
from app.policy.failing import FailingEvacuation, failing_evacuation
from app.policy.model import PolicySettings

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "failing"
EVENT_REASON = "EvacuationFailing"
DEFAULT_INTERVAL = 30.0
DEFAULT_REPEAT = 3600.0


class FailingEvacuationWatch(BackgroundLoop):
    thread_name = "failing-evacuations"

    def __init__(self, view, api: EffectsApi, queue: EffectQueue, metrics: Metrics, settings: PolicySettings, *,
                 clock: Callable[[], float] = time.time, ready: Callable[[], bool] = lambda: True,
                 interval: float = DEFAULT_INTERVAL, repeat: float = DEFAULT_REPEAT, instance: str = "") -> None:
        self.view, self.api, self.queue, self.metrics, self.settings = view, api, queue, metrics, settings
        self.clock, self.ready, self.interval, self.repeat = clock, ready, interval, repeat
        self.instance = instance or os.environ.get("HOSTNAME", "") or COMPONENT
        self._told: dict[tuple[str, str, str, int], float] = {}  # (namespace, vmi, node, failures) -> queued at
        self.scans = 0
        super().__init__()

    def failing(self) -> list[FailingEvacuation]:
        """The evacuations failing now; counts the VMs in cooldown on the way (the same walk)."""
        now = self.clock()
        out = []
        cooling = 0
        for vmi in self.view.vmis():
            migrations = relevant_migrations(vmi, self.view.migrations(vmi.namespace, vmi.name))
            state = cooldown_state(vmi, migrations, now, vm_settings(vmi, self.settings))
            cooling += state is not None and state.active
            if not vmi.evacuation_node and all(m.finished for m in migrations):
                continue  # the common case, cheap: nothing of an evacuation runs
            source = vmi.evacuation_node or next((m.evacuation_node for m in migrations
                                                  if not m.finished and m.evacuation_node), "")
            f = failing_evacuation(vmi, migrations, self.view.node(source) if source else None, now, self.settings)
            if f is not None:
                out.append(f)
        self.metrics.vms_in_cooldown.set(cooling)
        return sorted(out, key=lambda f: (f.namespace, f.name))

    def scan(self) -> int:
        """One pass: the gauges set, Events queued; returns how many Events were queued."""
        now = self.clock()
        failing = self.failing()
        for cause in CAUSES:
            self.metrics.failing_evacuations.labels(cause).set(sum(1 for f in failing if f.cause == cause))
        self.metrics.failing_evacuation_age.set(max((f.age or 0.0 for f in failing), default=0.0))
        queued, current = 0, set()
        for f in failing:
            key = (f.namespace, f.name, f.node, f.failures)
            current.add(key)
            if now - self._told.get(key, float("-inf")) < self.repeat:
                continue
            vmi = self.view.vmi(f.namespace, f.name)
            event = vmi_event(f.namespace, f.name, vmi.uid if vmi else "", EVENT_REASON, f.message(), now,
                              self.instance)
            if self.queue.submit(VMIEventJob(self.api, f.namespace, event, KIND)):
                self._told[key] = now
                queued += 1
                log.warning("evacuation keeps failing", extra={
                    "namespace": f.namespace, "vmi": f.name, "node": f.node, "failures": f.failures,
                    "age_s": round(f.age) if f.age is not None else None, "cause": f.cause,
                    "cancelled_by_guard": f.cancelled_by_guard})
        self._told = {k: t for k, t in self._told.items() if k in current}
        self.scans += 1
        self.metrics.background_passes.labels("failing_evacuations").inc()
        return queued

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.ready():
                continue
            try:
                self.scan()
            except Exception:  # a bug must not end the loop
                log.exception("failing-evacuation scan failed")
