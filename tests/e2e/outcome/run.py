"""One mode of the outcome run: a fresh control plane with real KubeVirt (virt-api and virt-controller,
``tests/e2e/kubevirt.py``), the actor (kubelet, the scheduler's binding and virt-handler with the scenario's
hardware), Prometheus, the real descheduler, and the guard or not; then the figures (``figures.py``) from the audit
log, the VMIMs KubeVirt made and the descheduler's own counters.

Real here: kube-apiserver, etcd, the descheduler, Prometheus, virt-api (its eviction admitter marks the VMIs),
virt-controller (evacuation and migration controllers: VMIM creation, the limits per cluster and per node, the retry
backoff, the pod annotation, the unschedulable-target timeout, garbage collection), the guard and its canceller
(through virt-api's ``evacuate/cancel``, with the chart's RBAC). Played by the actor: the scheduler's choice of a
target, kubelet, virt-handler and the guests (copy time and outcome from the scenario's physics), and the load.

The KubeVirt CR carries the scenario's migration settings (``migration_config``); what KubeVirt takes from no
setting is a constant in both the real run and the model: the retry backoff (20 s doubling), the unschedulable
target's timeout (300 s; only a VMIM annotation changes it, and the evacuation controller's VMIMs have none),
virt-handler's heartbeat (60 s, jittered up to 132 s), the 5 finished VMIMs kept per VMI.

Each mode starts from the same state (the scenario's placement and load, seeded), on its own API server and etcd,
so nothing of one mode leaks into the other. The descheduler starts ``firstRun`` seconds into the run (the
simulator's first cycle) and is stopped a moment before the actor ends.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.metricsource.prometheus import QUERIES as GUARD_QUERIES
from app.sim.metrics import balance
from app.sim.prometheus import QUERY_INTERVAL
from app.sim.scenario import Scenario
from tests.e2e.controlplane import ROOT, ControlPlane, free_port
from tests.e2e.guard import GuardProcess, install_chart
from tests.e2e.kubevirt import KubeVirt
from tests.e2e.outcome.cycles import check as check_cycles
from tests.e2e.outcome.cycles import parse as parse_cycles
from tests.e2e.outcome.descheduler import (Descheduler, custom_policy, install_rbac, protects_local_storage,
                                           settings_from_policy)
from tests.e2e.outcome.figures import real_figures
from tests.e2e.outcome.prometheus import SCORE, Prometheus


@dataclass(frozen=True)
class RealMode:
    guard: bool  # the chart installed and the guard running
    model: str  # the simulator's mode for the same set-up
    node_limit: int | None = None  # evictionLimits.node instead of the scenario's
    steer: bool = False  # the guard reads the run's Prometheus (prometheus.url): steering (better_candidate, no_gain)
    descheduler: Path | None = None  # another descheduler build (the pluggable mode) ...
    policy: Path | None = None  # ... with this policy file (its Prometheus URL replaced by the run's)
    structure_only: bool = False  # the policy names plugins the pinned descheduler lacks: check its own keys only


# Each real mode and the simulator's mode it is compared with: the one place that pairs them.
MODEL_MODES = {
    "descheduler": "upstream",
    # the guard as installed where the descheduler reads Prometheus: steering on, reading the run's Prometheus
    "descheduler+guard": "upstream+guard",
    # the guard without Prometheus (no prometheus.url): no steering
    "descheduler+guard-nosteer": "upstream+guard-nosteer",
    # the one-line alternative the guard is compared with: is the simulator's node-limit-1 the real one?
    "descheduler-node-limit-1": "node-limit-1",
}
# the guard runs with its canceller, which calls real virt-api's evacuate/cancel with the chart's RBAC
REAL_MODES = {
    "descheduler": RealMode(guard=False, model=MODEL_MODES["descheduler"]),
    "descheduler+guard": RealMode(guard=True, steer=True, model=MODEL_MODES["descheduler+guard"]),
    "descheduler+guard-nosteer": RealMode(guard=True, model=MODEL_MODES["descheduler+guard-nosteer"]),
    "descheduler-node-limit-1": RealMode(guard=False, node_limit=1, model=MODEL_MODES["descheduler-node-limit-1"]),
}
SHORT_MODES = ("descheduler", "descheduler+guard")  # make e2e's short form; make e2e-outcome runs them all
# The descheduler is started so that its cycles fall half a second after the model's (firstRun + k x interval +
# 0.5 s): KubeVirt's events fall on whole seconds, and at equal times the simulator runs them before its descheduler's
# cycle. It starts cycling about 0.25 s after it is started. On a loaded machine its cycles drift; the model is then
# run with the cycle times the descheduler logged (``aligned_cycles``), so the comparison does not depend on it.
CYCLE_OFFSET, START_SECONDS = 0.5, 0.25
# With steering, the actor serves the first sample this long before the run starts: the guard's CPU per VM is a
# rate() over virt-handler's counters (2 minutes), which is low while a counter is younger than that; in a cluster the
# VMs have been running (a VM that just migrated has a young counter there too, as here).
def _rate_window(query: str) -> float:
    m = re.search(r"\[(\d+)([smh])\]", query)
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)] if m else 120.0


WARMUP = _rate_window(GUARD_QUERIES["vm_cpu"]) + 10.0


@dataclass
class ModeRun:
    name: str
    figures: dict
    descheduler_counted: dict  # descheduler_pods_evicted_total by result
    guard_reasons: dict = field(default_factory=dict)  # the guard's decisions by reason (with the guard)
    score_check: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cycles: list[float] = field(default_factory=list)  # run times at which the descheduler's cycles began
    cycle_check: dict = field(default_factory=dict)  # each cycle against the simulator's rules (cycles.py)
    wall_seconds: float = 0.0
    model: str = ""  # the simulator's mode to compare with
    balance_from: float = 0.0  # run time of the first load sample Prometheus had for every node


def _forbidden(cp: ControlPlane, user: str) -> list[str]:
    """The requests of ``user`` the authorizer refused (its identity lacks a rule)."""
    return [f"{ev.get('verb')} {ev.get('requestURI')}" for ev in cp.audit_events(user)
            if (ev.get("responseStatus") or {}).get("code") == 403]


def _audit_answers(cp: ControlPlane, user: str) -> list[tuple[int, str]]:
    out = []
    for ev in cp.audit_events(user):
        ref = ev.get("objectRef", {})
        if ev.get("verb") == "create" and ref.get("resource") == "pods" and ref.get("subresource") == "eviction":
            status = ev.get("responseStatus") or {}
            out.append((int(status.get("code") or 0), status.get("message") or ""))
    return out


def aligned_cycles(cycles: list[float]) -> list[int]:
    """The model's cycle seconds for the real descheduler's logged cycle starts (run time): the second each began
    in. KubeVirt's events fall on whole seconds and the simulator runs its descheduler after the events of the same
    second, so a cycle that began at 25.7 s saw what the model's cycle at 25 s sees."""
    return [int(t // 1) for t in cycles if t >= 0]


def real_balance(prom: Prometheus, wall0: float, duration: float, sample: int, high: float) -> tuple[dict, float]:
    """The balance figures (``app.sim.metrics.balance``) from the score Prometheus served, as the descheduler reads
    it (truncated percent), read half a sample after each load sample and counted from that sample's time; and
    the run time of the first sample with a score for every node (the model is counted from there too)."""
    got = prom.query_range(SCORE, wall0 + sample / 2, wall0 + duration - 1, sample)
    nodes = max((len(row) for row in got.values()), default=0)
    times, rows = [], []
    for t in sorted(got):
        row = got[t]
        if len(row) < nodes:
            continue  # before Prometheus had every node: the descheduler would have skipped the cycle
        times.append(round(t - wall0 - sample / 2))
        rows.append({n: int(v * 100) for n, v in row.items()})
    return balance(times, rows, duration, high), (times[0] if times else 0.0)


def migration_config(s) -> dict:
    """The KubeVirt CR's ``spec.configuration.migrations`` for the scenario's KubeVirt settings (the fields KubeVirt
    v1.8 has for them: ``MigrationConfiguration`` in kubevirt.io/api/core/v1)."""
    return {"parallelMigrationsPerCluster": s.parallel_migrations_per_cluster,
            "parallelOutboundMigrationsPerNode": s.parallel_outbound_migrations_per_node,
            "completionTimeoutPerGiB": int(s.completion_timeout_per_gib),
            "progressTimeout": int(s.progress_timeout)}


# what KubeVirt v1.8.3 does without being told, and the actor's virt-handler does as KubeVirt's
CONSTANTS = {"unschedulable_timeout": 300, "backoff_initial": 20, "retained_finished_migrations": 5,
             "heartbeat_interval": 60, "heartbeat_jitter": 1.2}


def unsettable(s) -> list[str]:
    """The scenario's KubeVirt settings that differ from what KubeVirt does without being told (``CONSTANTS``):
    a real run cannot follow them, so the scenario must say the constants."""
    return [f"kubevirt {k}: {getattr(s, k)} (KubeVirt: {v})" for k, v in CONSTANTS.items()
            if getattr(s, k, v) != v]


def feature_gates(s) -> tuple[str, ...]:
    """The KubeVirt CR's feature gates for the scenario: MigrationPriorityQueue when it asks for the gate-on path."""
    return ("MigrationPriorityQueue",) if getattr(s, "migration_priority_queue", False) else ()


def run_mode(name: str, scenario: Scenario, scenario_path: Path, workdir: Path, duration: float,
             mode: RealMode | None = None) -> ModeRun:
    t_start = time.monotonic()
    mode = mode or REAL_MODES[name]
    settings = scenario.descheduler if mode.node_limit is None else dataclasses.replace(
        scenario.descheduler, eviction_limit_node=mode.node_limit)
    workdir.mkdir(parents=True, exist_ok=True)
    bad = unsettable(scenario.kubevirt)
    if bad:
        raise ValueError(f"{scenario.name}: real KubeVirt cannot be told {'; '.join(bad)}")
    # no kubernetes Service endpoint is reconciled (Kubernetes 1.37 refuses a loopback advertise address for it)
    cp = ControlPlane(workdir / "control-plane", extra_args=("--endpoint-reconciler-type=none",)).start()
    procs: list = []
    try:
        cp.install_crds(kubevirt=False)
        kubevirt = KubeVirt(cp, workdir / "kubevirt", migrations=migration_config(scenario.kubevirt),
                            feature_gates=feature_gates(scenario.kubevirt))
        procs.append(kubevirt)
        kubevirt.start()
        sa = install_rbac(cp)
        guard = None
        prom_port = free_port()
        if mode.guard:
            values = {"policy": dict(scenario.guard_raw), "cancelStuckEvacuations": {"enabled": True}}
            if mode.steer:  # the run's Prometheus, polled as often as the simulator's guard polls its model of it
                values["prometheus"] = {"url": f"http://127.0.0.1:{prom_port}", "interval": f"{QUERY_INTERVAL}s"}
            inst = install_chart(cp, workdir / "chart", values=values)
            guard = GuardProcess(inst).start()
            procs.append(guard)
        ca_dir = workdir / "ca"
        ca_dir.mkdir(exist_ok=True)
        (ca_dir / "ca.crt").write_bytes(cp.ca.pem)
        (ca_dir / "ca.key").write_bytes(cp.ca.key_pem)
        (ca_dir / "ca.key").chmod(0o600)
        actor_log = workdir / "actor.log"
        actor = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.actor", "--scenario", str(scenario_path),
             "--kubeconfig", str(cp.admin_kubeconfig), "--handler-kubeconfig", str(kubevirt.handler_kubeconfig),
             "--ca-dir", str(ca_dir), "--workdir", str(workdir), "--duration", str(duration),
             "--seed", str(scenario.seed), "--warmup", str(WARMUP if mode.steer else 0)],
            cwd=ROOT, stdout=actor_log.open("wb"), stderr=subprocess.STDOUT)
        procs.append(_Child(actor))
        exporter = _wait_ready(actor, workdir / "actor-exporter.json", actor_log)
        prom = Prometheus(workdir / "prometheus", prom_port, exporter["exporter_port"])
        procs.append(prom)
        ready = _wait_ready(actor, workdir / "actor-ready.json", actor_log, timeout=60 + WARMUP)
        prom.wait_for_score(len(ready["nodes"]))
        wall0 = ready["wall0"]
        _sleep_until(wall0 + scenario.descheduler.first_run + CYCLE_OFFSET - START_SECONDS)
        policy_doc = None
        if mode.policy is not None:
            policy_doc = custom_policy(mode.policy, prom.url)
            settings = settings_from_policy(policy_doc, settings)
        ds = Descheduler(cp, workdir / "descheduler", sa, prom.url, settings, binary=mode.descheduler,
                         policy_doc=policy_doc, structure_only=mode.structure_only)
        procs.append(ds)
        score_check = _score_check(prom)
        _sleep_until(wall0 + duration - 1.0)
        if not ds.alive():
            raise RuntimeError(f"the descheduler exited early:\n{ds.log.read_text()[-3000:]}")
        counted = ds.evictions()
        ds.stop()
        balanced, balance_from = real_balance(prom, wall0, duration, scenario.sample_interval, settings.high)
        cycles = ds.cycles(wall0)
        cycle_check = check_cycles(parse_cycles(ds.log.read_text(errors="replace")), settings)
        actor.wait(timeout=90)
        if actor.returncode != 0:
            raise RuntimeError(f"the actor exited {actor.returncode}:\n{actor_log.read_text()[-3000:]}")
        result = json.loads((workdir / "actor-result.json").read_text())
        guard_reasons = _guard_reasons(guard) if guard is not None else {}
        user = f"system:serviceaccount:kube-system:{sa}"
        figures = {**real_figures(_audit_answers(cp, user), result, scenario.plugin), **balanced}
        notes = []
        if policy_doc is not None and protects_local_storage(policy_doc):
            notes.append("the policy's DefaultEvictor protects pods with local storage: virt-launcher pods have "
                         "emptyDir volumes, so it evicts no VM (the KubeVirt profile sets evictLocalStoragePods)")
        forbidden = _forbidden(cp, user)
        if forbidden:
            notes.append(f"the descheduler's chart RBAC refused {len(forbidden)} of its requests: {forbidden[:3]}")
        if result["actor_errors"]:
            notes.append(f"{len(result['actor_errors'])} of the actor's writes failed: {result['actor_errors'][:3]}")
        for p in (kubevirt.api, kubevirt.controller):
            if p is not None and not p.alive():
                notes.append(f"{p.name} exited early: {p.tail(5)}")
        return ModeRun(name, figures, counted, guard_reasons, score_check, notes, cycles, cycle_check,
                       time.monotonic() - t_start, mode.model, balance_from)
    finally:
        for p in reversed(procs):
            p.stop()
        cp.stop()


