"""Text from a request on its way into an Event or a log line: printable, and short.

Anyone who can reach the webhook chooses the user name, the requester, the
reason and the pod name of a review. Kept as sent, a newline would forge a log
line in a text log, an ANSI escape would repaint the terminal of whoever reads
``kubectl describe``, and a 100 KiB field would make every line about it 100 KiB.
"""

from __future__ import annotations

MAX_FIELD = 200  # characters of a name, user, requester or reason (Kubernetes names are at most 253)
MAX_MESSAGE = 1024


def _escaped(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(value: str, limit: int = MAX_FIELD) -> str:
    """``value`` with every character ``str.isprintable`` refuses (controls, line and paragraph separators,
    bidirectional overrides, ...) written as a backslash escape, and cut to ``limit`` characters ("..." at
    the end when cut)."""
    if len(value) <= limit and value.isprintable():
        return value
    text = "".join(c if c.isprintable() else _escaped(c) for c in value[: limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."
