"""The descheduler operator's ``descheduler:node:actuation_priority:p66_5m``, as its recording rules compute it.

The rules (the operator's PrometheusRule ``descheduler-rules``, group ``recordingRules.rules``):

- per node and dimension (CPU use, CPU pressure, memory use, memory pressure) the positive deviation from the
  workers' average of the 1-minute value (``...:avg1m:positivedeviation``);
- the 66th percentile of each over the last 5 minutes (``quantile_over_time(0.66, ...[5m])``), per dimension
  before the distance;
- the distance: 3 x the Euclidean norm of the four, capped at 1 (``...:k3:p66_5m``);
- times the node's cooldown multiplier ``clamp_min(1 - 0.1 x eviction_count:10m, 0.01)``, where
  ``eviction_count:10m`` is ``increase(descheduler_pods_evicted_total{strategy="LowNodeUtilization",
  result="success"}[10m])`` summed by node.

What the descheduler (v0.36) counts as ``result="success"`` for LowNodeUtilization: an eviction the API server
allowed at once, when it was made; a background eviction (KubeVirt's 429 "Eviction triggered evacuation") is
counted ``background`` then, and ``success`` only if its pod is deleted while the assumed entry is still in the
in-flight cache. A migrated VM's source virt-launcher exits and its pod turns Succeeded before it is ever
deleted, and that update takes the entry out of the cache first; so a live-migrated VM's eviction never counts
as a success and the multiplier stays 1 for nodes whose VMs all live-migrate. ``count_background`` models the
rule's intent instead (every finished background eviction counted when its source pod goes): a what-if, not
what runs.

Departures: the model's load samples (``sampleInterval``, 60 s by default) stand for the 1-minute values the
rules evaluate every 30 s, so the 5-minute window holds the samples taken in the last 300 s; ``increase`` is the
count of successes in the last 600 s (Prometheus extrapolates a counter's increase to the window's edges and
misses the first increment of a new series; neither is modelled).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

QUANTILE, WINDOW, COOLDOWN_WINDOW = 0.66, 300, 600
AMPLIFICATION, PER_EVICTION, FLOOR = 3.0, 0.10, 0.01


def quantile(q: float, values: Sequence[float]) -> float:
    """PromQL's ``quantile_over_time``: rank q x (n - 1) in the sorted values, linearly interpolated."""
    xs = sorted(values)
    rank = q * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def positive_deviations(dims: Sequence[Sequence[float]]) -> list[tuple[float, ...]]:
    """Per node, each dimension's excess over the workers' average (0 below it)."""
    if not dims:
        return []
    k = len(dims[0])
    avg = [sum(d[i] for d in dims) / len(dims) for i in range(k)]
    return [tuple(max(0.0, d[i] - avg[i]) for i in range(k)) for d in dims]


def cooldown_multiplier(successes: int) -> float:
    return max(FLOOR, 1.0 - PER_EVICTION * successes)


class ActuationPriority:
    """Feed it every load sample (``record``); it returns the value per node in the descheduler's points."""

    def __init__(self) -> None:
        self.window: deque[tuple[int, list[tuple[float, ...]]]] = deque()
        self.successes: deque[tuple[int, str]] = deque()  # (time, node) of each counted success

    def success(self, now: int, node: str) -> None:
        self.successes.append((now, node))

    def record(self, now: int, names: Sequence[str], dims: Sequence[Sequence[float]]) -> list[int]:
        self.window.append((now, positive_deviations(dims)))
        while self.window and self.window[0][0] <= now - WINDOW:
            self.window.popleft()
        while self.successes and self.successes[0][0] <= now - COOLDOWN_WINDOW:
            self.successes.popleft()
        counts: dict[str, int] = {}
        for _, node in self.successes:
            counts[node] = counts.get(node, 0) + 1
        out = []
        for i, name in enumerate(names):
            per_dim = [quantile(QUANTILE, [devs[i][j] for _, devs in self.window]) for j in range(len(dims[i]))]
            distance = min(1.0, AMPLIFICATION * math.sqrt(sum(x * x for x in per_dim)))
            value = distance * cooldown_multiplier(counts.get(name, 0))
            out.append(int(value * 100 + 1e-9))
        return out
