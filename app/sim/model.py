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

    def tick(self, rng: random.Random, t: int) -> None:
        """Advance one sample (random walks and spikes draw here; others ignore it)."""

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

    def tick(self, rng: random.Random, t: int) -> None:
        x = self.x + rng.gauss(0.0, self.sigma)
        if x < self.lo:
            x = 2 * self.lo - x
        if x > self.hi:
            x = 2 * self.hi - x
        self.x = clamp(x, self.lo, self.hi)

    def base(self, t: int) -> float:
        return self.x


class Spikes(Profile):
    """A base level with hot spots: every ``every`` seconds (a range, drawn each time) the
    VM turns hot with ``probability`` for ``duration`` seconds, optionally only within
    the hours of the day [``hours_from``, ``hours_to``). Hot spots, random spikes and
    batch windows of the reference authors' pilot are each one of these."""

    def __init__(self, base: float, level: float, every: tuple[int, int], probability: float, duration: int,
                 hours: tuple[float, float] | None = None, steps=()) -> None:
        super().__init__(steps)
        self.level_base, self.level = base, level
        self.every, self.probability, self.duration, self.hours = every, probability, duration, hours
        self.next_at: int | None = None
        self.hot_until = -1

    def tick(self, rng: random.Random, t: int) -> None:
        if self.next_at is None:
            self.next_at = t + rng.randint(0, self.every[1])
        while t >= self.next_at:
            in_hours = self.hours is None or self.hours[0] <= (self.next_at % 86400) / 3600 < self.hours[1]
            if in_hours and rng.random() < self.probability:
                self.hot_until = self.next_at + self.duration
            self.next_at += rng.randint(self.every[0], self.every[1])

    def base(self, t: int) -> float:
        return self.level if t < self.hot_until else self.level_base


TAINT_AUTOSCALER = "ToBeDeletedByClusterAutoscaler"


@dataclass(slots=True)
class Node:
    index: int
    name: str
    cpu: float  # cores
    memory: float  # GiB
    failure_probability: float | None = None  # overrides the cluster's for migrations *from* this node
    network: float | None = None  # GiB/s of the node's NIC (None: the cluster's), shared by outbound migrations
    cordoned: bool = False
    no_schedule: str = ""  # a NoSchedule taint key (cluster-autoscaler's drain), "" for none
    soft_taints: int = 0  # PreferNoSchedule taints from the soft-tainter (0, 1 or 2)
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
    failure_probability: float | None = None  # overrides node and cluster: transient failures of its migrations
    target_unschedulable: bool = False  # its target pod never schedules (affinity, devices): every attempt fails
