"""Load cluster state from a file, as ``kubectl get vmi,vmim,pods,nodes -A -o yaml`` prints it
(add ``kubevirt`` for the KubeVirt CR's migration limits and eviction strategy).

Accepted: a Kubernetes ``List`` (or any ``*List``) in JSON or YAML, a single
object, or a multi-document YAML stream of either. Items of other kinds are
skipped. A file that cannot be read or parsed is a ``SnapshotError`` naming
the file and the problem; an item that lacks a name is skipped and counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from app.cluster.store import ClusterStore
from app.domain.descheduler import descheduler_from_object
from app.domain.kinds import DESCHEDULER, KINDS, KUBEVIRT, NODE, POD, VMI, VMIM
from app.domain.records import (
    RecordError,
    kubevirt_from_object,
    migration_from_object,
    node_from_object,
    pod_from_object,
    vmi_from_object,
)

PARSERS = {
    "VirtualMachineInstance": (VMI, vmi_from_object),
    "VirtualMachineInstanceMigration": (VMIM, migration_from_object),
    "Pod": (POD, pod_from_object),
    "Node": (NODE, node_from_object),
    # optional: the cluster-wide settings (kubectl get kubevirt -A -o yaml; the KubeDescheduler for report)
    "KubeVirt": (KUBEVIRT, kubevirt_from_object),
    "KubeDescheduler": (DESCHEDULER, descheduler_from_object),
}

try:  # libyaml is much faster on large dumps; fall back to the pure-Python loader
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


class SnapshotError(ValueError):
    pass


MAX_FLOW_OPENERS = 1000


def _loader_for(data: bytes) -> Any:
    """libyaml's composer recurses in C: a few tens of thousands of nested brackets
    overflow the C stack and kill the process. Files with many flow brackets (after
    dropping the empty ``[]``/``{}`` that kubectl prints) go to the pure-Python
    loader, whose recursion limit is an exception we can report."""
    rest = data.replace(b"[]", b"").replace(b"{}", b"")
    if rest.count(b"[") + rest.count(b"{") > MAX_FLOW_OPENERS:
        return yaml.SafeLoader
    return _Loader


@dataclass
class SnapshotStats:
    loaded: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    skipped_kinds: int = 0
    skipped_malformed: int = 0


def _documents(path: Path, data: bytes) -> list[Any]:
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            return [orjson.loads(data)]
        except orjson.JSONDecodeError:
            pass  # YAML is a superset of JSON's flow style; let the YAML parser report
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SnapshotError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        return [d for d in yaml.load_all(text, Loader=_loader_for(data)) if d is not None]
    except RecursionError:
        raise SnapshotError(f"{path}: nesting too deep to be a Kubernetes object") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SnapshotError(f"{path}: not valid YAML or JSON{where}: {problem}") from None


def _objects(path: Path, where: str, items: list[Any]) -> Iterator[dict]:
    for j, item in enumerate(items):
        if not isinstance(item, dict):
            raise SnapshotError(f"{path}: {where} item {j + 1} is a {type(item).__name__}, expected a Kubernetes object")
        yield item


def _items(path: Path, docs: list[Any]) -> Iterator[dict]:
    for i, doc in enumerate(docs):
        if isinstance(doc, list):
            yield from _objects(path, f"document {i + 1}", doc)
            continue
        if not isinstance(doc, dict):
            raise SnapshotError(f"{path}: document {i + 1} is a {type(doc).__name__}, expected a Kubernetes object or List")
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
            items = doc.get("items")
            if items is None:
                continue
            if not isinstance(items, list):
                raise SnapshotError(f"{path}: document {i + 1}: 'items' is not a list")
            yield from _objects(path, f"document {i + 1}", items)
        elif "kind" in doc:
            yield doc
        else:
            raise SnapshotError(f"{path}: document {i + 1} has no 'kind'; expected a Kubernetes object or List")


def read_objects(path: str | Path) -> Iterator[dict]:
    """Every object in a dump (a ``List`` in JSON or YAML, a multi-document stream, or one object),
    whatever its kind. Raises ``SnapshotError`` naming the file and the place for anything malformed."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise SnapshotError(f"{p}: cannot read: {e.strerror or e}") from None
    return _items(p, _documents(p, data))


def load_snapshot(path: str | Path, store: ClusterStore | None = None) -> tuple[ClusterStore, SnapshotStats]:
    store = store if store is not None else ClusterStore()
    stats = SnapshotStats()
    by_kind: dict[str, list] = {k: [] for k in (*KINDS, KUBEVIRT, DESCHEDULER)}
    for item in read_objects(path):
        kind = item.get("kind")
        parser = PARSERS.get(kind) if isinstance(kind, str) else None
        if parser is None:
            stats.skipped_kinds += 1
            continue
        store_kind, parse = parser
        try:
            record = parse(item)
        except RecordError:
            stats.skipped_malformed += 1
            continue
        by_kind[store_kind].append(record)
    for kind, records in by_kind.items():
        store.replace(kind, records)
    counts = store.counts()
    for kind, records in by_kind.items():
        if kind in KINDS or records:  # the optional kinds only when the file has them
            # what the store holds: an object listed twice is one object
            stats.loaded[kind] = counts.get(kind, len(records))
    return store, stats
