"""The indexed, in-memory view of the cluster that policy reads.

Writers (a snapshot load, or one watch loop per kind) call ``upsert``,
``delete`` and ``replace``; readers (every admission request) call the query
methods. Writes take a lock; reads take none. That is safe because every
value a reader can reach is immutable (records are frozen, per-VMI migration
lists and per-node sets are tuples/frozensets replaced whole on write), so a
reader sees either the old or the new value, never a half-written one.

Every query policy makes is O(1) or O(answer): pods, VMIs and nodes by key,
migrations by (namespace, VMI name) and by uid, and for the node budget the
VMIs that may be leaving a node, kept as a precomputed index.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Union

from app.cluster.records import LauncherPod, MigrationRecord, NodeRecord, VMIRecord

VMI, VMIM, POD, NODE = "vmi", "vmim", "pod", "node"
KINDS = (VMI, VMIM, POD, NODE)

Record = Union[VMIRecord, MigrationRecord, LauncherPod, NodeRecord]
Key = Union[tuple[str, str], str]
_EMPTY: tuple = ()


class ClusterStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], LauncherPod] = {}
        self._vmis: dict[tuple[str, str], VMIRecord] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._vmims: dict[tuple[str, str], MigrationRecord] = {}
        self._vmims_by_vmi: dict[tuple[str, str], tuple[MigrationRecord, ...]] = {}
        self._vmims_by_uid: dict[str, MigrationRecord] = {}
        # node -> keys of VMIs that may be leaving it; vmi key -> that node
        self._leaving: dict[str, frozenset[tuple[str, str]]] = {}
        self._leaving_of: dict[tuple[str, str], str] = {}

    # ---- queries (lock-free) -------------------------------------------------

    def pod(self, namespace: str, name: str) -> LauncherPod | None:
        return self._pods.get((namespace, name))

    def vmi(self, namespace: str, name: str) -> VMIRecord | None:
        return self._vmis.get((namespace, name))

    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def migrations(self, namespace: str, vmi_name: str) -> tuple[MigrationRecord, ...]:
        return self._vmims_by_vmi.get((namespace, vmi_name), _EMPTY)

    def migration_by_uid(self, uid: str) -> MigrationRecord | None:
        return self._vmims_by_uid.get(uid)

    def leaving_candidates(self, node: str) -> list[VMIRecord]:
        """VMIs that may be leaving ``node``: marked for evacuation from it, or with a
        migration in flight (per their own state or an unfinished VMIM) while on it.
        Policy decides which of them count."""
        vmis = self._vmis
        return [v for k in self._leaving.get(node, _EMPTY) if (v := vmis.get(k)) is not None]

    def vmis(self) -> list[VMIRecord]:
        return list(self._vmis.values())

    def pods(self) -> list[LauncherPod]:
        return list(self._pods.values())

    def counts(self) -> dict[str, int]:
        return {VMI: len(self._vmis), VMIM: len(self._vmims), POD: len(self._pods), NODE: len(self._nodes)}

    # ---- writes --------------------------------------------------------------

    def upsert(self, record: Record) -> None:
        with self._lock:
            self._put(record)

    def delete(self, kind: str, key: Key) -> None:
        with self._lock:
            if kind == POD:
                self._pods.pop(key, None)  # type: ignore[arg-type]
            elif kind == NODE:
                self._nodes.pop(key, None)  # type: ignore[arg-type]
            elif kind == VMI:
                if self._vmis.pop(key, None) is not None:  # type: ignore[arg-type]
                    self._refresh_leaving(key)  # type: ignore[arg-type]
            elif kind == VMIM:
                old = self._vmims.pop(key, None)  # type: ignore[arg-type]
                if old is not None:
                    self._unindex_vmim(old)
                    self._refresh_leaving((old.namespace, old.vmi_name))
            else:
                raise ValueError(f"unknown kind {kind!r}")

    def replace(self, kind: str, records: Iterable[Record]) -> None:
        """Swap in the complete set of one kind (after a list or relist).

        Objects deleted while a watch was down are simply absent from the new
        list; replacing the whole kind at once is what makes them disappear.
        """
        if kind == POD:
            pods = {r.key: r for r in records}  # type: ignore[union-attr]
            with self._lock:
                self._pods = pods  # type: ignore[assignment]
        elif kind == NODE:
            nodes = {r.key: r for r in records}  # type: ignore[union-attr]
            with self._lock:
                self._nodes = nodes  # type: ignore[assignment]
        elif kind == VMI:
            vmis = {r.key: r for r in records}  # type: ignore[union-attr]
            with self._lock:
                self._vmis = vmis  # type: ignore[assignment]
                self._rebuild_leaving()
        elif kind == VMIM:
            vmims: dict = {}
            grouped: dict[tuple[str, str], list[MigrationRecord]] = {}
            by_uid: dict[str, MigrationRecord] = {}
            for r in records:
                vmims[r.key] = r  # type: ignore[union-attr]
            for r in vmims.values():
                grouped.setdefault((r.namespace, r.vmi_name), []).append(r)
                if r.uid:
                    by_uid[r.uid] = r
            with self._lock:
                self._vmims = vmims
                self._vmims_by_vmi = {k: tuple(v) for k, v in grouped.items()}
                self._vmims_by_uid = by_uid
                self._rebuild_leaving()
        else:
            raise ValueError(f"unknown kind {kind!r}")

    # ---- internals (caller holds the lock) -----------------------------------

    def _put(self, record: Record) -> None:
        if isinstance(record, LauncherPod):
            self._pods[record.key] = record
        elif isinstance(record, NodeRecord):
            self._nodes[record.key] = record
        elif isinstance(record, VMIRecord):
            self._vmis[record.key] = record
            self._refresh_leaving(record.key)
        elif isinstance(record, MigrationRecord):
            old = self._vmims.get(record.key)
            if old is not None:
                self._unindex_vmim(old)
            self._vmims[record.key] = record
            vkey = (record.namespace, record.vmi_name)
            self._vmims_by_vmi[vkey] = self._vmims_by_vmi.get(vkey, _EMPTY) + (record,)
            if record.uid:
                self._vmims_by_uid[record.uid] = record
            self._refresh_leaving(vkey)
            if old is not None and old.vmi_name != record.vmi_name:
                self._refresh_leaving((old.namespace, old.vmi_name))
        else:
            raise TypeError(f"not a record: {type(record).__name__}")

    def _unindex_vmim(self, old: MigrationRecord) -> None:
        vkey = (old.namespace, old.vmi_name)
        rest = tuple(m for m in self._vmims_by_vmi.get(vkey, _EMPTY) if m.key != old.key)
        if rest:
            self._vmims_by_vmi[vkey] = rest
        else:
            self._vmims_by_vmi.pop(vkey, None)
        if old.uid and self._vmims_by_uid.get(old.uid) is old:
            del self._vmims_by_uid[old.uid]

    def _leaving_node(self, key: tuple[str, str]) -> str:
        vmi = self._vmis.get(key)
        if vmi is None:
            return ""
        if vmi.evacuation_node:
            return vmi.evacuation_node
        m = vmi.migration
        if m is not None and m.in_flight:
            return m.source_node or vmi.node
        if vmi.node and any(not x.finished for x in self._vmims_by_vmi.get(key, _EMPTY)):
            return vmi.node
        return ""

    def _refresh_leaving(self, key: tuple[str, str]) -> None:
        new = self._leaving_node(key)
        old = self._leaving_of.get(key, "")
        if new == old:
            return
        if old:
            rest = self._leaving.get(old, frozenset()) - {key}
            if rest:
                self._leaving[old] = rest
            else:
                self._leaving.pop(old, None)
            del self._leaving_of[key]
        if new:
            self._leaving[new] = self._leaving.get(new, frozenset()) | {key}
            self._leaving_of[key] = new

    def _rebuild_leaving(self) -> None:
        leaving: dict[str, set[tuple[str, str]]] = {}
        leaving_of: dict[tuple[str, str], str] = {}
        for key in self._vmis:
            node = self._leaving_node(key)
            if node:
                leaving.setdefault(node, set()).add(key)
                leaving_of[key] = node
        self._leaving = {n: frozenset(s) for n, s in leaving.items()}
        self._leaving_of = leaving_of
