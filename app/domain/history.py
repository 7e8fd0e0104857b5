"""The migration history the guard keeps on a VMI, in the annotation
``kubevirt-eviction-guard.io/migration-history``.

KubeVirt keeps only the 5 most recent finished VMIMs of a VMI, so past the
fifth migration the cluster forgets what the cooldown's backoff counts. The
guard writes what it saw into the VMI itself (``app/effects/history.py``), and
every replica and every restart reads it back from there.

The value is a JSON list, newest last, of
``{"uid": VMIM uid, "start": RFC 3339, "end": RFC 3339, "outcome": "Succeeded"|"Failed", "cause": CAUSE}``
(``start`` may be null; ``outcome`` is for people, policy does not read it; ``cause`` is who moved the VM, as
``app.policy.cause.cause_of`` read it from the VMIM: one of ``CAUSES``, absent when not known; ``report`` shows
it once KubeVirt has deleted the VMIM).
Parsing never fails: a value that is not such a list, or is too long, reads as
no history; an entry without a readable ``end`` is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from app.timefmt import format_timestamp, parse_timestamp

HISTORY_ANNOTATION = "kubevirt-eviction-guard.io/migration-history"
MAX_ENTRIES = 64  # the recorder's bound never exceeds it (see effects/history.py); more is not ours
MAX_VALUE_BYTES = 16 * 1024  # 64 entries take about 8 KB
_OUTCOMES = {"Succeeded": "Succeeded", "Failed": "Failed"}
CAUSES = ("descheduler", "evacuation", "user", "workload-update", "unknown")  # app/policy/cause.py
_CAUSES = {c: c for c in CAUSES}


@dataclass(slots=True, frozen=True)
class HistoryEntry:
    uid: str  # "" when KubeVirt gave none; then the end identifies the migration
    start: float | None
    end: float
    outcome: str = ""
    cause: str = ""  # "" when not known

    @property
    def identity(self) -> str | int:
        return self.uid or int(self.end)  # written to the second


def parse_history(raw: Any) -> tuple[HistoryEntry, ...]:
    """The annotation's entries, oldest first; () for anything unreadable."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_VALUE_BYTES:
        return ()
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ()
    if not isinstance(items, list):
        return ()
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        end = parse_timestamp(item.get("end"))
        if end is None:
            continue
        uid = item.get("uid")
        raw_outcome = item.get("outcome")
        outcome = _OUTCOMES.get(raw_outcome, "") if isinstance(raw_outcome, str) else ""  # our copy, not the document's
        raw_cause = item.get("cause")
        cause = _CAUSES.get(raw_cause, "") if isinstance(raw_cause, str) else ""
        out.append(HistoryEntry(
            uid=uid.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass") if isinstance(uid, str) else "",
            start=parse_timestamp(item.get("start")),
            end=end,
            outcome=outcome,
            cause=cause,
        ))
    out.sort(key=lambda e: e.end)
    return tuple(out[-MAX_ENTRIES:])


def encode_history(entries: Iterable[HistoryEntry]) -> str:
    """The annotation value for ``entries`` (written oldest first)."""
    items = []
    for e in sorted(entries, key=lambda e: e.end):
        item: dict[str, Any] = {"uid": e.uid, "start": format_timestamp(e.start) if e.start is not None else None,
                                "end": format_timestamp(e.end)}
        if e.outcome:
            item["outcome"] = e.outcome
        if e.cause:
            item["cause"] = e.cause
        items.append(item)
    return orjson.dumps(items).decode()
