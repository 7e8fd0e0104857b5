"""Go-style durations and RFC 3339 timestamps, the two time formats the guard speaks.

Durations are written and read the way Go's ``time.Duration`` does (``90s``,
``15m``, ``1h30m``), because that is how the descheduler, KubeVirt and the
reference plugin spell them and what an admin will paste from their configs.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration (``15m``, ``1h30m``, ``0``) into seconds.

    Raises ``ValueError`` naming the text when it is not a Go duration.
    Negative values parse (``-5m``); settings validation rejects them with the
    setting's name.
    """
    if not isinstance(text, str):
        raise ValueError(f"not a duration: {text!r}")
    s = text.strip()
    sign = 1.0
    if s and s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"not a duration: {text!r}")
    total, pos = 0.0, 0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"not a duration: {text!r} (write it the Go way: 90s, 15m, 1h30m)")
    return sign * total


def format_duration(seconds: float) -> str:
    """Format seconds as Go's ``Duration.String()`` does, rounded to the second."""
    total = int(round(seconds))
    if total == 0:
        return "0s"
    sign = "-" if total < 0 else ""
    total = abs(total)
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{sign}{h}h{m}m{s}s"
    if m:
        return f"{sign}{m}m{s}s"
    return f"{sign}{s}s"


def parse_timestamp(value: object) -> float | None:
    """RFC 3339 timestamp as the API server writes it -> epoch seconds; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def format_timestamp(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
