"""The history recorder: keeps ``kubevirt-eviction-guard.io/migration-history`` on each VMI.

Why: KubeVirt garbage-collects finished VMIMs down to the 5 most recent per
VMI, and ``migrationState`` holds only the latest migration. The reference
plugin counts every migration it saw in its window (six 10-minute migrations
in 48 h: count 6, 8 h, capped at 6 h); a guard reading only cluster objects
would count 5 (4 h). So the guard writes what it has seen into the VMI, and
policy reads it back from there (``app/domain/history.py``,
``policy.cooldown.recorded_migrations``): every replica and every restart
counts the same, and nothing lives only in a process's memory.

What it writes: the union of the annotation's entries and the finished
migrations KubeVirt's objects show (the VMI's ended ``migrationState``, its
Succeeded/Failed VMIMs), keeping the entries that ended within
``migrationHistoryWindow`` and at most ``history_bound(settings)`` newest. It
writes only when KubeVirt's objects show a migration the annotation lacks
(and that survives the bound), never just to drop or reorder entries, so
replicas with different settings (a rollout) cannot undo each other in a loop,
and a write leaves nothing more to write. The recorder holds no state of its
own: what it knows comes from the store and the VMI it has just read.

When: off the request path. The store tells the recorder when a VMIM turns
final or a VMI's ``migrationState`` gets a new end; a reconcile over every
VMI runs after each (re)list and every ``interval`` seconds as a safety net
(it also repairs an annotation someone deleted, from the VMIMs that remain).
Each write is a job on the shared effects queue, keyed by VMI; the reconcile
leaves half the queue free for Events and pod annotations.

How: the job re-checks against the store (no API call when nothing is
missing), reads the VMI from the API server, merges, and sends a JSON patch
that first tests ``/metadata/resourceVersion`` against the version it read.
If the VMI changed in between (KubeVirt updates its status often), the patch
is refused and the job is retried: it reads again and merges again. Two
replicas reacting to the same migration write the same union; the second
finds nothing missing, or is refused and then finds nothing missing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from app.domain.history import HISTORY_ANNOTATION, MAX_ENTRIES, HistoryEntry, encode_history
from app.domain.kinds import VMI, VMIM
from app.domain.records import MigrationRecord, VMIRecord
from app.effects.annotate import json_pointer_token
from app.effects.kubeapi import Conflict, EffectsApi, NotFound, read_vmi_afresh
from app.effects.loop import BackgroundLoop
from app.effects.queue import EffectQueue, Retry
from app.policy.cause import cause_of
from app.policy.cooldown import relevant_migrations, vm_settings
from app.policy.model import PolicySettings

log = logging.getLogger("kubevirt_eviction_guard.effects")
KIND = "history"
APPLIED, NOT_NEEDED = "applied", "not_needed"
RECONCILE_INTERVAL = 300.0


def history_bound(settings: PolicySettings) -> int:
    """How many entries are worth keeping: the count at which the cooldown reaches its cap
    for any last migration (base >= max(migrationCooldown, 1 s): timestamps are whole
    seconds, and a 0 s base gives 0 whatever the count). With defaults, 15m x 2^5 >= 6h: 6.
    Without a cap (0) every entry could matter: MAX_ENTRIES (64; with 2^63 x 1 s the
    cooldown outlasts any window, so the bound changes no decision, only the number)."""
    cap = settings.max_migration_cooldown
    if cap <= 0:
        return MAX_ENTRIES
    floor = max(settings.migration_cooldown, 1.0)
    if cap <= floor:
        return 1
    return min(MAX_ENTRIES, 1 + math.ceil(math.log2(cap / floor)))


def known_migrations(vmi: VMIRecord, migrations: Iterable[MigrationRecord]) -> list[HistoryEntry]:
    """The finished migrations KubeVirt's own objects show for this VMI incarnation."""
    out = []
    state = vmi.migration
    if state is not None and state.ended and state.end is not None:
        out.append(HistoryEntry(state.uid, state.start, state.end, "Failed" if state.failed else "Succeeded"))
    for m in relevant_migrations(vmi, migrations):
        if m.finished and m.end is not None:
            out.append(HistoryEntry(m.uid, m.start, m.end, m.phase, cause_of(m)))
    return out


def merge(existing: Sequence[HistoryEntry], known: Iterable[HistoryEntry], now: float,
          settings: PolicySettings) -> tuple[list[HistoryEntry], bool]:
    """(entries to write, whether that adds anything to ``existing``); ``settings`` are the
    VM's own (``vm_settings``: its migration-cooldown annotation changes floor and cap).

    Union by identity (the uid; the end second for an entry without one), KubeVirt's
    values winning; then only entries that ended within the window (``end >= now -
    window``: an entry dropped here is out of the window for any later decision), at
    most ``history_bound`` newest. It adds something when a kept entry's identity is
    not among ``existing``'s, or it has a cause that entry lacks or names otherwise."""
    union = {e.identity: e for e in existing}
    had = {e.identity: e.cause for e in existing}
    for k in known:
        if not k.cause and union.get(k.identity) is not None:  # the migrationState knows no cause: keep ours
            k = HistoryEntry(k.uid, k.start, k.end, k.outcome, union[k.identity].cause)
        union[k.identity] = k
    horizon = now - settings.migration_history_window
    # newest by end; ties (impossible for one VMI, possible in an edited value) by identity, so that
    # which entries are kept does not depend on the order they came in
    kept = sorted((e for e in union.values() if e.end >= horizon),
                  key=lambda e: (e.end, str(e.identity)))[-history_bound(settings):]
    return kept, any(e.identity not in had or (e.cause and had[e.identity] != e.cause) for e in kept)


