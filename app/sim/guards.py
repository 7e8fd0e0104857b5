"""The modes: one descheduler, different protection layers in front of KubeVirt.

A mode is a *baseline* (how the descheduler is set up) optionally followed by
``+VARIANT``, a guard variant in front of it:

- ``upstream``: upstream descheduler, background evictions on, limits 2/5, no
  KubeVirt-aware plugin (``off`` is an alias);
- ``profile``: ``upstream`` plus the KubevirtMigrationAware plugin as filter and
  pre-eviction filter, i.e. OpenShift's KubeVirtRelieveAndMigrate as shipped;
- ``node-limit-1``: ``upstream`` with ``evictionLimits.node: 1``;
- ``BASELINE+guard``: this project's ``app.policy.decide``, unchanged, as a
  mutating webhook (so it runs before KubeVirt's) deciding on a real
  ``ClusterStore`` that KubeVirt's simulated objects are published into, with
  its canceller, on by default where KubeVirt serves ``evacuate/cancel`` (v1.8+):
  every ``CANCEL_INTERVAL`` it cancels each evacuation that
  ``app.policy.decide.stuck_evacuation`` calls stuck (descheduler-caused, never
  a drain's);
- ``BASELINE+guard-nocancel``: the guard where the canceller cannot work
  (KubeVirt 1.7, or RBAC without the rule);
- ``BASELINE+steer``: the same guard with steering (rule 10) on, fed by a
  modelled Prometheus (app/sim/prometheus.py: stale, noisy, PSI not predicted).

A new baseline or guard variant is one entry in ``BASELINES`` or
``GUARD_VARIANTS``. A variant's settings are the guard's defaults, then the
scenario's ``guard:`` block, then ``--guard-set`` from the command line, then
the variant's own overrides (setting names as in ``--config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.domain.history import HISTORY_ANNOTATION, encode_history
from app.domain.view import HEALTHY
from app.effects.history import known_migrations, merge
from app.policy import decide, effective_cooldown
from app.policy.cancel import evacuations_to_cancel
from app.policy.cooldown import vm_settings
from app.policy.model import DESCHEDULER_REQUESTER, EvictionAttempt, PolicySettings
from app.sim.kubevirt import EPOCH, NAMESPACE, Answer, KubeVirt, Migration, Pod
from app.sim.options import MODES as DEFAULT_MODES

DESCHEDULER, KUBECTL, AUTOSCALER = "descheduler", "kubectl", "autoscaler"
USERS = {
    DESCHEDULER: "system:serviceaccount:openshift-kube-descheduler-operator:openshift-descheduler",
    KUBECTL: "system:admin",
    AUTOSCALER: "system:serviceaccount:kube-system:cluster-autoscaler",
}


@dataclass(frozen=True)
class Baseline:
    description: str
    plugin: bool = False
    eviction_limit_node: int | None = None  # overrides the scenario's evictionLimits.node


@dataclass(frozen=True)
class GuardVariant:
    description: str
    settings: dict = field(default_factory=dict)  # setting names, applied last
    steering: bool = False  # rule 10, fed by app.sim.prometheus.ModelledPrometheus
    cancel: bool = True  # the canceller runs (the default where KubeVirt serves evacuate/cancel)


BASELINES = {
    "upstream": Baseline("upstream descheduler, background evictions on, limits 2/5, no KubeVirt plugin"),
    "profile": Baseline("upstream + KubevirtMigrationAware plugin (OpenShift KubeVirtRelieveAndMigrate)", plugin=True),
    "node-limit-1": Baseline("upstream with evictionLimits.node: 1", eviction_limit_node=1),
}
GUARD_VARIANTS = {
    "guard": GuardVariant("the guard with its default settings (canceller on) and the scenario's guard block"),
    "guard-nocancel": GuardVariant("the guard where its canceller cannot work (KubeVirt < 1.8, or no RBAC rule)",
                                   cancel=False),
    "steer": GuardVariant("the guard plus steering (rule 10) on a modelled Prometheus", steering=True),
    # the node-cooldown variants: the default guard plus the settings named (bench/sim_candidates.sh measures them)
    "guard-nodecool": GuardVariant("candidate 1: node cooldown (rule 8b) 15m, doubled per departure within 1h, cap 1h",
                                   {"nodeCooldown": "15m"}),
    "guard-targetcool": GuardVariant("candidate 2: target-node cooldown (rule 8c) 15m, doubled within 1h, cap 1h",
                                     {"targetNodeCooldown": "15m"}),
    "guard-settle": GuardVariant("candidate 4a: node cooldown 5m, never doubled (a settle time after each departure)",
                                 {"nodeCooldown": "5m", "nodeCooldownWindow": "0s"}),
    "guard-longrest": GuardVariant("candidate 4b: node cooldown 60m, never doubled (one departure per node per hour)",
                                   {"nodeCooldown": "60m", "nodeCooldownWindow": "0s"}),
    "guard-churn": GuardVariant("candidate 4c: target-node cooldown 30m, only while the node also sent a VM (churn)",
                                {"targetNodeCooldown": "30m", "nodeCooldownWindow": "0s",
                                 "targetNodeCooldownChurnOnly": "true"}),
}
ALIASES = {"off": "upstream"}
MODES = DEFAULT_MODES  # the default comparison (app.sim.options: the command line reads it without this module)


@dataclass(frozen=True)
class ModeSpec:
    name: str
    baseline: Baseline
    guard: GuardVariant | None


def parse_mode(name: str) -> ModeSpec:
    base, _, variant = ALIASES.get(name, name).partition("+")
    if base not in BASELINES or (variant and variant not in GUARD_VARIANTS):
        known = ", ".join(list(BASELINES) + [f"{b}+{v}" for b in BASELINES for v in GUARD_VARIANTS])
        raise ValueError(f"unknown mode {name!r}: expected one of {known} (or off)")
    return ModeSpec(name, BASELINES[base], GUARD_VARIANTS[variant] if variant else None)


def mode_description(mode: str) -> str:
    spec = parse_mode(mode)
    text = spec.baseline.description
    return text + (f"; in front of KubeVirt: {spec.guard.description}" if spec.guard else "")


class PluginModel:
    """KubevirtMigrationAware as filter and pre-eviction filter, from its description.

    The in-flight check and the last migration come from the VMI's
    ``migrationState``; the count of recent migrations from a history in the
    descheduler's memory, fed by every ``endTimestamp`` change on a VMI (failed
    migrations included) and, after a restart, re-seeded from the ``Succeeded``
    VMIMs KubeVirt still keeps (5 per VMI). Only the descheduler's evictions pass
    through it."""

    def __init__(self, kubevirt: KubeVirt, settings: PolicySettings) -> None:
        self.kv = kubevirt
        self.settings = settings
        self.history: dict[str, list[int]] = {}  # VMI -> end times of finished migrations
        kubevirt.listeners.append(self._finished)

    def _finished(self, m: Migration) -> None:
        if m.copy_start is not None and m.end is not None:  # the VMI's migrationState got an endTimestamp
            self.history.setdefault(m.vmi.name, []).append(m.end)

    def restarted(self, now: int) -> None:
        self.history = {}
        for vmi in self.kv.vmis:
            kept = [m.end for m in vmi.vmims if m.phase == "Succeeded" and m.end is not None]
            if kept:
                self.history[vmi.name] = kept  # type: ignore[assignment]

    def check(self, pod: Pod, now: int) -> str | None:
        m = pod.vmi.migration  # status.migrationState
        if m is None or m.copy_start is None:
            return None
        if m.end is None:
            return "plugin_migration_in_progress"
        s = self.settings
        count = sum(1 for end in self.history.get(pod.vmi.name, ()) if end > now - s.migration_history_window)
        _, cooldown = effective_cooldown(m.end - m.copy_start, count, s)
        return "plugin_cooldown" if now - m.end < cooldown else None


class GuardWebhook:
    """The eviction as the admission layer hands it to policy, decided on the store."""

    def __init__(self, kubevirt: KubeVirt, settings: PolicySettings, prometheus=None) -> None:
        self.kv = kubevirt
        self.settings = settings
        self.prometheus = prometheus  # ModelledPrometheus: steering on
        kubevirt.listeners.append(self._record_history)

    def _record_history(self, m: Migration) -> None:
        """The guard's history annotation (on by default in the product, app/effects/history.py), written
        at once when a migration finishes: the cooldown count then outlives KubeVirt's 5 kept VMIMs."""
        store, now = self.kv.store, EPOCH + (m.end or 0)
        vmi = store.vmi(NAMESPACE, m.vmi.name)
        if vmi is None:
            return
        known = known_migrations(vmi, store.migrations(NAMESPACE, vmi.name))
        entries, adds = merge(vmi.history, known, now, vm_settings(vmi, self.settings))
        if known and adds:
            m.vmi.annotations[HISTORY_ANNOTATION] = encode_history(entries)
            self.kv.vmi_updated(m.vmi, m.end or 0)

    def check(self, pod: Pod, now: int, client: str) -> Answer | None:
        from_descheduler = client == DESCHEDULER
        req = EvictionAttempt(
            operation="CREATE", resource="pods", subresource="eviction", namespace=NAMESPACE, name=pod.name,
            username=USERS[client], requested_by=DESCHEDULER_REQUESTER if from_descheduler else "",
            eviction_reason="triggered by KubeVirtRelieveAndMigrate/LowNodeUtilization" if from_descheduler else "",
        )
        usage = self.prometheus.snapshot(now) if self.prometheus is not None else None
        d = decide(req, self.kv.store, EPOCH + now, self.settings, HEALTHY, usage)
        return None if d.allowed else Answer(False, d.message, d.reason)


