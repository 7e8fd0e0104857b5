"""An HTTPS load generator for AdmissionReview POSTs: open loop at a fixed rate, or closed loop.

Open loop (``--rate``): request i is due at ``start + i / rate`` whatever the
server is doing, and its latency is measured from that *intended* time, not
from when a connection was free to send it. A server that stalls therefore
shows the stall in every request that queued behind it (no coordinated
omission). Due requests go to whichever keep-alive connection is idle; when
all are busy they wait, and the wait counts. A thread keeps the clock (sleeping
to the microsecond, which the event loop's millisecond timers cannot); the
generator's own lateness (intended -> sent) is measured and reported, and so is
the service time from the actual send.

Closed loop (``--closed``): every connection sends its next request as soon as
the previous answer arrives; the completed count over the window is the
saturation throughput.

The client is deliberately thin (uvloop, raw asyncio protocol, httptools for
the response, requests serialised once up front) so that it costs a small
fraction of what the server spends per request; ``client_cpu_s`` in the result
shows how much it did cost. Output: one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import ssl
import sys
import time
from array import array
from collections.abc import Sequence
from pathlib import Path

import httptools
import orjson
import uvloop

from bench.bodies import Body, read_bodies

now = time.perf_counter


class Connection(asyncio.Protocol):
    """One keep-alive HTTPS connection with at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.body: list[bytes] = []
        self.lost: Exception | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(e)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("connection closed by server")
        self._fail(self.lost)

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result((self.parser.get_status_code(), b"".join(self.body)))
        self.body = []

    def _fail(self, exc: Exception) -> None:
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_exception(exc)

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        if self.lost is not None:
            raise self.lost
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)  # type: ignore[union-attr]
        return await self.waiter


def serialise(bodies: Sequence[Body], host: str, port: int) -> list[bytes]:
    return [
        (
            f"POST {b.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(b.body)}\r\n\r\n"
        ).encode()
        + b.body
        for b in bodies
    ]


class Tally:
    """Outcomes of the requests of one run."""

    def __init__(self) -> None:
        self.latency: list[float] = []  # seconds, from intended send time (open loop) or send time
        self.service: list[float] = []  # seconds, from actual send time
        self.lag: list[float] = []  # seconds, intended -> actually sent (open loop)
        self.status: dict[int, int] = {}
        self.denied = 0
        self.errors: dict[str, int] = {}

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1

    def answer(self, status: int, body: bytes) -> None:
        self.status[status] = self.status.get(status, 0) + 1
        if b'"allowed":false' in body:
            self.denied += 1


async def connect(host: str, port: int, ctx: ssl.SSLContext, count: int) -> list[Connection]:
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(count):  # one after the other: the handshakes are not what is measured
        _, proto = await loop.create_connection(Connection, host, port, ssl=ctx, server_hostname=host)
        out.append(proto)
    return out


async def open_loop(conns: list[Connection], reqs: list[bytes], rate: float, duration: float, drain: float) -> Tally:
    tally = Tally()
    queue: asyncio.Queue = asyncio.Queue()
    total = max(1, int(rate * duration))

    async def worker(conn: Connection) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            intended, raw = item
            sent = now()
            try:
                status, body = await conn.send(raw)
            except Exception as e:  # a dead connection fails its request; others go on
                tally.error(e)
                continue
            done = now()
            tally.latency.append(done - intended)
            tally.service.append(done - sent)
            tally.lag.append(sent - intended)
            tally.answer(status, body)

    workers = [asyncio.ensure_future(worker(c)) for c in conns]
    loop = asyncio.get_running_loop()
    start = now() + 0.05
    n = len(reqs)

    def due(first: int, last: int) -> None:  # on the loop: requests first..last-1 are due
        for i in range(first, last):
            queue.put_nowait((start + i / rate, reqs[i % n]))

    def pace() -> None:
        """The clock, in a thread: time.sleep wakes within tens of microseconds, the event
        loop's timers only to the millisecond (and uvloop's turn sub-millisecond sleeps
        into a busy loop). While the loop waits for I/O it holds no GIL, so the wake-up
        reaches it at once; while it is busy, the request waits, and the wait counts."""
        i = 0
        while i < total:
            delay = start + i / rate - now()
            if delay > 0:
                time.sleep(delay)
            last = min(total, math.floor((now() - start) * rate) + 1)
            loop.call_soon_threadsafe(due, i, last)
            i = last

    sys.setswitchinterval(0.0002)  # hand the GIL to the pacer promptly when it wakes
    await loop.run_in_executor(None, pace)
    for _ in workers:
        queue.put_nowait(None)
    _, pending = await asyncio.wait(workers, timeout=drain)
    for w in pending:  # bounded: requests still unanswered after the drain are counted, not awaited
        w.cancel()
    unanswered = total - len(tally.latency) - sum(tally.errors.values())
    if unanswered > 0:
        tally.errors["unanswered"] = unanswered
    return tally


