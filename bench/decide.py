"""``policy.decide`` alone, on the bench's cluster state and request mix.

The state is loaded the way ``serve`` loads it (``load_snapshot``), the bodies
are decoded once, and every call is timed on its own (``perf_counter_ns``
around one ``decide``), several passes over the mix: the median per call is the
figure the target is about; the mean (what throughput pays) and the medians
per decision reason are reported beside it. ``timeit`` over whole passes
gives the same mean without the per-call timer overhead, as a check.

    python -m bench.decide --snapshot FILE --bodies FILE [FILE ...] [--now RFC3339] [--answers OUT]

A list with one result per bodies file (a mix), in the order given. ``--answers``: also write each review's answer as the
policy gives it (a JSON object uid -> the AdmissionReview's ``response`` without its uid), for the plain baseline
(``bench.plain``) to answer the same reviews the same way.
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


def measure(snapshot: Path, bodies: Path | list[Path], now_text: str, passes: int = 3,
            answers: dict | None = None) -> dict | list[dict]:
    t0 = time.perf_counter()
    store, stats = load_snapshot(snapshot)
    load_s = time.perf_counter() - t0
    now = parse_timestamp(now_text)
    settings = PolicySettings()
    gc.collect()
    gc.freeze()  # as serve does once the state is loaded
    files = bodies if isinstance(bodies, list) else [bodies]
    out = []
    for path in files:
        reviews = [rv.decode(b.body) for b in read_bodies(path)]
        if answers is not None:
            for review in reviews:
                response = orjson.loads(rv.respond(review, decide(review.eviction, store, now, settings, HEALTHY)))
                response = response["response"]
                answers[response.pop("uid")] = response
        out.append({**_time(store, [r.eviction for r in reviews], now, settings, passes),
                    "snapshot_load_s": load_s, "loaded": stats.loaded})
    return out if isinstance(bodies, list) else out[0]


def _time(store, requests: list, now: float, settings: PolicySettings, passes: int) -> dict:
    clock = time.perf_counter_ns
    per_reason: dict[str, list[int]] = {}
    samples: list[int] = []
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
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decide", description=__doc__.splitlines()[0])
    p.add_argument("--snapshot", required=True, type=Path)
    p.add_argument("--bodies", required=True, type=Path, nargs="+")
    p.add_argument("--now", default=NOW_TEXT)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--answers", type=Path, help="also write each review's answer here (uid -> response)")
    args = p.parse_args(argv)
    answers: dict | None = {} if args.answers else None
    result = measure(args.snapshot, list(args.bodies), args.now, args.passes, answers)
    if args.answers:
        args.answers.write_bytes(orjson.dumps(answers))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
