"""The modes: one descheduler, different protection layers in front of KubeVirt.

A mode is a *baseline* (how the descheduler and KubeVirt are set up) optionally
followed by ``+VARIANT``, a guard variant in front of it.

What users run today (OpenShift 4.22 with OpenShift Virtualization):

- ``ocp``: the KubeVirtRelieveAndMigrate profile as the descheduler operator
  writes it: the KubevirtMigrationAware plugin as filter and pre-eviction
  filter, LowNodeUtilization's ``evictionLimits.node: 2`` and
  ``maxNoOfPodsToEvictPerNode: 2`` (``maxNoOfPodsToEvictTotal: 5``), the query
  ``...:k3:avg1m``; KubeVirt with ``parallelOutboundMigrationsPerNode: 1`` as
  OpenShift Virtualization's operator sets it, v1.8.3 (MigrationPriorityQueue off);
- ``ocp-node1``: ``ocp`` with the CR's ``evictionLimits.node: 1`` (the operator
  writes it into both the plugin's ``evictionLimits.node`` and
  ``maxNoOfPodsToEvictPerNode``);
- ``ocp-actuation``: ``ocp`` with the query
  ``descheduler:node:actuation_priority:p66_5m`` (app/sim/recording.py);
- ``...-kv19``: the same on KubeVirt 1.9 (MigrationPriorityQueue GA);
- ``ocp-actuation-counted``: a what-if, not a setting anyone can choose: the
  actuation query as if the descheduler counted every finished background
  eviction as a success (it does not, see app/sim/recording.py).

Older baselines (kept: the e2e outcome run and the candidate table use them):

- ``upstream``: upstream descheduler, background evictions on, limits 2/5, no
  KubeVirt-aware plugin, KubeVirt's own defaults (``off`` is an alias);
- ``profile``: ``upstream`` plus the KubevirtMigrationAware plugin;
- ``node-limit-1``: ``upstream`` with LowNodeUtilization's ``evictionLimits.node: 1``
  only (``maxNoOfPodsToEvictPerNode`` stays 2).

Every baseline's descheduler classifies nodes by the profile's Prometheus score
(the model has no other), so every baseline reads Prometheus.

Guard variants:

- ``BASELINE+guard``: the guard at its defaults: this project's
  ``app.policy.decide``, unchanged, as a mutating webhook (so it runs before
  KubeVirt's) deciding on a real ``ClusterStore`` that KubeVirt's simulated
  objects are published into; its canceller on (KubeVirt serves
  ``evacuate/cancel`` since v1.8); steering on, fed by a modelled
  Prometheus (app/sim/prometheus.py: stale, noisy, PSI not predicted), because
  the guard finds the descheduler's Prometheus wherever the descheduler reads one;
- ``BASELINE+guard-nosteer``: the guard without steering (no Prometheus found);
- ``BASELINE+guard-nocancel``: the guard where the canceller cannot work
  (KubeVirt 1.7, or RBAC without the rule);
- ``BASELINE+steer``: an older name of ``BASELINE+guard``.

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


K3, ACTUATION = "k3", "actuation"  # the descheduler's query: ...:k3:avg1m, or actuation_priority:p66_5m


@dataclass(frozen=True)
class Baseline:
    description: str
    plugin: bool = False
    eviction_limit_node: int | None = None  # overrides the scenario's evictionLimits.node
    max_per_node: int | None = None  # overrides the scenario's maxNoOfPodsToEvictPerNode
    kubevirt: tuple[tuple[str, object], ...] = ()  # KubeVirtSettings fields set over the scenario's
    query: str = K3
    count_background: bool = False  # what-if: finished background evictions count as successes
    reads_prometheus: bool = True  # the descheduler's query is Prometheus's (the guard finds it and steers)


@dataclass(frozen=True)
class GuardVariant:
    description: str
    settings: dict = field(default_factory=dict)  # setting names, applied last
    steering: bool | None = None  # steering on a modelled Prometheus; None: where the descheduler reads one
    cancel: bool = True  # the canceller runs (the default where KubeVirt serves evacuate/cancel)


OCP_KUBEVIRT = (("parallel_outbound_migrations_per_node", 1),)  # OpenShift Virtualization's operator
KV19 = (("migration_priority_queue", True),)  # KubeVirt 1.9: MigrationPriorityQueue GA
OCP = "OpenShift 4.22 KubeVirtRelieveAndMigrate (plugin, evictionLimits.node 2, per node 2, total 5), KubeVirt outbound 1"
BASELINES = {
    "ocp": Baseline(f"{OCP}, KubeVirt 1.8.3", plugin=True, eviction_limit_node=2, max_per_node=2,
                    kubevirt=OCP_KUBEVIRT),
    "ocp-node1": Baseline(f"{OCP}, CR evictionLimits.node: 1 (plugin and per node), KubeVirt 1.8.3", plugin=True,
                          eviction_limit_node=1, max_per_node=1, kubevirt=OCP_KUBEVIRT),
    "ocp-actuation": Baseline(f"{OCP}, query actuation_priority:p66_5m, KubeVirt 1.8.3", plugin=True,
                              eviction_limit_node=2, max_per_node=2, kubevirt=OCP_KUBEVIRT, query=ACTUATION),
    "ocp-kv19": Baseline(f"{OCP}, KubeVirt 1.9", plugin=True, eviction_limit_node=2, max_per_node=2,
                         kubevirt=OCP_KUBEVIRT + KV19),
    "ocp-node1-kv19": Baseline(f"{OCP}, CR evictionLimits.node: 1, KubeVirt 1.9", plugin=True, eviction_limit_node=1,
                               max_per_node=1, kubevirt=OCP_KUBEVIRT + KV19),
    "ocp-actuation-kv19": Baseline(f"{OCP}, query actuation_priority:p66_5m, KubeVirt 1.9", plugin=True,
                                   eviction_limit_node=2, max_per_node=2, kubevirt=OCP_KUBEVIRT + KV19,
                                   query=ACTUATION),
    "ocp-actuation-counted": Baseline("what-if: ocp-actuation with every finished background eviction counted as "
                                      "a success in descheduler_pods_evicted_total", plugin=True,
                                      eviction_limit_node=2, max_per_node=2, kubevirt=OCP_KUBEVIRT, query=ACTUATION,
                                      count_background=True),
    "upstream": Baseline("upstream descheduler, background evictions on, limits 2/5, no KubeVirt plugin"),
    "profile": Baseline("upstream + KubevirtMigrationAware plugin (OpenShift KubeVirtRelieveAndMigrate before 4.22's "
                        "KubeVirt outbound limit)", plugin=True),
    "node-limit-1": Baseline("upstream with evictionLimits.node: 1", eviction_limit_node=1),
}
GUARD_VARIANTS = {
    "guard": GuardVariant("the guard at its default settings: canceller on, steering on where the descheduler reads "
                          "Prometheus, and the scenario's guard block"),
    "guard-nosteer": GuardVariant("the guard without steering (no Prometheus found), canceller on", steering=False),
    "guard-nocancel": GuardVariant("the guard where its canceller cannot work (KubeVirt < 1.8, or no RBAC rule)",
                                   cancel=False),
    "steer": GuardVariant("the guard at its defaults with steering on (older name of +guard)", steering=True),
    # the node-cooldown variants: the default guard plus the settings named (bench/sim_candidates.sh measures them)
    "guard-nodecool": GuardVariant("candidate 1: node cooldown (`node_cooldown`) 15m, doubled per departure within 1h, cap 1h",
                                   {"nodeCooldown": "15m"}),
    "guard-targetcool": GuardVariant("candidate 2: target-node cooldown (`target_node_cooldown`) 15m, doubled within 1h, cap 1h",
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

    @property
    def steering(self) -> bool:
        """Steering on: the variant says so, or, at its default, the descheduler reads Prometheus."""
        if self.guard is None:
            return False
        return self.baseline.reads_prometheus if self.guard.steering is None else self.guard.steering


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
        self.prometheus = prometheus if spec.steering else None
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