async def closed_loop(conns: list[Connection], reqs: list[bytes], duration: float, warmup: float) -> tuple[Tally, float]:
    tally = Tally()
    stop = False
    window_start = now() + warmup
    window_end = window_start + duration
    n = len(reqs)

    async def worker(k: int, conn: Connection) -> None:
        i = k * 7919
        while not stop:
            sent = now()
            try:
                status, body = await conn.send(reqs[i % n])
            except Exception as e:
                tally.error(e)
                return
            done = now()
            i += 1
            if window_start <= sent and done <= window_end:
                tally.latency.append(done - sent)
                tally.answer(status, body)

    workers = [asyncio.ensure_future(worker(k, c)) for k, c in enumerate(conns)]
    await asyncio.sleep(warmup + duration)
    stop = True
    await asyncio.wait(workers, timeout=5)
    for w in workers:
        w.cancel()
    return tally, duration


def percentiles(samples: list[float]) -> dict[str, float]:
    """Milliseconds; nearest-rank percentiles of the exact samples."""
    if not samples:
        return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan, "mean": math.nan}
    s = sorted(samples)

    def rank(q: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] * 1e3

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": s[-1] * 1e3, "mean": sum(s) / len(s) * 1e3}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run(args: argparse.Namespace) -> dict:
    ctx = ssl.create_default_context(cafile=args.cafile)
    bodies = read_bodies(args.bodies)
    reqs = serialise(bodies, args.host, args.port)
    conns = await connect(args.host, args.port, ctx, args.connections)
    cpu0, t0 = cpu_seconds(), now()
    if args.closed:
        tally, window = await closed_loop(conns, reqs, args.duration, args.warmup)
        achieved = len(tally.latency) / window
        mode = {"mode": "closed", "connections": args.connections}
    else:
        tally = await open_loop(conns, reqs, args.rate, args.duration, args.drain)
        achieved = len(tally.latency) / args.duration
        mode = {"mode": "open", "offered_rps": args.rate, "connections": args.connections}
    cpu = cpu_seconds() - cpu0
    wall = now() - t0
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    completed = len(tally.latency)
    return {
        **mode,
        "tool": "python-asyncio",
        "duration_s": args.duration,
        "completed": completed,
        "achieved_rps": achieved,
        "status": {str(k): v for k, v in sorted(tally.status.items())},
        "denied": tally.denied,
        "errors": tally.errors,
        "latency_ms": percentiles(tally.latency),
        "service_ms": percentiles(tally.service) if tally.service else None,
        "send_lag_ms": percentiles(tally.lag) if tally.lag else None,
        "client_cpu_s": cpu,
        "client_cpu_share": cpu / wall if wall > 0 else 0.0,
        "_latencies": tally.latency,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cafile", required=True)
    p.add_argument("--bodies", required=True, type=Path)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0, help="seconds of measured load")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", type=float, help="open loop: requests per second offered")
    g.add_argument("--closed", action="store_true", help="closed loop: as fast as the server answers")
    p.add_argument("--warmup", type=float, default=1.0, help="closed loop: seconds before the window opens")
    p.add_argument("--drain", type=float, default=5.0, help="open loop: seconds to wait for late answers")
    p.add_argument("--samples", type=Path, help="also write every latency (seconds, native float64) to this file")
    args = p.parse_args(argv)
    result = uvloop.run(run(args))
    if args.samples is not None:
        with args.samples.open("wb") as f:
            array("d", result.pop("_latencies")).tofile(f)
    result.pop("_latencies", None)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
