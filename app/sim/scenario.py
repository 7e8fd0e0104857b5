"""Scenario files: the cluster, its workload, and the settings of every component.

A scenario is YAML (see ``examples/scenarios/``). Durations are written the Go
way (``90s``, ``15m``, ``1h``) or as plain seconds. The guard's settings use the
names of its ``--config`` file (docs/decisions.md) and go through the same parser and
validation, so a scenario that runs is a configuration that would start.
Every mistake raises ``ScenarioError`` naming the file and the key.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config import SETTING_NAMES, SettingsError, build_settings, read_yaml_file
from app.policy.model import PolicySettings
from app.sim.model import VM, Node, Profile, Spikes, Steady, Walk, Wave
from app.timefmt import parse_duration

PLUGIN_NAMES = ("migrationCooldown", "maxMigrationCooldown", "migrationHistoryWindow")
EVENT_KINDS = ("drain", "deschedulerRestart")
DRAIN_KINDS = ("cordon", "autoscaler")
# drains: kubectl drain (cordon, evict) or cluster-autoscaler (taint ToBeDeletedByClusterAutoscaler, evict)
GIB_PER_GBIT = 1e9 / 8 / 2**30


class ScenarioError(ValueError):
    """A scenario file the simulator refuses; the text names the file and the key."""


@dataclass(frozen=True)
class KubeVirtSettings:
    parallel_migrations_per_cluster: int = 5
    parallel_outbound_migrations_per_node: int = 2
    network: float = 10 * GIB_PER_GBIT  # GiB/s of a node's NIC, shared by its outbound migrations
    completion_timeout_per_gib: float = 150.0
    progress_timeout: float = 150.0
    unschedulable_timeout: int = 300  # a target pod that cannot schedule fails the VMIM
    setup_seconds: int = 10  # target pod scheduling and start before copying begins
    failure_probability: float = 0.0
    migration_cpu_overhead: float = 1.0  # cores used on each end while a migration runs
    cpu_allocation_ratio: float = 10.0  # a VM's pod requests vCPUs / ratio
    retained_finished_migrations: int = 5
    backoff_initial: int = 20
    # KubeVirt's MigrationPriorityQueue feature gate: Beta and off by default in v1.8 (GA, always on, in v1.9)
    migration_priority_queue: bool = False
    # virt-handler's node heartbeat: every interval x (1 + jitter x U[0,1)) s (pkg/virt-handler/vm.go:191,
    # pkg/virt-handler/heartbeat/heartbeat.go:96); each is a Node update that wakes the evacuation controller
    heartbeat_interval: int = 60
    heartbeat_jitter: float = 1.2
    # a failed migration's target virt-launcher exits this long after the failure (its pod then counts as gone)
    target_exit_seconds: int = 1


@dataclass(frozen=True)
class DeschedulerSettings:
    interval: int = 60  # virt-platform-autopilot's value
    first_run: int = 300
    soft_tainter_interval: int = 60
    low: float = 0.0
    high: float = 10.0
    eviction_limit_node: int = 2  # evictionLimits.node: pods taken from each overutilised node
    max_per_node: int = 2  # maxNoOfPodsToEvictPerNode
    max_total: int = 5  # maxNoOfPodsToEvictTotal
    assumption_timeout: int = 600
    sweep_interval: int = 600


@dataclass(frozen=True)
class Event:
    at: int
    kind: str
    node: str = ""
    uncordon_after: int = 0  # 0: stays cordoned
    how: str = "cordon"  # drains: cordon (kubectl drain) or autoscaler (ToBeDeletedByClusterAutoscaler taint)


@dataclass
class Scenario:
    name: str
    description: str
    hours: float
    seed: int
    nodes: list[Node]
    vms: list[VM]
    kubevirt: KubeVirtSettings
    descheduler: DeschedulerSettings
    plugin: PolicySettings
    guard: PolicySettings
    guard_raw: dict = field(default_factory=dict)  # the scenario's guard block as written (CLI overrides merge in)
    events: list[Event] = field(default_factory=list)
    sample_interval: int = 60
    step_times: list[int] = field(default_factory=list)  # times of load steps
    placement: list[int] | None = None  # node index per VM (from a snapshot); None: the scheduler places them
    history_hook: Any = None  # called with the KubeVirt model before the run (a snapshot's recent migrations)

    @property
    def duration(self) -> int:
        return int(self.hours * 3600)


# ---- parsing helpers ---------------------------------------------------------


class _Ctx:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {key}: {msg}")

    def mapping(self, value: Any, key: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        return value

    def known(self, d: dict, key: str, names) -> None:
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise self.fail(key, f"unknown key(s): {', '.join(map(str, unknown))}")

    def seconds(self, value: Any, key: str, minimum: float = 0) -> int:
        if isinstance(value, bool):
            raise self.fail(key, f"not a duration: {value!r}")
        if isinstance(value, (int, float)):
            s = float(value)
        else:
            try:
                s = parse_duration(value)
            except ValueError as e:
                raise self.fail(key, str(e)) from None
        if s < minimum:
            raise self.fail(key, f"must be at least {minimum}s, got {value!r}")
        return int(math.ceil(s))

    def number(self, value: Any, key: str, lo: float | None = None, hi: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.fail(key, f"must be within [{lo}, {hi}], got {value!r}")
        return float(value)

    def integer(self, value: Any, key: str, lo: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise self.fail(key, f"expected an integer >= {lo}, got {value!r}")
        return value


def _names(prefix: str, count: int | None) -> list[str]:
    if count is None:
        return [prefix]
    width = max(2, len(str(count - 1)))
    return [f"{prefix}-{i:0{width}d}" for i in range(count)]


def _profile(ctx: _Ctx, raw: Any, key: str, rng: random.Random) -> Profile:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return Steady(ctx.number(raw, key, 0, 1))
    d = ctx.mapping(raw, key)
    kind = d.get("profile", "steady")
    steps = tuple(sorted(
        (ctx.seconds(s.get("at"), f"{key}.steps.at"), ctx.number(s.get("level"), f"{key}.steps.level", 0, 1))
        for s in (ctx.mapping(s, f"{key}.steps") for s in d.get("steps") or [])
    ))
    if kind == "steady":
        ctx.known(d, key, ("profile", "level", "steps"))
        return Steady(ctx.number(d.get("level", 0.5), f"{key}.level", 0, 1), steps)
    if kind == "wave":
        ctx.known(d, key, ("profile", "mean", "amplitude", "period", "phase", "steps"))
        phase_raw = d.get("phase", "random")
        phase = rng.random() if phase_raw == "random" else ctx.number(phase_raw, f"{key}.phase", 0, 1)
        return Wave(
            ctx.number(d.get("mean", 0.5), f"{key}.mean", 0, 1),
            ctx.number(d.get("amplitude", 0.2), f"{key}.amplitude", 0, 1),
            ctx.seconds(d.get("period", "24h"), f"{key}.period", minimum=60),
            phase,
            steps,
        )
    if kind == "walk":
        ctx.known(d, key, ("profile", "start", "sigma", "min", "max", "steps"))
        lo = ctx.number(d.get("min", 0.0), f"{key}.min", 0, 1)
        hi = ctx.number(d.get("max", 1.0), f"{key}.max", lo, 1)
        start = d.get("start", "random")
        x = lo + (hi - lo) * rng.random() if start == "random" else ctx.number(start, f"{key}.start", lo, hi)
        return Walk(x, ctx.number(d.get("sigma", 0.02), f"{key}.sigma", 0, 1), lo, hi, steps)
    if kind == "spikes":
        ctx.known(d, key, ("profile", "base", "level", "every", "probability", "duration", "hours", "steps"))
        every_raw = d.get("every", "15m")
        every = every_raw if isinstance(every_raw, list) else [every_raw, every_raw]
        if len(every) != 2:
            raise ctx.fail(f"{key}.every", "a duration or [min, max]")
        lo_e, hi_e = (ctx.seconds(e, f"{key}.every", minimum=1) for e in every)
        hours = d.get("hours")
        if hours is not None and (not isinstance(hours, list) or len(hours) != 2):
            raise ctx.fail(f"{key}.hours", "expected [from, to] hours of the day")
        return Spikes(
            ctx.number(d.get("base", 0.1), f"{key}.base", 0, 1), ctx.number(d.get("level", 0.9), f"{key}.level", 0, 1),
            (lo_e, max(lo_e, hi_e)), ctx.number(d.get("probability", 0.1), f"{key}.probability", 0, 1),
            ctx.seconds(d.get("duration", "5m"), f"{key}.duration", minimum=1),
            None if hours is None else (ctx.number(hours[0], f"{key}.hours", 0, 24), ctx.number(hours[1], f"{key}.hours", 0, 24)),
            steps,
        )
    raise ctx.fail(f"{key}.profile", f"must be steady, wave, walk or spikes, got {kind!r}")


def _nodes(ctx: _Ctx, raw: Any) -> list[Node]:
    if not isinstance(raw, list) or not raw:
        raise ctx.fail("nodes", "expected a non-empty list of node groups")
    nodes: list[Node] = []
    for i, g in enumerate(raw):
        key = f"nodes[{i}]"
        g = ctx.mapping(g, key)
        ctx.known(g, key, ("name", "count", "cpu", "memoryGiB", "migrationFailureProbability", "networkGbps"))
        if not isinstance(g.get("name"), str):
            raise ctx.fail(f"{key}.name", "required")
        count = ctx.integer(g["count"], f"{key}.count", 1) if "count" in g else None
        fp = g.get("migrationFailureProbability")
        for name in _names(g["name"], count):
            nodes.append(Node(
                index=len(nodes), name=name,
                cpu=ctx.number(g.get("cpu", 64), f"{key}.cpu", 1),
                memory=ctx.number(g.get("memoryGiB", 256), f"{key}.memoryGiB", 1),
                failure_probability=None if fp is None else ctx.number(fp, f"{key}.migrationFailureProbability", 0, 1),
                network=None if "networkGbps" not in g else
                ctx.number(g["networkGbps"], f"{key}.networkGbps", 0.01) * GIB_PER_GBIT,
            ))
    if len({n.name for n in nodes}) != len(nodes):
        raise ctx.fail("nodes", "node names are not unique")
    if len(nodes) < 2:
        raise ctx.fail("nodes", "at least two nodes are needed for a migration")
    return nodes


def _vms(ctx: _Ctx, raw: Any, rng: random.Random) -> list[VM]:
    if not isinstance(raw, list) or not raw:
        raise ctx.fail("vms", "expected a non-empty list of VM groups")
    vms: list[VM] = []
    for i, g in enumerate(raw):
        key = f"vms[{i}]"
        g = ctx.mapping(g, key)
        ctx.known(g, key, ("name", "count", "cpu", "memoryGiB", "dirtyRateMiBps", "dirtyRateMbps", "cpuLoad",
                           "memoryLoad", "migrationFailureProbability", "targetUnschedulable"))
        if not isinstance(g.get("name"), str):
            raise ctx.fail(f"{key}.name", "required")
        count = ctx.integer(g["count"], f"{key}.count", 1) if "count" in g else None
        for name in _names(g["name"], count):
            vms.append(VM(
                index=len(vms), name=name, group=g["name"],
                vcpus=ctx.number(g.get("cpu", 4), f"{key}.cpu", 0.1),
                memory=ctx.number(g.get("memoryGiB", 8), f"{key}.memoryGiB", 0.1),
                dirty_rate=_dirty_rate(ctx, g, key, rng),
                cpu_load=_profile(ctx, g.get("cpuLoad", 0.5), f"{key}.cpuLoad", rng),
                memory_load=_profile(ctx, g.get("memoryLoad", 0.5), f"{key}.memoryLoad", rng),
                failure_probability=None if "migrationFailureProbability" not in g else
                ctx.number(g["migrationFailureProbability"], f"{key}.migrationFailureProbability", 0, 1),
                target_unschedulable=bool(g.get("targetUnschedulable", False)),
            ))
    if len({v.name for v in vms}) != len(vms):
        raise ctx.fail("vms", "VM names are not unique")
    return vms


def _dirty_rate(ctx: _Ctx, g: dict, key: str, rng: random.Random) -> float:
    """GiB/s. ``dirtyRateMiBps`` or ``dirtyRateMbps`` (megabits, as the pilot's figures), a
    number or [min, max] drawn per VM."""
    if "dirtyRateMbps" in g:
        name, scale = "dirtyRateMbps", 1e6 / 8 / 2**30
    else:
        name, scale = "dirtyRateMiBps", 1 / 1024
    raw = g.get(name, 50)
    if isinstance(raw, list):
        if len(raw) != 2:
            raise ctx.fail(f"{key}.{name}", "a number or [min, max]")
        lo, hi = (ctx.number(x, f"{key}.{name}", 0) for x in raw)
        return rng.uniform(lo, max(lo, hi)) * scale
    return ctx.number(raw, f"{key}.{name}", 0) * scale


def _kubevirt(ctx: _Ctx, raw: Any) -> KubeVirtSettings:
    d = ctx.mapping(raw, "kubevirt")
    names = {
        "parallelMigrationsPerCluster": ("parallel_migrations_per_cluster", "int"),
        "parallelOutboundMigrationsPerNode": ("parallel_outbound_migrations_per_node", "int"),
        "networkGbps": ("network", "gbps"),
        "completionTimeoutPerGiB": ("completion_timeout_per_gib", "dur"),
        "progressTimeout": ("progress_timeout", "dur"),
        "unschedulableTimeout": ("unschedulable_timeout", "dur"),
        "migrationSetup": ("setup_seconds", "dur"),
        "migrationFailureProbability": ("failure_probability", "prob"),
        "migrationCpuOverhead": ("migration_cpu_overhead", "num"),
        "cpuAllocationRatio": ("cpu_allocation_ratio", "num"),
        "migrationPriorityQueue": ("migration_priority_queue", "bool"),
        "heartbeatInterval": ("heartbeat_interval", "dur1"),
        "heartbeatJitter": ("heartbeat_jitter", "num"),
        "targetExitSeconds": ("target_exit_seconds", "dur"),
    }
    ctx.known(d, "kubevirt", names)
    kwargs: dict[str, Any] = {}
    for name, (attr, kind) in names.items():
        if name not in d:
            continue
        key = f"kubevirt.{name}"
        if kind == "int":
            kwargs[attr] = ctx.integer(d[name], key, 1)
        elif kind == "dur":
            kwargs[attr] = ctx.seconds(d[name], key)
        elif kind == "dur1":
            kwargs[attr] = ctx.seconds(d[name], key, 1)
        elif kind == "gbps":
            kwargs[attr] = ctx.number(d[name], key, 0.01) * GIB_PER_GBIT
        elif kind == "prob":
            kwargs[attr] = ctx.number(d[name], key, 0, 1)
        elif kind == "bool":
            if not isinstance(d[name], bool):
                raise ctx.fail(key, "true or false")
            kwargs[attr] = d[name]
        else:
            kwargs[attr] = ctx.number(d[name], key, 0)
    return KubeVirtSettings(**kwargs)


def _descheduler(ctx: _Ctx, raw: Any) -> DeschedulerSettings:
    d = ctx.mapping(raw, "descheduler")
    ctx.known(d, "descheduler", ("interval", "firstRun", "softTainterInterval", "deviationThresholds",
                                 "evictionLimitsNode", "maxNoOfPodsToEvictPerNode", "maxNoOfPodsToEvictTotal"))
    kwargs: dict[str, Any] = {}
    if "interval" in d:
        kwargs["interval"] = ctx.seconds(d["interval"], "descheduler.interval", minimum=1)
    if "softTainterInterval" in d:
        kwargs["soft_tainter_interval"] = ctx.seconds(d["softTainterInterval"], "descheduler.softTainterInterval", 1)
    if "firstRun" in d:
        kwargs["first_run"] = ctx.seconds(d["firstRun"], "descheduler.firstRun")
    th = ctx.mapping(d.get("deviationThresholds"), "descheduler.deviationThresholds")
    ctx.known(th, "descheduler.deviationThresholds", ("low", "high"))
    if "low" in th:
        kwargs["low"] = ctx.number(th["low"], "descheduler.deviationThresholds.low", 0, 100)
    if "high" in th:
        kwargs["high"] = ctx.number(th["high"], "descheduler.deviationThresholds.high", 0, 100)
    for name, attr in (("evictionLimitsNode", "eviction_limit_node"), ("maxNoOfPodsToEvictPerNode", "max_per_node"),
                       ("maxNoOfPodsToEvictTotal", "max_total")):
        if name in d:
            kwargs[attr] = ctx.integer(d[name], f"descheduler.{name}", 1)
    return DeschedulerSettings(**kwargs)


def _policy(ctx: _Ctx, raw: Any, key: str, allowed) -> PolicySettings:
    d = ctx.mapping(raw, key)
    ctx.known(d, key, allowed)
    try:
        return build_settings(d)
    except SettingsError as e:
        raise ctx.fail(key, str(e)) from None


def _events(ctx: _Ctx, raw: Any, nodes: list[Node]) -> list[Event]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ctx.fail("events", "expected a list")
    names = {n.name for n in nodes}
    events = []
    for i, e in enumerate(raw):
        key = f"events[{i}]"
        e = ctx.mapping(e, key)
        ctx.known(e, key, ("at", "kind", "node", "uncordonAfter", "how"))
        kind = e.get("kind")
        if kind not in EVENT_KINDS:
            raise ctx.fail(f"{key}.kind", f"must be one of {', '.join(EVENT_KINDS)}, got {kind!r}")
        node = e.get("node", "")
        if kind == "drain" and node not in names:
            raise ctx.fail(f"{key}.node", f"no such node: {node!r}")
        how = e.get("how", "cordon")
        if how not in DRAIN_KINDS:
            raise ctx.fail(f"{key}.how", f"must be one of {', '.join(DRAIN_KINDS)}, got {how!r}")
        events.append(Event(how=how, 
            at=ctx.seconds(e.get("at"), f"{key}.at"), kind=kind, node=node,
            uncordon_after=ctx.seconds(e.get("uncordonAfter", 0), f"{key}.uncordonAfter"),
        ))
    return sorted(events, key=lambda e: e.at)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    ctx = _Ctx(source)
    d = ctx.mapping(data, "scenario")
    ctx.known(d, "scenario", ("name", "description", "hours", "seed", "sampleInterval", "nodes", "vms", "kubevirt",
                              "descheduler", "plugin", "guard", "events"))
    seed = ctx.integer(d.get("seed", 1), "seed")
    # Profiles with random phases/starts draw from their own stream, so the workload
    # depends on the scenario's seed only, never on the guard mode.
    rng = random.Random(f"{seed}:workload")
    nodes = _nodes(ctx, d.get("nodes"))
    vms = _vms(ctx, d.get("vms"), rng)
    steps = sorted({at for v in vms for prof in (v.cpu_load, v.memory_load) for at, _ in prof.steps})
    return Scenario(
        name=str(d.get("name") or Path(source).stem),
        description=str(d.get("description") or "").strip(),
        hours=ctx.number(d.get("hours", 24), "hours", 0.01, 24 * 365),
        seed=seed,
        nodes=nodes,
        vms=vms,
        kubevirt=_kubevirt(ctx, d.get("kubevirt")),
        descheduler=_descheduler(ctx, d.get("descheduler")),
        plugin=_policy(ctx, d.get("plugin"), "plugin", PLUGIN_NAMES),
        guard=_policy(ctx, d.get("guard"), "guard", SETTING_NAMES),
        guard_raw=dict(ctx.mapping(d.get("guard"), "guard")),
        events=_events(ctx, d.get("events"), nodes),
        sample_interval=ctx.seconds(d.get("sampleInterval", 60), "sampleInterval", minimum=1),
        step_times=steps,
    )


def read_scenario(path: str | Path) -> Any:
    return read_yaml_file(path, ScenarioError, str(path))


def load_scenario(path: str | Path, seed: int | None = None) -> Scenario:
    """Read a scenario file; ``seed`` overrides the file's (the workload is rebuilt from it)."""
    return scenario_with_seed(read_scenario(path), str(path), seed)


def scenario_with_seed(data: Any, source: str, seed: int | None = None) -> Scenario:
    if seed is not None and isinstance(data, dict):
        data = {**data, "seed": seed}
    return parse_scenario(data, source)


def guard_settings(raw: dict, source: str = "guard") -> PolicySettings:
    """The guard's settings by their --config names (scenario block, CLI overrides, variant)."""
    try:
        unknown = sorted(set(raw) - set(SETTING_NAMES))
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(unknown)}")
        return build_settings(dict(raw))
    except SettingsError as e:
        raise ScenarioError(f"{source}: {e}") from None
