"""``policy.decide`` alone, on the bench's cluster state and request mix.

The state is loaded the way ``serve`` loads it (``load_snapshot``), the bodies
are decoded once, and every call is timed on its own (``perf_counter_ns``
around one ``decide``), several passes over the mix: the median per call is the
figure the target is about; the mean (what throughput pays) and the medians
per decision reason are reported beside it. ``timeit`` over whole passes
gives the same mean without the per-call timer overhead, as a check.

    python -m bench.decide --snapshot FILE --bodies FILE [--now RFC3339]
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
import timeit
from collections.abc import Sequence
from pathlib import Path

import orjson

from app.admission import review as rv
from app.cluster.snapshot import load_snapshot
from app.domain.view import HEALTHY
from app.policy import decide
from app.policy.model import PolicySettings
from app.timefmt import parse_timestamp
from bench.bodies import read_bodies
from bench.state import NOW_TEXT


def quantile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, max(0, math.ceil(q * len(sorted_ns)) - 1))] / 1e3


def measure(snapshot: Path, bodies: Path, now_text: str, passes: int = 3) -> dict:
    t0 = time.perf_counter()
    store, stats = load_snapshot(snapshot)
    load_s = time.perf_counter() - t0
    now = parse_timestamp(now_text)
    settings = PolicySettings()
    requests = [rv.decode(b.body).eviction for b in read_bodies(bodies)]
    clock = time.perf_counter_ns
    per_reason: dict[str, list[int]] = {}
    samples: list[int] = []
    gc.collect()
    gc.freeze()  # as serve does once the state is loaded
    for _ in range(passes):
        for req in requests:
            t = clock()
            d = decide(req, store, now, settings, HEALTHY)
            elapsed = clock() - t
            samples.append(elapsed)
            per_reason.setdefault(f"{'denied' if d.denied else 'allowed'}:{d.reason}", []).append(elapsed)
    batch = min(timeit.repeat(lambda: [decide(r, store, now, settings, HEALTHY) for r in requests], number=1, repeat=passes))
    samples.sort()
    return {
        "calls": len(samples),
        "median_us": quantile(samples, 0.5),
        "p90_us": quantile(samples, 0.9),
        "p99_us": quantile(samples, 0.99),
        "mean_us": statistics.fmean(samples) / 1e3,
        "timeit_mean_us": batch / len(requests) * 1e6,
        "by_reason": {
            k: {"share": len(v) / len(samples), "median_us": statistics.median(v) / 1e3}
            for k, v in sorted(per_reason.items())
        },
        "snapshot_load_s": load_s,
        "loaded": stats.loaded,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decide", description=__doc__.splitlines()[0])
    p.add_argument("--snapshot", required=True, type=Path)
    p.add_argument("--bodies", required=True, type=Path)
    p.add_argument("--now", default=NOW_TEXT)
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args(argv)
    sys.stdout.write(orjson.dumps(measure(args.snapshot, args.bodies, args.now, args.passes)).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
