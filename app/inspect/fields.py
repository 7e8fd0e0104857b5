"""What ``explain`` and ``report`` print, as plain data: durations in seconds, times in RFC 3339.

The text, JSON and YAML views render the same mapping; a new field is added once, to
the mapping, and the text view decides whether to show it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TextIO

import yaml

from app.policy.model import Decision, Reason
from app.timefmt import format_duration, format_timestamp

DENIED_CODE = 429  # what the guard answers a denied eviction with (TooManyRequests)
ALLOWED_CODE = 200


def seconds(value: float | None) -> float | int | None:
    """A duration for JSON/YAML: seconds, whole when it is whole."""
    if value is None:
        return None
    value = round(float(value), 3)
    return int(value) if value.is_integer() else value


def timestamp(epoch: float | None) -> str | None:
    return None if epoch is None else format_timestamp(epoch)


def duration_text(value: float | None, missing: str = "-") -> str:
    """A duration from the mapping, for the text view (Go's spelling)."""
    return missing if value is None else format_duration(value)


def decision_fields(d: Decision) -> dict[str, Any]:
    """The judgement itself, as the webhook would answer it."""
    return {
        "allowed": d.allowed,
        "code": ALLOWED_CODE if d.allowed else DENIED_CODE,
        "reason": d.reason,
        "message": d.message,
    }


# report's STATE column: a word for what the decision means for the VM. Any other denial shows
# its reason with dashes; any other allowance (a fail-open one) is "movable": the guard lets it go.
STATES = {
    Reason.ALLOWED: "movable",
    Reason.COOLDOWN: "cooldown",
    Reason.MIGRATION_IN_PROGRESS: "migrating",
    Reason.MIGRATION_TARGET: "migration-target",
    Reason.EVACUATION_PENDING: "evacuation-pending",
    Reason.EVACUATION_STUCK: "evacuation-stuck",
    Reason.PREFER_NO_EVICTION: "prefer-no-eviction",
    Reason.NOT_MIGRATABLE: "not-migratable",
    Reason.NODE_BUSY: "node-busy",
    Reason.NODE_COOLDOWN: "node-cooldown",
    Reason.TARGET_NODE_COOLDOWN: "target-node-cooldown",
}
NO_POD_STATE = "no-launcher-pod"


def state_of(d: Decision) -> str:
    if d.reason in STATES:
        return STATES[d.reason]
    return "movable" if d.allowed else d.reason.replace("_", "-")


def table(header: list[str], rows: list[list[str]], indent: str = "") -> str:
    """Columns padded to their widest cell, trailing blanks cut."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "".join(indent + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n"
                   for r in [header, *rows])


def emit(model: dict[str, Any], fmt: str, text: Callable[[dict[str, Any]], str], out: TextIO) -> None:
    if fmt == "json":
        out.write(json.dumps(model, indent=2) + "\n")
    elif fmt == "yaml":
        yaml.safe_dump(model, out, sort_keys=False, default_flow_style=False, allow_unicode=True)
    else:
        out.write(text(model))
