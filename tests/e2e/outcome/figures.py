"""The outcome's figures, computed the same way for a real run and for the simulator's run of the same scenario.

Per mode:

- ``evictions_requested``: eviction requests the descheduler sent (real: the API server's audit log, every
  ``create`` of ``pods/eviction`` by the descheduler's ServiceAccount, whatever answered it; model: every eviction
  its descheduler sent);
- ``evictions_background``: answered 429 with KubeVirt's background text (``Eviction triggered evacuation``), which
  the descheduler counts as an eviction running in the background, whoever wrote it (KubeVirt or the guard);
- ``evictions_refused``: any other refusal (the descheduler's ``error``);
- ``migrations``: migration attempts that started (got one of KubeVirt's slots), failed ones included: the
  simulator's ``migrations_total``;
- ``max_leaving_per_node``: the most VMs marked for evacuation from one node at one instant (KubeVirt's model,
  real or simulated, counts it at every mark);
- ``evictions_during_migration``: evictions that reached KubeVirt's admitter for a VM already marked, or for a
  migration's target pod (the model's admitter reasons ``kubevirt_evacuation_in_progress`` and
  ``kubevirt_target_pod``; real: virt-api's own answers in the audit log, ``Evacuation in progress`` and
  ``Eviction request for target Pod``);
- ``cooldown_violations``: descheduler-caused evacuations (a new mark, not KubeVirt's retry of a failed attempt)
  that started while the VM was inside the KubevirtMigrationAware plugin's cooldown computed from its whole history
  (``app.policy.effective_cooldown`` with the scenario's ``plugin`` settings: 15m / 6h / 48h scaled like the run);
- balance (``app.sim.metrics.balance``, added by the run from the node scores: real, Prometheus's score as the
  descheduler reads it; model, the simulator's): ``spread_score``, the std of node scores averaged over the load
  samples; ``hot_node_seconds``, node-seconds above the descheduler's threshold; ``hot_longest_seconds``, the
  longest one node stayed above it.
"""

from __future__ import annotations

from collections import defaultdict

from app.policy import effective_cooldown
from app.policy.model import PolicySettings

BACKGROUND = "Eviction triggered evacuation"
VIRT_API_HOOK = "virt-launcher-eviction-interceptor.kubevirt.io"  # virt-api's eviction admitter
DURING_MIGRATION_TEXTS = ("Evacuation in progress", "Eviction request for target Pod")
KEYS = ("evictions_requested", "evictions_refused", "evictions_background", "migrations", "max_leaving_per_node",
        "evictions_during_migration", "cooldown_violations", "spread_score", "hot_node_seconds", "hot_longest_seconds")
DURING_MIGRATION = ("kubevirt_evacuation_in_progress", "kubevirt_target_pod")


def evacuation_starts(runs: list[dict], retry_window: float = 0) -> list[dict]:
    """The attempts that started an evacuation: a VM's attempt that is not a retry. A real run's attempts say it
    (``retry``: the VMI stayed marked since its previous attempt, which failed). The simulator's runs do not: there
    an attempt is a retry when the previous attempt of the same VM failed and this one was created at most
    ``retry_window`` seconds later (KubeVirt's evacuation controller creates the retry at its next look at the
    node: at the latest virt-handler's next heartbeat; a new mark in that time would need the old one cancelled and
    a new eviction admitted, which the guard's cooldown refuses)."""
    by_vm: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by_vm[r["vm"]].append(r)
    starts = []
    for attempts in by_vm.values():
        attempts.sort(key=lambda r: (r["created"], r["start"]))
        for prev, r in zip([None, *attempts], attempts):
            if "retry" in r:
                retry = r["retry"]
            else:
                retry = (prev is not None and prev["failed"] and prev["end"] is not None
                         and prev["end"] <= r["created"] <= prev["end"] + retry_window)
            if not retry:
                starts.append(r)
    return starts