def history_patch(resource_version: str, has_annotations: bool, value: str) -> list[dict[str, Any]]:
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
    if has_annotations:
        add = {"op": "add", "path": f"/metadata/annotations/{json_pointer_token(HISTORY_ANNOTATION)}", "value": value}
    else:
        add = {"op": "add", "path": "/metadata/annotations", "value": {HISTORY_ANNOTATION: value}}
    return [test, add]


class HistoryView(Protocol):
    def vmi(self, namespace: str, name: str) -> VMIRecord | None: ...

    def migrations(self, namespace: str, vmi_name: str) -> Sequence[MigrationRecord]: ...

    def vmis(self) -> list[VMIRecord]: ...


def needs_write(view: HistoryView, vmi: VMIRecord, now: float, settings: PolicySettings) -> bool:
    """From the store alone: do KubeVirt's objects show a migration the annotation should have?"""
    known = known_migrations(vmi, view.migrations(vmi.namespace, vmi.name))
    return bool(known) and merge(vmi.history, known, now, vm_settings(vmi, settings))[1]


class HistoryJob:
    """Bring one VMI's annotation up to what KubeVirt's objects show."""

    kind = KIND

    def __init__(self, view: HistoryView, api: EffectsApi, namespace: str, name: str, settings: PolicySettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.view, self.api, self.settings, self.clock = view, api, settings, clock
        self.namespace, self.name = namespace, name
        self.key = (KIND, namespace, name)

    def run(self) -> str:
        stored = self.view.vmi(self.namespace, self.name)
        if stored is None or not needs_write(self.view, stored, self.clock(), self.settings):
            return NOT_NEEDED
        read = read_vmi_afresh(self.api, self.namespace, self.name)
        if read is None:
            return NOT_NEEDED
        fresh, obj = read
        meta = obj.get("metadata") or {}
        resource_version = meta.get("resourceVersion")
        if fresh.uid != stored.uid or not isinstance(resource_version, str) or not resource_version:
            return NOT_NEEDED  # another incarnation than the store's VMIMs were matched against, or unguardable
        known = known_migrations(fresh, self.view.migrations(self.namespace, self.name))
        entries, adds = merge(fresh.history, known, self.clock(), vm_settings(fresh, self.settings))
        if not adds:
            return NOT_NEEDED
        patch = history_patch(resource_version, isinstance(meta.get("annotations"), dict), encode_history(entries))
        try:
            self.api.patch_vmi(self.namespace, self.name, patch)
        except Conflict:
            raise Retry(f"VMI changed after resourceVersion {resource_version}; reading it again") from None
        except NotFound:
            return NOT_NEEDED
        log.info("recorded migration history on VMI", extra={
            "namespace": self.namespace, "vmi": self.name, "entries": len(entries),
            "resource_version": resource_version,
        })
        return APPLIED


class HistoryRecorder(BackgroundLoop):
    """Queues ``HistoryJob``s when the store shows a newly finished migration, and reconciles
    every VMI after each (re)list and every ``interval`` seconds."""

    thread_name = "history-reconcile"

    def __init__(self, view: HistoryView, api: EffectsApi, queue: EffectQueue, settings: PolicySettings, *,
                 clock: Callable[[], float] = time.time, ready: Callable[[], bool] = lambda: True,
                 interval: float = RECONCILE_INTERVAL, passes=None) -> None:
        """``passes``: a counter child incremented after each reconcile (``background_passes_total``)."""
        self.view, self.api, self.queue, self.settings = view, api, queue, settings
        self.passes = passes
        self.clock, self.ready, self.interval = clock, ready, interval
        self._wake = threading.Event()
        super().__init__()

    def submit(self, namespace: str, name: str) -> bool:
        return self.queue.submit(HistoryJob(self.view, self.api, namespace, name, self.settings, self.clock))

    # ---- the store's hook (runs on a watch thread: cheap checks and a queue append only) ----

    def on_change(self, kind: str, old: Any, new: Any) -> None:
        if new is None:  # a (re)list replaced the kind: reconcile everything
            if kind in (VMI, VMIM):
                self._wake.set()
            return
        if kind == VMIM:
            if new.finished and new.end is not None and (old is None or not old.finished):
                self.submit(new.namespace, new.vmi_name)
        elif kind == VMI:
            m = new.migration
            if m is None or not m.ended or m.end is None:
                return
            before = old.migration if old is not None else None
            if before is None or (before.uid, before.end) != (m.uid, m.end):
                self.submit(new.namespace, new.name)

    # ---- reconcile ---------------------------------------------------------------------------

    def reconcile(self) -> int:
        """Queue a job for every VMI whose annotation lacks what KubeVirt's objects show, while
        the queue is less than half full (the rest waits for the next pass). Returns how many."""
        now, room = self.clock(), self.queue.capacity // 2
        queued = 0
        for vmi in self.view.vmis():
            if len(self.queue) >= room:
                self._wake.set()  # come back soon for the rest
                break
            if needs_write(self.view, vmi, now, self.settings) and self.submit(vmi.namespace, vmi.name):
                queued += 1
        return queued

    def _wake_up(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self.interval)
            if self._stop.is_set():
                return
            self._wake.clear()
            if woken:
                self._stop.wait(1.0)  # let the other kind's list land too before walking everything
            if not self.ready():
                self._wake.set()
                self._stop.wait(1.0)
                continue
            try:
                queued = self.reconcile()
            except Exception:  # a bug must not end the safety net
                log.exception("history reconcile failed")
                continue
            if self.passes is not None:
                self.passes.inc()
            if queued:
                log.info("history reconcile queued writes", extra={"vmis": queued})