CANCEL_INTERVAL = 30  # seconds between the canceller's passes over the store


class Canceller:
    """The guard's canceller on the simulated store: the same pure judgement as in
    production (``stuck_evacuation``), then KubeVirt's ``evacuate/cancel``."""

    def __init__(self, kubevirt: KubeVirt, settings: PolicySettings) -> None:
        self.kv = kubevirt
        self.settings = settings
        self.cancelled = 0
        self.refused = 0

    def run(self, now: int) -> None:
        store = self.kv.store
        for stuck in evacuations_to_cancel(store.vmis(), store, EPOCH + now, self.settings):
            if self.kv.cancel_evacuation(self.kv.vmi_by_name[stuck.name], stuck.node, now):
                self.cancelled += 1
            else:
                self.refused += 1


class Mode:
    """The protection layers of one mode: the plugin inside the descheduler and the
    guard webhook in the API server, each optional."""

    def __init__(self, spec: ModeSpec, kubevirt: KubeVirt, plugin: PolicySettings,
                 guard: PolicySettings | None, prometheus=None) -> None:
        self.name = spec.name
        self.spec = spec
        self.kv = kubevirt
        self.plugin = PluginModel(kubevirt, plugin) if spec.baseline.plugin else None
        self.prometheus = prometheus if spec.guard is not None and spec.guard.steering else None
        self.guard = (GuardWebhook(kubevirt, guard, self.prometheus)
                      if spec.guard is not None and guard is not None else None)
        self.canceller = (Canceller(kubevirt, guard)
                          if spec.guard is not None and spec.guard.cancel and guard is not None else None)
        self.policy_calls = 0

    def pre_filter(self, pod: Pod, now: int) -> str | None:
        """The descheduler's filter and pre-eviction filter: a reason to skip the pod, or None."""
        if self.plugin is None:
            return None
        self.policy_calls += 1
        return self.plugin.check(pod, now)

    def admit(self, pod: Pod, now: int, client: str = DESCHEDULER) -> Answer:
        """The API server's answer to one eviction: webhooks, then KubeVirt's admitter."""
        if self.guard is not None:
            self.policy_calls += 1
            refused = self.guard.check(pod, now, client)
            if refused is not None:
                return refused
        return self.kv.admit_eviction(pod.name, now, from_descheduler=client == DESCHEDULER)

    def descheduler_restarted(self, now: int) -> None:
        if self.plugin is not None:
            self.plugin.restarted(now)


def guard_settings_for(spec: ModeSpec, raw: dict, overrides: dict) -> dict:
    """The settings a guard variant runs with (scenario, CLI, variant)."""
    assert spec.guard is not None
    return {**raw, **overrides, **spec.guard.settings}