def cooldown_violations(runs: list[dict], plugin: PolicySettings, retry_window: float = 0) -> list[dict]:
    """Descheduler-caused evacuations that started inside the plugin's cooldown of their VM."""
    history: dict[str, list[dict]] = defaultdict(list)
    for r in runs:  # the plugin counts every endTimestamp of the VMI's migrationState: failed attempts too
        if r["copy_start"] is not None and r["end"] is not None:
            history[r["vm"]].append(r)
    out = []
    for r in evacuation_starts(runs, retry_window):
        if r["cause"] != "descheduler":
            continue
        at = r["created"]
        before = [h for h in history[r["vm"]] if h["end"] <= at]
        if not before:
            continue
        last = max(before, key=lambda h: h["end"])
        count = sum(1 for h in before if h["end"] > at - plugin.migration_history_window)
        _, cooldown = effective_cooldown(last["end"] - last["copy_start"], count, plugin)
        if at - last["end"] < cooldown:
            out.append({"vm": r["vm"], "at": at, "last_end": last["end"], "cooldown": cooldown, "count": count})
    return out


def classify_answer(code: int, message: str) -> str:
    """How the descheduler reads an answer to its eviction: allowed, background or refused (its ``error``)."""
    if 200 <= code < 300:
        return "allowed"
    if code == 429 and BACKGROUND in message:
        return "background"
    return "refused"


def real_figures(audit_answers: list[tuple[int, str]], actor: dict, plugin: PolicySettings) -> dict:
    """From the descheduler's evictions in the audit log ((code, message) each: who answered is in the message,
    ``admission webhook "NAME" denied the request: ...``) and the actor's record of KubeVirt's VMIMs."""
    kinds = [classify_answer(code, msg) for code, msg in audit_answers]
    admitted = [(code, msg) for code, msg in audit_answers if 200 <= code < 300 or f'"{VIRT_API_HOOK}"' in msg]
    during = [msg for _, msg in admitted if any(t in msg for t in DURING_MIGRATION_TEXTS)]
    runs = actor["runs"]
    return {
        "evictions_requested": len(kinds),
        "evictions_refused": kinds.count("refused"),
        "evictions_background": kinds.count("background"),
        "migrations": len(runs),
        "max_leaving_per_node": actor["max_leaving_per_node"],
        "evictions_during_migration": len(during),
        "cooldown_violations": len(cooldown_violations(runs, plugin)),
        "evictions_allowed": kinds.count("allowed"),
        "migrations_failed": sum(1 for r in runs if r["failed"]),
        "evictions_reaching_kubevirt": len(admitted),
    }


def retry_window(kubevirt) -> float:
    """The longest KubeVirt's evacuation controller can take to create a retry after a failed attempt in the
    simulator: its target exits, then the node's next heartbeat (interval x (1 + jitter))."""
    interval = getattr(kubevirt, "heartbeat_interval", 60)
    return interval * (1 + getattr(kubevirt, "heartbeat_jitter", 1.2)) + getattr(kubevirt, "target_exit_seconds", 1) + 1


def model_figures(summary: dict, runs: list[dict], plugin: PolicySettings, window: float = 0) -> dict:
    """From the simulator's ``summarize`` and its migrations (``series``' list, with ``created`` added); ``window``:
    ``retry_window`` of the scenario's KubeVirt."""
    ev = summary["evictions"]
    outcomes = summary["descheduler_outcomes"]
    reaching = sum(n for reason, n in outcomes.items() if reason.startswith("kubevirt_"))
    return {
        "evictions_requested": ev["allowed"] + ev["background"] + ev["error"],
        "evictions_refused": ev["error"],
        "evictions_background": ev["background"],
        "migrations": summary["migrations_total"],
        "max_leaving_per_node": summary["max_leaving_per_node"],
        "evictions_during_migration": sum(outcomes.get(r, 0) for r in DURING_MIGRATION),
        "cooldown_violations": len(cooldown_violations(runs, plugin, window)),
        "evictions_allowed": ev["allowed"],
        "migrations_failed": summary["failed_migrations"],
        "evictions_reaching_kubevirt": reaching,
    }


def differs(real: float, model: float, tolerance: float = 0.15) -> bool:
    """More than ``tolerance`` apart, relative to the larger; counts that differ by one are never flagged."""
    gap = abs(real - model)
    return gap > 1 and gap > tolerance * max(abs(real), abs(model))
