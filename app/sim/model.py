"""Nodes, VMs and load profiles: the hardware and the workload of a simulated cluster.

Load is sampled on a fixed grid (every ``sample_interval`` seconds), the way
Prometheus sees it: a profile answers "what fraction of its vCPUs (or of its
memory) does this VM use at time t". Random walks draw from one generator in a
fixed order at every sample, so every guard mode sees exactly the same load.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


def clamp(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo if x < lo else hi if x > hi else x


class Profile:
    """A load level in [0, 1] over time, optionally overridden by step changes."""

    def __init__(self, steps: tuple[tuple[int, float], ...] = ()) -> None:
        self.steps = steps  # (at, level), sorted by time

    def base(self, t: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def tick(self, rng: random.Random) -> None:
        """Advance one sample (random walks draw here; others ignore it)."""

    def value(self, t: int) -> float:
        level = None
        for at, step_level in self.steps:
            if at > t:
                break
            level = step_level
        return clamp(self.base(t) if level is None else level)


class Steady(Profile):
    def __init__(self, level: float, steps=()) -> None:
        super().__init__(steps)
        self.level = level

    def base(self, t: int) -> float:
        return self.level


class Wave(Profile):
    """A daily (or any period) sine wave: office hours, batch windows."""

    def __init__(self, mean: float, amplitude: float, period: int, phase: float, steps=()) -> None:
        super().__init__(steps)
        self.mean, self.amplitude, self.period, self.phase = mean, amplitude, period, phase

    def base(self, t: int) -> float:
        return self.mean + self.amplitude * math.sin(2 * math.pi * (t / self.period + self.phase))


class Walk(Profile):
    """A random walk reflected into [lo, hi]: load that drifts with no pattern."""

    def __init__(self, start: float, sigma: float, lo: float, hi: float, steps=()) -> None:
        super().__init__(steps)
        self.x, self.sigma, self.lo, self.hi = start, sigma, lo, hi

    def tick(self, rng: random.Random) -> None:
        x = self.x + rng.gauss(0.0, self.sigma)
        if x < self.lo:
            x = 2 * self.lo - x
        if x > self.hi:
            x = 2 * self.hi - x
        self.x = clamp(x, self.lo, self.hi)

    def base(self, t: int) -> float:
        return self.x


@dataclass(slots=True)
class Node:
    index: int
    name: str
    cpu: float  # cores
    memory: float  # GiB
    failure_probability: float | None = None  # overrides the cluster's for migrations *from* this node
    cordoned: bool = False
    soft_tainted: bool = False  # PreferNoSchedule from the soft-tainter
    # requests of the pods on the node (VM pods and migration target pods)
    req_cpu: float = 0.0
    req_mem: float = 0.0


@dataclass(slots=True)
class VM:
    index: int
    name: str
    group: str
    vcpus: float
    memory: float  # GiB: what a migration has to copy
    dirty_rate: float  # GiB/s of guest memory written while running
    cpu_load: Profile = field(repr=False)
    memory_load: Profile = field(repr=False)
