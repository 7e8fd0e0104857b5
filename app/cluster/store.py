"""The indexed, in-memory view of the cluster that policy reads.

Writers (a snapshot load, or one watch loop per kind) call ``upsert``,
``delete`` and ``replace``; readers (every admission request) call the query
methods. Writes take a lock; reads take none. That is safe because every
value a reader can reach is immutable (records are frozen, per-VMI migration
lists and per-node sets are tuples/frozensets replaced whole on write), so a
reader sees either the old or the new value, never a half-written one.

The one index that changes on nearly every event, the VMIs that may be leaving
each node, is kept as plain sets that only writers touch (under the lock), so an
event costs O(1) however many VMIs leave a node at once. Readers get a frozen
copy, made under the lock by the first reader after a change and kept until the
next one: a burst of events pays for no copies nobody reads.

Every query policy makes is O(1) or O(answer): pods, VMIs and nodes by key,
migrations by (namespace, VMI name) and by uid, and for the node budget the
VMIs that may be leaving a node, kept as a precomputed index.

Namespaced kinds are kept as ``{namespace: {name: record}}`` rather than keyed
by ``(namespace, name)`` tuples: with 700,000 objects the tuples alone would
cost ~50 MB, while there are only a few hundred namespaces.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Union

from app.domain.descheduler import DeschedulerRecord
from app.domain.kinds import DESCHEDULER, KUBEVIRT, NODE, POD, VMI, VMIM
from app.domain.records import KubeVirtRecord, LauncherPod, MigrationRecord, NodeRecord, VMIRecord, arrived_by_state

Record = Union[VMIRecord, MigrationRecord, LauncherPod, NodeRecord, KubeVirtRecord, DeschedulerRecord]
Key = Union[tuple[str, str], str]
# (kind, old record or None, new record); (kind, None, None) after ``replace`` of the whole kind
Listener = Callable[[str, Any, Any], None]
log = logging.getLogger("kubevirt_eviction_guard.cluster")
_EMPTY: tuple = ()
_NO_NS: dict = {}  # stands in for an absent namespace; never written to
# finished moves kept per node and direction for the node cooldowns: the newest few are all
# those rules read (the last end, and a count that stops mattering once the cooldown reaches its cap)
MOVES_KEPT = 32


class ClusterStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, LauncherPod]] = {}
        self._vmis: dict[str, dict[str, VMIRecord]] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._vmims: dict[str, dict[str, MigrationRecord]] = {}
        self._vmims_by_vmi: dict[str, dict[str, tuple[MigrationRecord, ...]]] = {}
        self._vmims_by_uid: dict[str, MigrationRecord] = {}
        # node -> keys of VMIs that may be leaving it (writers only); vmi key -> that node
        self._leaving: dict[str, set[tuple[str, str]]] = {}
        self._leaving_of: dict[tuple[str, str], str] = {}
        # node -> frozen copy of _leaving[node] for readers, dropped whenever that set changes
        self._leaving_shown: dict[str, frozenset[tuple[str, str]]] = {}
        # node -> Succeeded VMIMs that left / reached it, newest end first (at most MOVES_KEPT)
        self._moves_from: dict[str, tuple[MigrationRecord, ...]] = {}
        self._moves_to: dict[str, tuple[MigrationRecord, ...]] = {}
        # the KubeVirt CR(s), by (namespace, name): KubeVirt runs with exactly one
        self._kubevirts: dict[tuple[str, str], KubeVirtRecord] = {}
        self._descheduler: DeschedulerRecord | None = None  # the KubeDescheduler, for report
        # called (outside the lock) with each VMIM the store held unfinished and now holds final
        self.on_migration_finished: Callable[[MigrationRecord], None] | None = None
        self._listeners: tuple[Listener, ...] = ()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` after every upsert and replace, on the writer's thread, outside the lock.
        It must be quick (the watch waits for it); its exceptions are logged and swallowed."""
        self._listeners += (listener,)

    def _notify(self, kind: str, old: Any, new: Any) -> None:
        for listener in self._listeners:
            try:
                listener(kind, old, new)
            except Exception:
                log.exception("store listener failed", extra={"kind": kind})

    # ---- queries (lock-free) -------------------------------------------------

    def pod(self, namespace: str, name: str) -> LauncherPod | None:
        return self._pods.get(namespace, _NO_NS).get(name)

    def vmi(self, namespace: str, name: str) -> VMIRecord | None:
        return self._vmis.get(namespace, _NO_NS).get(name)

    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def migrations(self, namespace: str, vmi_name: str) -> tuple[MigrationRecord, ...]:
        return self._vmims_by_vmi.get(namespace, _NO_NS).get(vmi_name, _EMPTY)

    def unfinished_migration(self, uid: str) -> MigrationRecord | None:
        """The VMIM with this uid if it has not finished (the target-pod rule's question).
        Only unfinished ones are indexed: they are a handful, the finished ones are most
        of the 500,000 VMIMs of a large cluster."""
        return self._vmims_by_uid.get(uid)

    def leaving_candidates(self, node: str) -> list[VMIRecord]:
        """VMIs that may be leaving ``node``: marked for evacuation from it, or with a
        migration in flight (per their own state or an unfinished VMIM) while on it.
        Policy decides which of them count."""
        keys = self._leaving_shown.get(node)
        if keys is None:
            with self._lock:
                keys = self._leaving_shown[node] = frozenset(self._leaving.get(node, _EMPTY))
        return [v for ns, name in keys if (v := self.vmi(ns, name)) is not None]

    def moves_from(self, node: str) -> tuple[MigrationRecord, ...]:
        """Succeeded VMIMs whose source was ``node``, newest end first (the newest MOVES_KEPT)."""
        return self._moves_from.get(node, _EMPTY)

    def moves_to(self, node: str) -> tuple[MigrationRecord, ...]:
        """Succeeded VMIMs whose target was ``node``, newest end first (the newest MOVES_KEPT)."""
        return self._moves_to.get(node, _EMPTY)

    def kubevirt(self) -> KubeVirtRecord | None:
        """The KubeVirt CR (the first by namespace and name, should there be several); None when unknown."""
        kvs = self._kubevirts
        return kvs[min(kvs)] if kvs else None

    def descheduler(self) -> DeschedulerRecord | None:
        """The KubeDescheduler, when the state was loaded with one (report); None otherwise."""
        return self._descheduler

    def vmis(self) -> list[VMIRecord]:
        return [v for names in list(self._vmis.values()) for v in list(names.values())]

    def nodes(self) -> list[NodeRecord]:
        return list(self._nodes.values())

    def pods(self) -> list[LauncherPod]:
        return [p for names in list(self._pods.values()) for p in list(names.values())]

    def counts(self) -> dict[str, int]:
        return {
            VMI: _count(self._vmis),
            VMIM: _count(self._vmims),
            POD: _count(self._pods),
            NODE: len(self._nodes),
            KUBEVIRT: len(self._kubevirts),
        }

    # ---- writes --------------------------------------------------------------

    def upsert(self, record: Record) -> None:
        listeners = self._listeners
        with self._lock:
            old = self._current(record) if listeners else None
            finished = self._put(record)
        if finished is not None and self.on_migration_finished is not None:
            self.on_migration_finished(finished)
        if listeners:
            self._notify(_KIND_OF[type(record)], old, record)

    def delete(self, kind: str, key: Key) -> None:
        with self._lock:
            if kind == NODE:
                self._nodes.pop(key, None)  # type: ignore[call-overload]
                return
            if kind == KUBEVIRT:
                kvs = dict(self._kubevirts)
                kvs.pop(key, None)  # type: ignore[call-overload]
                self._kubevirts = kvs
                return
            if kind not in (POD, VMI, VMIM):
                raise ValueError(f"unknown kind {kind!r}")
            ns, name = key  # type: ignore[misc]
            if kind == POD:
                _pop(self._pods, ns, name)
            elif kind == VMI:
                if _pop(self._vmis, ns, name) is not None:
                    self._refresh_leaving((ns, name))
            else:
                old = _pop(self._vmims, ns, name)
                if old is not None:
                    self._unindex_vmim(old)
                    self._unindex_move(old)
                    self._refresh_leaving((old.namespace, old.vmi_name))

    def replace(self, kind: str, records: Iterable[Record]) -> None:
        """Swap in the complete set of one kind (after a list or relist).

        Objects deleted while a watch was down are simply absent from the new
        list; replacing the whole kind at once is what makes them disappear.
        """
        if kind == NODE:
            nodes = {r.key: r for r in records}  # type: ignore[union-attr]
            with self._lock:
                self._nodes = nodes  # type: ignore[assignment]
        elif kind == KUBEVIRT:
            kvs = {r.key: r for r in records}  # type: ignore[union-attr]
            with self._lock:
                self._kubevirts = kvs  # type: ignore[assignment]
        elif kind == DESCHEDULER:
            found = list(records)
            with self._lock:
                self._descheduler = found[0] if found else None  # type: ignore[assignment]
        elif kind == POD:
            pods = _nest(records)
            with self._lock:
                self._pods = pods
        elif kind == VMI:
            vmis = _nest(records)
            with self._lock:
                self._vmis = vmis
                self._rebuild_leaving()
        elif kind == VMIM:
            vmims = _nest(records)
            grouped: dict[str, dict[str, list[MigrationRecord]]] = {}
            by_uid: dict[str, MigrationRecord] = {}
            for ns, names in vmims.items():
                per_vmi = grouped.setdefault(ns, {})
                for r in names.values():
                    per_vmi.setdefault(r.vmi_name, []).append(r)
                    if r.uid and not r.finished:
                        by_uid[r.uid] = r
            by_vmi = {ns: {v: tuple(ms) for v, ms in per.items()} for ns, per in grouped.items()}
            moves_from, moves_to = _moves_index(r for names in vmims.values() for r in names.values())
            with self._lock:
                old_vmims = self._vmims
                self._vmims = vmims
                self._vmims_by_vmi = by_vmi
                self._vmims_by_uid = by_uid
                self._moves_from, self._moves_to = moves_from, moves_to
                self._rebuild_leaving()
            if self.on_migration_finished is not None:  # finished while the watch was down
                for ns, names in vmims.items():
                    before = old_vmims.get(ns, _NO_NS)
                    for r in names.values():
                        old = before.get(r.name)
                        if r.finished and old is not None and not old.finished and old.uid == r.uid:
                            self.on_migration_finished(r)
        else:
            raise ValueError(f"unknown kind {kind!r}")
        if self._listeners:
            self._notify(kind, None, None)

    # ---- internals (caller holds the lock) -----------------------------------

    def _current(self, record: Record) -> Record | None:
        if isinstance(record, NodeRecord):
            return self._nodes.get(record.key)
        if isinstance(record, KubeVirtRecord):
            return self._kubevirts.get(record.key)
        if isinstance(record, DeschedulerRecord):
            return self._descheduler
        nested = {LauncherPod: self._pods, VMIRecord: self._vmis, MigrationRecord: self._vmims}.get(type(record))
        return nested.get(record.namespace, _NO_NS).get(record.name) if nested is not None else None  # type: ignore[union-attr]

    def _put(self, record: Record) -> MigrationRecord | None:
        """Store one record; returns a VMIM that this write turned final."""
        if isinstance(record, LauncherPod):
            self._pods.setdefault(record.namespace, {})[record.name] = record
        elif isinstance(record, NodeRecord):
            self._nodes[record.key] = record
        elif isinstance(record, KubeVirtRecord):
            self._kubevirts = {**self._kubevirts, record.key: record}
        elif isinstance(record, DeschedulerRecord):
            self._descheduler = record
        elif isinstance(record, VMIRecord):
            self._vmis.setdefault(record.namespace, {})[record.name] = record
            self._refresh_leaving(record.key)
        elif isinstance(record, MigrationRecord):
            ns = record.namespace
            old = self._vmims.get(ns, _NO_NS).get(record.name)
            if old is not None:
                self._unindex_vmim(old)
                self._unindex_move(old)
            self._vmims.setdefault(ns, {})[record.name] = record
            self._index_move(record)
            per_vmi = self._vmims_by_vmi.setdefault(ns, {})
            per_vmi[record.vmi_name] = per_vmi.get(record.vmi_name, _EMPTY) + (record,)
            if record.uid and not record.finished:
                self._vmims_by_uid[record.uid] = record
            self._refresh_leaving((ns, record.vmi_name))
            if old is not None and old.vmi_name != record.vmi_name:
                self._refresh_leaving((old.namespace, old.vmi_name))
            if old is not None and not old.finished and record.finished and old.uid == record.uid:
                return record
        else:
            raise TypeError(f"not a record: {type(record).__name__}")
        return None

    def _unindex_vmim(self, old: MigrationRecord) -> None:
        per_vmi = self._vmims_by_vmi.get(old.namespace)
        if per_vmi is not None:
            rest = tuple(m for m in per_vmi.get(old.vmi_name, _EMPTY) if m.name != old.name)
            if rest:
                per_vmi[old.vmi_name] = rest
            else:
                per_vmi.pop(old.vmi_name, None)
                if not per_vmi:
                    del self._vmims_by_vmi[old.namespace]
        if old.uid and self._vmims_by_uid.get(old.uid) is old:
            del self._vmims_by_uid[old.uid]

    def _index_move(self, m: MigrationRecord) -> None:
        if not m.moved:
            return
        order = _move_order(m)
        for index, node in ((self._moves_from, m.source_node), (self._moves_to, m.target_node)):
            if node:
                kept = index.get(node, _EMPTY)
                # kept is already newest first: insert in place instead of sorting again
                at = bisect.bisect(kept, order, key=_move_order)
                if at < MOVES_KEPT:
                    index[node] = (*kept[:at], m, *kept[at:MOVES_KEPT - 1])

    def _unindex_move(self, old: MigrationRecord) -> None:
        for index, node in ((self._moves_from, old.source_node), (self._moves_to, old.target_node)):
            kept = index.get(node)
            if kept and any(m is old for m in kept):
                rest = tuple(m for m in kept if m is not old)
                if rest:
                    index[node] = rest
                else:
                    del index[node]

    def _leaving_node(self, key: tuple[str, str]) -> str:
        """The node the VMI may be leaving (policy's ``is_leaving`` decides); an arrival by a
        decentralized migration leaves no node of this cluster."""
        vmi = self.vmi(*key)
        if vmi is None:
            return ""
        if vmi.evacuation_node:
            return vmi.evacuation_node
        m = vmi.migration
        migrations = self.migrations(*key)
        if m is not None and m.in_flight and not arrived_by_state(vmi, migrations):
            return m.source_node or vmi.node
        if vmi.node and any(not x.finished and not x.arriving for x in migrations):
            return vmi.node
        return ""

    def _refresh_leaving(self, key: tuple[str, str]) -> None:
        new = self._leaving_node(key)
        old = self._leaving_of.get(key, "")
        if new == old:
            return
        if old:
            rest = self._leaving.get(old)
            if rest is not None:
                rest.discard(key)
                if not rest:
                    del self._leaving[old]
            self._leaving_shown.pop(old, None)
            del self._leaving_of[key]
        if new:
            self._leaving.setdefault(new, set()).add(key)
            self._leaving_shown.pop(new, None)
            self._leaving_of[key] = new

    def _rebuild_leaving(self) -> None:
        leaving: dict[str, set[tuple[str, str]]] = {}
        leaving_of: dict[tuple[str, str], str] = {}
        for ns, names in self._vmis.items():
            for name in names:
                key = (ns, name)
                node = self._leaving_node(key)
                if node:
                    leaving.setdefault(node, set()).add(key)
                    leaving_of[key] = node
        self._leaving = leaving
        self._leaving_of = leaving_of
        self._leaving_shown = {}


