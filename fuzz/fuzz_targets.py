"""Coverage-guided fuzzing (atheris/libFuzzer) of the code that takes untrusted bytes.

    make fuzz                      # every target, 60 s each
    python fuzz/fuzz_targets.py http -max_total_time=600

A target fails only on an exception that is not the parser's own error type
(or on a crash): every input must decode, or be rejected with BadReview /
SnapshotError. The admission target also runs policy on what decodes. The http
target feeds the bytes to one connection of the guard's HTTP server
(app/transport/http.py) in reads cut where the input says; it fails when an
exception escapes the server, when it writes anything but whole answers, or when
a request it handed to the app was over a budget.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from app.admission import review as rv
    from app.cluster.snapshot import SnapshotError, load_snapshot
    from app.cluster.store import ClusterStore
    from app.policy import PolicySettings, decide
    from app.transport.http import Connection, HttpLimits, Listener

STORE, SETTINGS = ClusterStore(), PolicySettings()
TMP = Path(tempfile.mkdtemp()) / "snapshot"


def admission(data: bytes) -> None:
    try:
        review = rv.decode(data)
    except rv.BadReview:
        return
    rv.respond(review, decide(review.eviction, STORE, 0.0, SETTINGS))


def snapshot(data: bytes) -> None:
    TMP.write_bytes(data)
    try:
        load_snapshot(TMP)
    except SnapshotError:
        pass


LIMITS = HttpLimits(max_header_bytes=1024, max_headers=16, max_body_bytes=2048)
LOOP = asyncio.new_event_loop()


class Wire:
    def __init__(self) -> None:
        self.out, self.closing = bytearray(), False

    def write(self, data: bytes) -> None:
        if self.closing:
            raise AssertionError("written after close")
        self.out += data

    def close(self) -> None:
        self.closing = True

    abort = close

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    resume_reading = pause_reading

    def get_extra_info(self, name: str) -> None:
        return None


async def asked(scope, receive, send) -> None:
    body = (await receive())["body"]
    if len(body) > LIMITS.max_body_bytes or len(scope["headers"]) > LIMITS.max_headers:
        raise AssertionError(f"over a budget: {len(body)} body bytes, {len(scope['headers'])} headers")
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def one_connection(data: bytes) -> bytes:
    fdp = atheris.FuzzedDataProvider(data)
    cuts = sorted(fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 8)))
    stream = fdp.ConsumeBytes(fdp.remaining_bytes())
    conn, wire = Connection(Listener(asked, LIMITS)), Wire()
    conn.connection_made(wire)  # type: ignore[arg-type]
    edges = [0, *cuts, len(stream)]
    for a, b in itertools.pairwise(edges):
        if a < b:
            conn.data_received(stream[a:b])
    if not wire.closing:
        conn.eof_received()
    conn.connection_lost(None)
    return bytes(wire.out)


def http(data: bytes) -> None:
    out = LOOP.run_until_complete(one_connection(data))
    if out and not out.startswith(b"HTTP/1.1 "):
        raise AssertionError(f"not an answer: {out[:80]!r}")


TARGETS = {"admission": admission, "snapshot": snapshot, "http": http}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
