"""One VM as both views show it: its launcher pod, its own choices, its cooldown numbers."""

from __future__ import annotations

from typing import Any

from app.cluster.store import ClusterStore
from app.domain.records import COOLDOWN_OVERRIDE, EXEMPT_OVERRIDE, LauncherPod, VMIRecord
from app.inspect.fields import seconds, timestamp
from app.policy import cooldown_state
from app.policy.cooldown import CooldownState, relevant_migrations
from app.policy.decide import is_migration_target, is_vm_pod
from app.policy.model import PolicySettings
from app.timefmt import format_duration


def launcher_pods(store: ClusterStore) -> dict[tuple[str, str], LauncherPod]:
    """Each VMI's own launcher pod (the one the descheduler would evict): a running launcher pod of
    the VMI that is not the target of a migration; by name when there are several."""
    found: dict[tuple[str, str], LauncherPod] = {}
    for pod in sorted(store.pods(), key=lambda p: p.name):
        if not is_vm_pod(pod):
            continue
        key = (pod.namespace, pod.vmi_name)
        vmi = store.vmi(*key)
        if key in found or vmi is None or is_migration_target(pod, vmi, store):
            continue
        found[key] = pod
    return found


def per_vm(vmi: VMIRecord, pod: LauncherPod | None, settings: PolicySettings) -> dict[str, Any]:
    """The VM's own choices, from annotations: prefer-no-eviction and the guard's overrides."""
    o = vmi.overrides
    return {
        "preferNoEviction": {"vmi": vmi.prefer_no_eviction, "pod": bool(pod and pod.prefer_no_eviction),
                             "honored": settings.honor_prefer_no_eviction},
        "exempt": bool(o and o.exempt),
        "exemptIgnored": (o.exempt_ignored or None) if o else None,
        "migrationCooldown": seconds(o.cooldown) if o else None,
        "migrationCooldownIgnored": (o.cooldown_ignored or None) if o and o.cooldown is None else None,
    }


def short_notes(choices: dict[str, Any]) -> list[str]:
    """The choices in a few words, for report's NOTES column."""
    notes = ["prefer-no-eviction"] if choices["preferNoEviction"]["vmi"] else []
    if choices["exempt"]:
        notes.append("exempt")
    elif choices["exemptIgnored"]:
        notes.append("exempt=ignored")
    if choices["migrationCooldown"] is not None:
        notes.append(f"cooldown={format_duration(choices['migrationCooldown'])}")
    elif choices["migrationCooldownIgnored"]:
        notes.append("cooldown=ignored(bad-duration)")
    return notes


def long_notes(choices: dict[str, Any]) -> str:
    """The choices in full, for explain's ``per-VM`` line."""
    pne = choices["preferNoEviction"]
    where = [w for w in ("vmi", "pod") if pne[w]]
    if where:
        honored = "honoured" if pne["honored"] else "not honoured: honorPreferNoEviction false"
        parts = [f"prefer-no-eviction (on the {' and '.join(where)}; {honored}, descheduler evictions only)"]
    else:
        parts = ["prefer-no-eviction no"]
    overrides = []
    if choices["exempt"]:
        overrides.append(f"{EXEMPT_OVERRIDE}: true (only the in-flight rules apply)")
    elif choices["exemptIgnored"]:
        overrides.append(f"{EXEMPT_OVERRIDE}: {choices['exemptIgnored']!r} ignored (only \"true\" exempts)")
    if choices["migrationCooldown"] is not None:
        overrides.append(f"{COOLDOWN_OVERRIDE}: {format_duration(choices['migrationCooldown'])} "
                         "(replaces migrationCooldown)")
    elif choices["migrationCooldownIgnored"]:
        overrides.append(f"{COOLDOWN_OVERRIDE}: {choices['migrationCooldownIgnored']} ignored: bad duration "
                         "(migrationCooldown used)")
    parts.extend(overrides or [f"no {COOLDOWN_OVERRIDE.split('/')[0]} overrides"])
    return "; ".join(parts)


def cooldown_fields(st: CooldownState | None, settings: PolicySettings) -> dict[str, Any] | None:
    """`cooldown`'s arithmetic for one VM (None: no finished migration)."""
    if st is None:
        return None
    return {
        "lastEnd": timestamp(st.last_end),
        "lastDuration": seconds(st.last_duration),
        "floor": seconds(st.floor),
        "floorFrom": "migrationCooldown" if st.floor == settings.migration_cooldown else COOLDOWN_OVERRIDE,
        "base": seconds(st.base),
        "count": st.count,
        "window": seconds(settings.migration_history_window),
        "cap": seconds(st.cap),
        "capRaised": st.cap != settings.max_migration_cooldown,
        "cooldown": seconds(st.cooldown),
        "remaining": seconds(max(st.remaining, 0)),
        "active": st.active,
    }


def vm_cooldown(store: ClusterStore, vmi: VMIRecord, now: float, settings: PolicySettings) -> CooldownState | None:
    return cooldown_state(vmi, relevant_migrations(vmi, store.migrations(vmi.namespace, vmi.name)), now, settings)
