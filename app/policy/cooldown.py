"""Cooldown arithmetic: the reference plugin's three layers, same numbers.

1. base = max(migrationCooldown, duration of the last finished migration)
   (duration unknown or unparsable: migrationCooldown alone);
2. backoff = base x 2^(count - 1), count = finished migrations that ended
   less than migrationHistoryWindow ago (0 or 1 -> x1);
3. cap = min(backoff, maxMigrationCooldown), unless the cap is 0.

A VMI is in cooldown while now < last.end + cooldown.

Unlike the plugin, whose history lives in memory, the finished migrations
are read from cluster objects: the VMI's own ``migrationState``, the VMIMs
KubeVirt keeps (the 5 most recent finished per VMI) and the guard's history
annotation on the VMI (older ones, past KubeVirt's 5). Replicas and restarts
therefore compute the same numbers. A migration counts while
``end > now - window`` (strict, as in the plugin).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from app.domain.records import MigrationRecord, VMIRecord
from app.policy.model import PolicySettings


@dataclass(slots=True, frozen=True)
class FinishedMigration:
    uid: str
    start: float | None
    end: float


@dataclass(slots=True, frozen=True)
class CooldownState:
    last_end: float
    last_duration: float | None  # None when the start is missing or malformed
    base: float
    count: int  # finished migrations within the history window
    cooldown: float  # the effective cooldown
    remaining: float  # > 0 while in cooldown
    floor: float = 0.0  # migrationCooldown as applied to this VM (its override, if any)
    cap: float = 0.0  # maxMigrationCooldown as applied to this VM (0 = no cap)

    @property
    def active(self) -> bool:
        return self.remaining > 0


def relevant_migrations(vmi: VMIRecord, migrations: Iterable[MigrationRecord]) -> list[MigrationRecord]:
    """VMIMs of this VMI incarnation: a VMIM created before the VMI belongs to an
    earlier VMI of the same name and says nothing about this one."""
    created = vmi.created
    if created is None:
        return list(migrations)
    return [m for m in migrations if m.created is None or m.created >= created]


def finished_migrations(vmi: VMIRecord, migrations: Iterable[MigrationRecord]) -> list[FinishedMigration]:
    """The union over every source of finished migrations, de-duplicated (see ``dedup``).

    Sources, in this order: the VMI's ended ``migrationState``; its Succeeded/Failed
    VMIMs; the guard's history annotation, as far as those vouch for it. Entries whose
    end cannot be read are dropped (fail open: an unknown end cannot put a VMI in cooldown)."""
    known = [*from_vmi_state(vmi), *from_vmims(vmi, migrations)]
    return dedup([*known, *from_history(vmi, known)])


def from_vmi_state(vmi: VMIRecord) -> list[FinishedMigration]:
    state = vmi.migration
    if state is not None and state.ended and state.end is not None:
        return [FinishedMigration(state.uid, state.start, state.end)]
    return []


def from_vmims(vmi: VMIRecord, migrations: Iterable[MigrationRecord]) -> list[FinishedMigration]:
    return [FinishedMigration(m.uid, m.start, m.end) for m in relevant_migrations(vmi, migrations)
            if m.finished and m.end is not None]


def from_history(vmi: VMIRecord, known: Sequence[FinishedMigration]) -> list[FinishedMigration]:
    """The VMI's history annotation (``kubevirt-eviction-guard.io/migration-history``), only
    when KubeVirt's own objects (``known``) show a finished migration, and only entries that
    ended before the latest of those and not before the VMI was created. So the
    annotation can add to the count, never supply the last migration (its end and
    duration stay KubeVirt's)."""
    if not vmi.history or not known:
        return []
    anchor = max(f.end for f in known)
    created = vmi.created if vmi.created is not None else float("-inf")
    return [FinishedMigration(h.uid, h.start, h.end) for h in vmi.history if created <= h.end < anchor]


def dedup(candidates: Iterable[FinishedMigration]) -> list[FinishedMigration]:
    """One entry per migration, first seen kept. Two entries are one migration when they
    carry the same uid, or when one of them has no uid and they ended at the same time
    (one VMI's migrations run one at a time, so two of them never end in the same
    instant; the plugin's own history likewise records an end only when it changes).
    Two different uids are two migrations, whatever their times."""
    out: list[FinishedMigration] = []
    uids: set[str] = set()
    ends: set[float] = set()  # of every entry kept
    uidless_ends: set[float] = set()  # of the entries kept without a uid
    for f in candidates:
        if (f.uid in uids or f.end in uidless_ends) if f.uid else f.end in ends:
            continue
        out.append(f)
        ends.add(f.end)
        if f.uid:
            uids.add(f.uid)
        else:
            uidless_ends.add(f.end)
    return out


def effective_cooldown(last_duration: float | None, count: int, settings: PolicySettings) -> tuple[float, float]:
    """(base, effective cooldown) for a last migration of ``last_duration`` seconds and
    ``count`` migrations in the window."""
    base = settings.migration_cooldown
    if last_duration is not None and last_duration > base:
        base = last_duration
    return base, scaled_cooldown(settings.migration_cooldown, settings.max_migration_cooldown, last_duration, count)


def scaled_cooldown(floor: float, cap: float, last_duration: float | None, count: int) -> float:
    """max(floor, last_duration) x 2^(count - 1), at most ``cap`` (0: no cap). Also the node cooldowns' arithmetic."""
    base = floor
    if last_duration is not None and last_duration > base:
        base = last_duration
    cooldown = base * (2 ** (max(count, 1) - 1))
    if cap > 0 and cooldown > cap:
        cooldown = cap
    return cooldown


def vm_settings(vmi: VMIRecord, settings: PolicySettings) -> PolicySettings:
    """The settings for this VM. Its ``migration-cooldown`` annotation replaces
    ``migrationCooldown``; a non-zero ``maxMigrationCooldown`` below it is raised to it
    (the invariant validation keeps globally: the cap is 0 or at least the floor)."""
    o = vmi.overrides
    if o is None or o.cooldown is None:
        return settings
    cap = settings.max_migration_cooldown
    if 0 < cap < o.cooldown:
        cap = o.cooldown
    return replace(settings, migration_cooldown=o.cooldown, max_migration_cooldown=cap)


def cooldown_state(
    vmi: VMIRecord, migrations: Sequence[MigrationRecord], now: float, settings: PolicySettings
) -> CooldownState | None:
    """The VMI's cooldown numbers, or None when it has no finished migration with a known end."""
    finished = finished_migrations(vmi, migrations)
    if not finished:
        return None
    settings = vm_settings(vmi, settings)
    last = max(finished, key=lambda f: f.end)
    duration = last.end - last.start if last.start is not None and last.start <= last.end else None
    horizon = now - settings.migration_history_window
    count = sum(1 for f in finished if f.end > horizon)  # strict, as the plugin's ts.After(cutoff)
    base, cooldown = effective_cooldown(duration, count, settings)
    return CooldownState(
        last_end=last.end,
        last_duration=duration,
        base=base,
        count=count,
        cooldown=cooldown,
        remaining=last.end + cooldown - now,
        floor=settings.migration_cooldown,
        cap=settings.max_migration_cooldown,
    )