_KIND_OF = {LauncherPod: POD, VMIRecord: VMI, MigrationRecord: VMIM, NodeRecord: NODE, KubeVirtRecord: KUBEVIRT,
            DeschedulerRecord: DESCHEDULER}


def _move_order(m: MigrationRecord) -> tuple[float, str, str]:
    return (-(m.end or 0.0), m.namespace, m.name)


def _newest_first(moves: Iterable[MigrationRecord]) -> tuple[MigrationRecord, ...]:
    return tuple(sorted(moves, key=_move_order)[:MOVES_KEPT])


def _moves_index(records: Iterable[MigrationRecord]) -> tuple[dict, dict]:
    by_source: dict[str, list[MigrationRecord]] = {}
    by_target: dict[str, list[MigrationRecord]] = {}
    for m in records:
        if m.moved:
            if m.source_node:
                by_source.setdefault(m.source_node, []).append(m)
            if m.target_node:
                by_target.setdefault(m.target_node, []).append(m)
    return ({n: _newest_first(ms) for n, ms in by_source.items()},
            {n: _newest_first(ms) for n, ms in by_target.items()})


def _nest(records: Iterable[Record]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        out.setdefault(r.namespace, {})[r.name] = r  # type: ignore[union-attr]
    return out


def _pop(nested: dict[str, dict[str, Any]], ns: str, name: str) -> Any:
    names = nested.get(ns)
    if names is None:
        return None
    old = names.pop(name, None)
    if not names:
        nested.pop(ns, None)
    return old


def _count(nested: dict[str, dict[str, Any]]) -> int:
    return sum(len(names) for names in list(nested.values()))
