"""Cooldown arithmetic: the reference plugin's three layers, same numbers.

1. base = max(migrationCooldown, duration of the last finished migration)
   (duration unknown or unparsable: migrationCooldown alone);
2. backoff = base x 2^(count - 1), count = finished migrations that ended
   within migrationHistoryWindow of now (0 or 1 -> x1);
3. cap = min(backoff, maxMigrationCooldown), unless the cap is 0.

A VMI is in cooldown while now < last.end + cooldown.

Unlike the plugin, whose history lives in memory, the finished migrations
are read from cluster objects: the VMI's own ``migrationState``, the VMIMs
KubeVirt keeps (the 5 most recent finished per VMI) and the guard's history
annotation on the VMI (older ones, past KubeVirt's 5). Replicas and restarts
therefore compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    """The union, de-duplicated by migration uid, of the VMI's ended ``migrationState``
    and its Succeeded/Failed VMIMs. Entries whose end cannot be read are dropped
    (fail open: an unknown end cannot put a VMI in cooldown)."""
    out: list[FinishedMigration] = []
    seen: set[str] = set()
    state = vmi.migration
    if state is not None and state.ended and state.end is not None:
        out.append(FinishedMigration(state.uid, state.start, state.end))
        if state.uid:
            seen.add(state.uid)
    for m in relevant_migrations(vmi, migrations):
        if not m.finished or m.end is None or (m.uid and m.uid in seen):
            continue
        if m.uid:
            seen.add(m.uid)
        out.append(FinishedMigration(m.uid, m.start, m.end))
    out.extend(recorded_migrations(vmi, out, seen))
    return out


def recorded_migrations(vmi: VMIRecord, known: Sequence[FinishedMigration], seen: set[str]) -> list[FinishedMigration]:
    """The VMI's history annotation, as far as KubeVirt's own objects vouch for it: only
    with a finished migration in ``known`` (its latest end is the anchor), only entries
    that ended no later than the anchor and not before the VMI was created, each uid
    and each end second once. So the annotation can add to the count, never
    supply the last migration (its end and duration stay KubeVirt's)."""
    if not vmi.history or not known:
        return []
    anchor = max(f.end for f in known)
    ends = {int(f.end) for f in known}  # one VMI never finishes two migrations in the same second
    out = []
    for h in vmi.history:
        if h.end > anchor or (vmi.created is not None and h.end < vmi.created):
            continue
        if (h.uid and h.uid in seen) or int(h.end) in ends:
            continue
        if h.uid:
            seen.add(h.uid)
        ends.add(int(h.end))
        out.append(FinishedMigration(h.uid, h.start, h.end))
    return out


def effective_cooldown(last_duration: float | None, count: int, settings: PolicySettings) -> tuple[float, float]:
    """(base, effective cooldown) for a last migration of ``last_duration`` seconds and
    ``count`` migrations in the window."""
    base = settings.migration_cooldown
    if last_duration is not None and last_duration > base:
        base = last_duration
    cooldown = base * (2 ** (max(count, 1) - 1))
    cap = settings.max_migration_cooldown
    if cap > 0 and cooldown > cap:
        cooldown = cap
    return base, cooldown


def cooldown_state(
    vmi: VMIRecord, migrations: Sequence[MigrationRecord], now: float, settings: PolicySettings
) -> CooldownState | None:
    """The VMI's cooldown numbers, or None when it has no finished migration with a known end."""
    finished = finished_migrations(vmi, migrations)
    if not finished:
        return None
    last = max(finished, key=lambda f: f.end)
    duration = last.end - last.start if last.start is not None and last.start <= last.end else None
    horizon = now - settings.migration_history_window
    count = sum(1 for f in finished if f.end >= horizon)
    base, cooldown = effective_cooldown(duration, count, settings)
    return CooldownState(
        last_end=last.end,
        last_duration=duration,
        base=base,
        count=count,
        cooldown=cooldown,
        remaining=last.end + cooldown - now,
    )
