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


# What Go's time.Parse(time.RFC3339, s) accepts, which is how the plugin and
# kube-apiserver read timestamps: a 1- or 2-digit hour (Parse's "15" is not
# zero-padded), a fractional second after "." or "," of any length (cut to
# nanoseconds), "Z" or an offset up to 24:60 (Parse's range test is ">").
# Upper case "T" and "Z" only; no spaces, no missing zone, nothing after.
_GO_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"(?:[.,]([0-9]+))?(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))"
)


_fromisoformat = datetime.fromisoformat


def parse_timestamp(value: object) -> float | None:
    """A timestamp as Go's ``time.Parse(time.RFC3339, ...)`` reads it -> epoch seconds.

    None when absent or when Go would refuse it (the plugin fails open on those, and so
    does the guard): zone-less, space-separated, compact and date-only forms included.
    Year 0, which Go reads and Python cannot represent, is refused too.
    """
    if value.__class__ is str and len(value) == 20 and value[19] == "Z" and value[10] == "T" and value[4] == "-" \
            and value[7] == "-" and value[13] == ":" and value[16] == ":":
        # how Kubernetes writes every timestamp (metav1.Time): the C parser, about six times faster. In this
        # shape it accepts exactly what the general path below accepts (tests/test_timefmt.py compares them).
        try:
            return _fromisoformat(value).timestamp()
        except ValueError:
            return None
    if not isinstance(value, str) or not value:
        return None
    m = _GO_RFC3339.fullmatch(value)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    if hour > 23 or minute > 59 or second > 59:
        return None
    try:
        dt = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError:  # month or day out of range (Go checks the day against the month too)
        return None
    epoch = dt.timestamp()
    fraction = m.group(7)
    if fraction:
        epoch += int(fraction[:9]) / 10 ** len(fraction[:9])
    if m.group(8) is None:
        off_h, off_m = int(m.group(10)), int(m.group(11))
        if off_h > 24 or off_m > 60:
            return None
        offset = off_h * 3600 + off_m * 60
        epoch -= offset if m.group(9) == "+" else -offset
    return epoch


def format_timestamp(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
