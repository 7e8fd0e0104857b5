"""The three ways an eviction can be judged: ``off``, ``plugin`` and ``guard``.

- ``off``: the descheduler's evictions go straight to KubeVirt.
- ``plugin``: the reference KubevirtMigrationAware evictor plugin, re-implemented
  from its description (kubevirt-facts.md): a pre-eviction filter inside the
  descheduler with a hard block while the VMI's migration is in flight and the
  cooldown, from a history kept in the descheduler's memory (every
  ``endTimestamp`` change counts, failures included). A restart of the
  descheduler loses it; the new process rebuilds it from the ``Succeeded``
  VMIMs KubeVirt still keeps. It has no node budget and no drain exemption,
  and it never sees evictions others make.
- ``guard``: this project's ``app.policy.decide``, unchanged, registered as a
  mutating webhook (so it runs before KubeVirt's), deciding on a real
  ``ClusterStore`` that KubeVirt's simulated objects are published into.
"""

from __future__ import annotations

from app.domain.view import HEALTHY
from app.policy import decide, effective_cooldown
from app.policy.model import DESCHEDULER_REQUESTER, EvictionRequest, PolicySettings
from app.sim.kubevirt import EPOCH, NAMESPACE, Answer, KubeVirt, Migration, Pod

MODES = ("off", "plugin", "guard")
DRAIN_USER = "system:admin"


class Mode:
    name = "off"

    def __init__(self, kubevirt: KubeVirt, settings: PolicySettings) -> None:
        self.kv = kubevirt
        self.settings = settings
        self.policy_calls = 0

    def pre_filter(self, pod: Pod, now: int) -> str | None:
        """The descheduler's pre-eviction filter: a reason to skip the pod, or None."""
        return None

    def webhook(self, pod: Pod, now: int, from_descheduler: bool) -> Answer | None:
        """A refusal by a webhook that runs before KubeVirt's, or None to go on."""
        return None

    def admit(self, pod: Pod, now: int, from_descheduler: bool) -> Answer:
        """The API server's answer to one eviction: webhooks, then KubeVirt's admitter."""
        refused = self.webhook(pod, now, from_descheduler)
        if refused is not None:
            return refused
        return self.kv.admit_eviction(pod.name, now, from_descheduler)

    def descheduler_restarted(self, now: int) -> None:
        pass


class Plugin(Mode):
    name = "plugin"

    def __init__(self, kubevirt: KubeVirt, settings: PolicySettings) -> None:
        super().__init__(kubevirt, settings)
        self.history: dict[str, list[tuple[int, int]]] = {}  # VMI -> (start, end) of finished migrations
        kubevirt.listeners.append(self._finished)

    def _finished(self, m: Migration) -> None:
        assert m.start is not None and m.end is not None
        self.history.setdefault(m.vmi.name, []).append((m.start, m.end))

    def descheduler_restarted(self, now: int) -> None:
        self.history = {}
        for vmi in self.kv.vmis:
            kept = [(m.start, m.end) for m in vmi.vmims if m.phase == "Succeeded" and m.start is not None]
            if kept:
                self.history[vmi.name] = kept  # type: ignore[assignment]

    def pre_filter(self, pod: Pod, now: int) -> str | None:
        self.policy_calls += 1
        vmi = pod.vmi
        m = vmi.migration
        if m is not None and m.start is not None and m.end is None:
            return "plugin_migration_in_progress"
        history = self.history.get(vmi.name)
        if not history:
            return None
        s = self.settings
        start, end = max(history, key=lambda h: h[1])
        count = sum(1 for _, e in history if e > now - s.migration_history_window)  # strict, as the plugin
        _, cooldown = effective_cooldown(end - start, count, s)
        return "plugin_cooldown" if now - end < cooldown else None


class Guard(Mode):
    name = "guard"

    def webhook(self, pod: Pod, now: int, from_descheduler: bool) -> Answer | None:
        """The eviction as the admission layer hands it to policy, decided on the store."""
        self.policy_calls += 1
        req = EvictionRequest(
            operation="CREATE", resource="pods", subresource="eviction", namespace=NAMESPACE, name=pod.name,
            username="system:serviceaccount:openshift-kube-descheduler-operator:openshift-descheduler"
            if from_descheduler else DRAIN_USER,
            requested_by=DESCHEDULER_REQUESTER if from_descheduler else "",
            eviction_reason="triggered by KubeVirtRelieveAndMigrate/LowNodeUtilization" if from_descheduler else "",
        )
        d = decide(req, self.kv.store, EPOCH + now, self.settings, HEALTHY)
        if d.allowed:
            return None
        return Answer(False, d.message, d.reason)


def make_mode(name: str, kubevirt: KubeVirt, plugin: PolicySettings, guard: PolicySettings) -> Mode:
    if name == "off":
        return Mode(kubevirt, guard)
    if name == "plugin":
        return Plugin(kubevirt, plugin)
    if name == "guard":
        return Guard(kubevirt, guard)
    raise ValueError(f"unknown mode {name!r}: expected one of {', '.join(MODES)}")
