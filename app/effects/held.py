"""Nodes the node budget holds for too long, made visible; and the VMs the descheduler cannot move.

Why: `node_busy` counts a leaving VM until its departure ends, stuck or waiting ones too, so
that no second VM leaves a node while KubeVirt keeps retrying the first (the "two retry
loops"). The price is local: the descheduler cannot relieve that node meanwhile. A node
held so for longer than ``evacuationStaleAfter`` must not stay silent, so every
``interval`` seconds this asks policy (``held_node``) about every node and:

- sets ``held_nodes`` (the chart's PrometheusRule alerts on it);
- writes a Warning Event ``NodeHeld`` on each VMI that holds such a node, naming the node,
  how long, why (stuck: N failed attempts; waiting: a KubeVirt condition) and the fix
  (``virtctl evacuate-cancel``, or the canceller); at most once per VMI and node every
  ``repeat`` seconds (replicas each write theirs);
- counts the VMs the descheduler will not or cannot move: ``pinned_vms`` (a launcher pod
  that may run on one node only) and ``not_migratable_vms`` (`not_migratable`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from app.domain.records import KubeVirtRecord, LauncherPod, MigrationRecord, NodeRecord, VMIRecord
from app.effects.events import COMPONENT, VMIEventJob, vmi_event
from app.effects.kubeapi import EffectsApi
from app.effects.loop import BackgroundLoop
from app.effects.queue import EffectQueue
from app.metrics import Metrics
from app.policy.decide import HeldNode, Leaver, fix_for, held_node, is_migration_target, is_vm_pod, not_migratable
from app.policy.model import PolicySettings
from app.timefmt import format_duration

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "held"
EVENT_REASON = "NodeHeld"
DEFAULT_INTERVAL = 30.0
DEFAULT_REPEAT = 3600.0


class HeldView(Protocol):
    def vmi(self, namespace: str, name: str) -> VMIRecord | None: ...

    def nodes(self) -> list[NodeRecord]: ...

    def pods(self) -> list[LauncherPod]: ...

    def node(self, name: str) -> NodeRecord | None: ...

    def migrations(self, namespace: str, vmi_name: str) -> Sequence[MigrationRecord]: ...

    def kubevirt(self) -> KubeVirtRecord | None: ...

    def unfinished_migration(self, uid: str) -> MigrationRecord | None: ...


def held_event(held: HeldNode, one: Leaver, uid: str, budget: int, now: float, instance: str) -> dict[str, Any]:
    why = f" ({one.state})" if one.state else ""
    message = (f'Node "{held.node}" has been held for {format_duration(held.held_for)}: this VMI has been leaving it for '
               f"{format_duration(one.age) if one.age is not None else 'an unknown time'}{why}, and while "
               f"{budget} VM(s) are leaving it (pendingEvacuationsPerNode) the guard refuses the descheduler's "
               f"evictions from it. Fix: {fix_for(one)}")
    return vmi_event(one.namespace, one.name, uid, EVENT_REASON, message, now, instance)


class HeldNodeWatch(BackgroundLoop):
    thread_name = "held-nodes"

    def __init__(self, view: HeldView, api: EffectsApi, queue: EffectQueue, metrics: Metrics, settings: PolicySettings,
                 *, clock: Callable[[], float] = time.time, ready: Callable[[], bool] = lambda: True,
                 interval: float = DEFAULT_INTERVAL, repeat: float = DEFAULT_REPEAT, instance: str = "") -> None:
        self.view, self.api, self.queue, self.metrics, self.settings = view, api, queue, metrics, settings
        self.clock, self.ready, self.interval, self.repeat = clock, ready, interval, repeat
        self.instance = instance or os.environ.get("HOSTNAME", "") or COMPONENT
        self._told: dict[tuple[str, str, str], float] = {}  # (namespace, vmi, node) -> when its last Event was queued
        self.scans = 0  # finished scans: a test waits for this instead of sleeping
        super().__init__()

    def held(self) -> list[HeldNode]:
        now = self.clock()
        return [h for n in sorted(self.view.nodes(), key=lambda n: n.name)
                if (h := held_node(n, self.view, now, self.settings)) is not None]  # type: ignore[arg-type]

    def scan(self) -> int:
        """One pass: gauges set, Events queued for held nodes; returns how many Events were queued."""
        now = self.clock()
        held = self.held()
        self.metrics.held_nodes.set(len(held))
        self.metrics.held_node_oldest.set(max((h.held_for for h in held), default=0.0))
        pinned, unmovable = self.unmovable_vms()
        self.metrics.pinned_vms.set(pinned)
        self.metrics.not_migratable_vms.set(unmovable)
        queued, current = 0, set()
        for h in held:
            for one in h.holders:
                key = (one.namespace, one.name, h.node)
                current.add(key)
                if now - self._told.get(key, float("-inf")) < self.repeat:
                    continue
                vmi = self.view.vmi(one.namespace, one.name)
                event = held_event(h, one, vmi.uid if vmi else "", self.settings.pending_evacuations_per_node, now,
                                   self.instance)
                if self.queue.submit(VMIEventJob(self.api, one.namespace, event, KIND)):
                    self._told[key] = now
                    queued += 1
                    log.warning("node held by a departure", extra={"node": h.node, "namespace": one.namespace,
                                                                    "vmi": one.name, "held_s": round(h.held_for),
                                                                    "state": one.state or "leaving"})
        self._told = {k: t for k, t in self._told.items() if k in current}  # a node let go is told again next time
        self.scans += 1
        self.metrics.background_passes.labels("held_nodes").inc()
        return queued

    def unmovable_vms(self) -> tuple[int, int]:
        """(VMs pinned to their node, VMs a descheduler eviction would stop): their own launcher pods only."""
        kubevirt = self.view.kubevirt()
        pinned = unmovable = 0
        for pod in self.view.pods():
            if not is_vm_pod(pod):
                continue
            vmi = self.view.vmi(pod.namespace, pod.vmi_name)
            if vmi is None or is_migration_target(pod, vmi, self.view):  # type: ignore[arg-type]
                continue
            pinned += bool(pod.pinned_to)
            unmovable += not_migratable(vmi, kubevirt) is not None
        return pinned, unmovable

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.ready():
                continue
            try:
                self.scan()
            except Exception:  # a bug must not end the loop
                log.exception("held-node scan failed")