class _Child:
    """The actor's process, stopped with the others if the mode ends early."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _wait_ready(proc: subprocess.Popen, path: Path, log: Path, timeout: float = 360) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the actor exited {proc.returncode} before it was ready:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"the actor was not ready in {timeout:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return json.loads(path.read_text())


def _sleep_until(wall: float) -> None:
    left = wall - time.time()
    if left > 0:
        time.sleep(left)


def _score_check(prom: Prometheus, tries: int = 5) -> dict:
    """Prometheus's score beside the simulator's for the same sample, as the descheduler reads them (percent): the
    two are read from the same scrape only between a sample and the next rule evaluation, so a few reads are tried
    and the first where every node agrees within the truncation (1 point) is kept, else the last."""
    checked: dict = {}
    for _ in range(tries):
        real = prom.query(SCORE)
        model = prom.query("kubevirt_actor_node_model_score")
        checked = {n: {"prometheus": int(real[n] * 100), "model": round(model.get(n, -1) * 100)} for n in sorted(real)}
        if all(abs(v["prometheus"] - v["model"]) <= 1 for v in checked.values()):
            break
        time.sleep(0.7)
    return checked


def _guard_reasons(guard: GuardProcess) -> dict:
    """The guard's decisions by ``decision:reason``, and its side effects by ``effect kind:outcome``."""
    out: dict[str, float] = {}
    for (name, labels), value in guard.metrics().items():
        d = dict(labels)
        if name == "kubevirt_eviction_guard_decisions_total":
            out[f"{d.get('decision')}:{d.get('reason')}"] = value
        elif name == "kubevirt_eviction_guard_side_effects_total" and value:
            out[f"effect {d.get('kind')}:{d.get('outcome')}"] = value
        elif name == "kubevirt_eviction_guard_prometheus_queries_total" and value:
            out[f"prometheus queries:{d.get('outcome')}"] = value
    return dict(sorted(out.items()))
