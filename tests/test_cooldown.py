"""Cooldown arithmetic: the reference plugin's numbers, and properties of the three layers."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.records import migration_from_object, vmi_from_object
from app.policy import PolicySettings, cooldown_state, effective_cooldown, finished_migrations
from app.timefmt import parse_timestamp
from tests.builders import HOUR, MIN, NOW, mstate, vmi, vmim

DEFAULTS = PolicySettings()


def thirty_minute_migrations(count: int) -> list:
    """`count` 30-minute migrations, the last ending 1 minute ago, one every 2 hours before that."""
    return [
        migration_from_object(vmim(f"m{i}", "db", "Succeeded", 32 + 120 * i, mstate(f"m{i}", "a", "b", 31 + 120 * i, 1 + 120 * i)))
        for i in range(count)
    ]


@pytest.mark.parametrize("count, expected", [(1, 30 * MIN), (2, 60 * MIN), (3, 2 * HOUR), (4, 4 * HOUR), (5, 6 * HOUR)])
def test_reference_worked_example(count: int, expected: float) -> None:
    v = vmi_from_object(vmi("db", "b", created=100_000))
    st_ = cooldown_state(v, thirty_minute_migrations(count), NOW, DEFAULTS)
    assert st_ is not None
    assert st_.count == count
    assert st_.base == 30 * MIN
    assert st_.cooldown == expected


def test_cap_zero_means_no_cap() -> None:
    v = vmi_from_object(vmi("db", "b", created=100_000))
    st_ = cooldown_state(v, thirty_minute_migrations(5), NOW, PolicySettings(max_migration_cooldown=0))
    assert st_ is not None and st_.cooldown == 8 * HOUR


# the plugin counts a completion while end > now - window (ts.After(cutoff)): exactly the window's age is out
@pytest.mark.parametrize("ended_minutes_ago, counted", [(48 * 60 - 1 / 60, True), (48 * 60, False), (48 * 60 + 1, False)])
def test_history_window_edge_is_strict(ended_minutes_ago: float, counted: bool) -> None:
    old = migration_from_object(vmim("old", "db", "Succeeded", ended_minutes_ago + 2,
                                     mstate("old", "a", "b", ended_minutes_ago + 1, ended_minutes_ago)))
    recent = migration_from_object(vmim("new", "db", "Succeeded", 12, mstate("new", "b", "a", 11, 10)))
    v = vmi_from_object(vmi("db", "a", created=100_000))
    st_ = cooldown_state(v, [old, recent], NOW, DEFAULTS)
    assert st_ is not None and st_.count == (2 if counted else 1)


@pytest.mark.parametrize("raw_start", [None, "yesterday", "2026-13-45T99:00:00Z"])
def test_missing_or_malformed_start_falls_back_to_floor(raw_start) -> None:
    state = mstate("m1", "a", "b", start=None, end=5, raw_start=raw_start)
    v = vmi_from_object(vmi("db", "b", migration=state))
    st_ = cooldown_state(v, [], NOW, DEFAULTS)
    assert st_ is not None
    assert st_.last_duration is None and st_.base == DEFAULTS.migration_cooldown and st_.cooldown == 15 * MIN


def test_long_migration_raises_the_base() -> None:
    v = vmi_from_object(vmi("db", "b", migration=mstate("m1", "a", "b", start=50, end=5)))
    st_ = cooldown_state(v, [], NOW, DEFAULTS)
    assert st_ is not None and st_.base == 45 * MIN and st_.remaining == pytest.approx(40 * MIN)


def test_same_migration_on_vmi_and_as_vmim_counts_once() -> None:
    state = mstate("m1", "a", "b", 7, 5)
    v = vmi_from_object(vmi("db", "b", migration=state))
    m = migration_from_object(vmim("m1", "db", "Succeeded", 8, state))
    assert len(finished_migrations(v, [m])) == 1
    st_ = cooldown_state(v, [m], NOW, DEFAULTS)
    assert st_ is not None and st_.count == 1


def without_uid(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "migrationUid"}


def test_migration_without_uid_on_the_vmi_and_as_vmim_counts_once() -> None:
    state = mstate("m1", "a", "b", 7, 5)
    v = vmi_from_object(vmi("db", "b", migration=without_uid(state)))
    m = migration_from_object(vmim("m1", "db", "Succeeded", 8, state))
    assert len(finished_migrations(v, [m])) == 1
    st_ = cooldown_state(v, [m], NOW, DEFAULTS)
    assert st_ is not None and st_.count == 1 and st_.cooldown == 15 * MIN


def test_uidless_duplicates_in_any_source_count_once() -> None:
    state = without_uid(mstate("m1", "a", "b", 7, 5))
    v = vmi_from_object(vmi("db", "b", migration=state))
    m = migration_from_object(vmim("m1", "db", "Succeeded", 8, state, uid="vmim-uid"))
    twin = migration_from_object(vmim("m1b", "db", "Succeeded", 8, state, uid="vmim-uid"))  # same uid twice
    assert len(finished_migrations(v, [m, twin])) == 1


def test_different_uids_are_different_migrations_even_at_the_same_time() -> None:
    a = migration_from_object(vmim("m1", "db", "Failed", 8, mstate("m1", "a", "b", 7, 5, failed=True)))
    b = migration_from_object(vmim("m2", "db", "Succeeded", 8, mstate("m2", "a", "c", 7, 5)))
    assert len(finished_migrations(vmi_from_object(vmi("db", "c", created=100_000)), [a, b])) == 2


def test_uidless_migrations_that_ended_at_different_times_all_count() -> None:
    v = vmi_from_object(vmi("db", "b", created=100_000, migration=without_uid(mstate("x", "a", "b", 7, 5))))
    older = migration_from_object(vmim("m0", "db", "Succeeded", 40, without_uid(mstate("x", "b", "a", 39, 37))))
    st_ = cooldown_state(v, [older], NOW, DEFAULTS)
    assert st_ is not None and st_.count == 2 and st_.cooldown == 30 * MIN


def test_vmims_older_than_the_vmi_are_ignored() -> None:
    v = vmi_from_object(vmi("db", "b", created=60))
    older = migration_from_object(vmim("m0", "db", "Succeeded", 90, mstate("m0", "a", "b", 89, 5)))
    assert cooldown_state(v, [older], NOW, DEFAULTS) is None


def test_failed_migrations_count() -> None:
    v = vmi_from_object(vmi("db", "b", created=100_000))
    ok = migration_from_object(vmim("m1", "db", "Succeeded", 40, mstate("m1", "a", "b", 39, 37)))
    failed = migration_from_object(vmim("m2", "db", "Failed", 12, mstate("m2", "b", "c", 11, 10, failed=True)))
    st_ = cooldown_state(v, [ok, failed], NOW, DEFAULTS)
    assert st_ is not None and st_.count == 2 and st_.cooldown == 30 * MIN


def test_failed_vmim_without_migration_state_ends_at_its_phase_transition() -> None:
    obj = vmim("m3", "db", "Failed", 10)
    obj["status"]["phaseTransitionTimestamps"] = [
        {"phase": "Pending", "phaseTransitionTimestamp": "2026-11-21T11:50:00Z"},
        {"phase": "Failed", "phaseTransitionTimestamp": "2026-11-21T11:52:00Z"},
    ]
    m = migration_from_object(obj)
    st_ = cooldown_state(vmi_from_object(vmi("db", "b", created=100_000)), [m], NOW, DEFAULTS)
    assert st_ is not None and st_.remaining == pytest.approx(7 * MIN)


def test_unfinished_vmims_do_not_count() -> None:
    running = migration_from_object(vmim("m4", "db", "Running", 3, mstate("m4", "a", "b", 2)))
    assert cooldown_state(vmi_from_object(vmi("db", "b", created=100_000)), [running], NOW, DEFAULTS) is None


# ---- timestamps: what Go's time.Parse(time.RFC3339, s) accepts, nothing else ----------
# Both tables were run through Go's own time.Parse (go1.19, whose slow path is today's): every answer
# agreed but the two offsets out of range, which Go checks since 1.20 (the plugin's builds), and year 0.

Z = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("text, epoch", [
    ("2026-11-21T12:00:00Z", Z),
    ("2026-11-21T12:00:00.5Z", Z + 0.5),  # fractional seconds, though the layout has none
    ("2026-11-21T12:00:00,25Z", Z + 0.25),  # Go's parser takes a comma too
    ("2026-11-21T12:00:00.123456789999Z", Z + 0.123456789),  # beyond nanoseconds: cut
    ("2026-11-21T14:00:00+02:00", Z),
    ("2026-11-21T07:30:00-04:30", Z),
    ("2026-11-21T12:00:00-00:00", Z),
    ("2026-11-22T12:00:00+24:00", Z),  # Parse's offset range test is "> 24", not ">= 24"
    ("2026-11-21T2:00:00-10:00", Z),  # the layout's "15" is not zero-padded: one-digit hour
    ("2024-02-29T12:00:00Z", datetime(2024, 2, 29, 12, tzinfo=timezone.utc).timestamp()),
])
def test_go_rfc3339_accepted(text: str, epoch: float) -> None:
    assert parse_timestamp(text) == pytest.approx(epoch, abs=1e-6)


@pytest.mark.parametrize("text", [
    "2026-11-21T12:00:00",  # zone-less
    "2026-11-21 12:00:00Z",  # space-separated
    "2026-11-21t12:00:00Z", "2026-11-21T12:00:00z",  # lower case
    "20261121T120000Z", "2026-11-21T120000Z",  # compact
    "2026-11-21",  # date only
    "2026-11-21T12:00Z",  # no seconds
    "2026-11-21T12:00:00+0200", "2026-11-21T12:00:00+02",  # offset without colon or minutes
    "2026-11-21T12:00:00.Z",  # a point with no digit
    " 2026-11-21T12:00:00Z", "2026-11-21T12:00:00Z ", "2026-11-21T12:00:00ZZ",
    "2026-11-21T24:00:00Z", "2026-11-21T12:60:00Z", "2026-11-21T12:00:60Z",  # no 24:00, no leap second
    "2026-13-01T12:00:00Z", "2026-02-29T12:00:00Z", "2026-11-31T12:00:00Z",  # month, day out of range
    "2026-11-21T12:00:00+25:00", "2026-11-21T12:00:00+02:61",  # offset out of Parse's range
    "2026-1-21T12:00:00Z", "26-11-21T12:00:00Z",  # month and year are fixed width
    "2026-11-21T012:00:00Z",
    "２０２６-11-21T12:00:00Z",  # non-ASCII digits
    "0000-01-01T00:00:00Z",  # Go reads year 0; Python cannot: refused (fail open)
    "yesterday", "", "1700000000",
])
def test_not_go_rfc3339_is_unparsable(text: str) -> None:
    assert parse_timestamp(text) is None


def test_unparsable_end_fails_open() -> None:
    state = mstate("m1", "a", "b", 7, None)
    state["endTimestamp"] = "2026-11-21 11:55:00"  # Python would read it; Go does not
    v = vmi_from_object(vmi("db", "b", migration=state))
    assert cooldown_state(v, [], NOW, DEFAULTS) is None


# ---- properties ---------------------------------------------------------------

durations = st.floats(min_value=0, max_value=48 * HOUR, allow_nan=False)
counts = st.integers(min_value=0, max_value=40)
floors = st.floats(min_value=0, max_value=6 * HOUR, allow_nan=False)


@given(duration=st.one_of(st.none(), durations), count=counts, floor=floors, cap=st.floats(min_value=0, max_value=48 * HOUR))
def test_cooldown_never_exceeds_a_nonzero_cap(duration, count, floor, cap) -> None:
    if cap and cap < floor:
        cap = floor
    _, cooldown = effective_cooldown(duration, count, PolicySettings(migration_cooldown=floor, max_migration_cooldown=cap))
    if cap > 0:
        assert cooldown <= cap


@given(duration=st.one_of(st.none(), durations), count=counts, floor=floors)
def test_cooldown_never_below_the_floor(duration, count, floor) -> None:
    settings = PolicySettings(migration_cooldown=floor, max_migration_cooldown=floor * 4)
    _, cooldown = effective_cooldown(duration, count, settings)
    assert cooldown >= floor


@given(duration=st.one_of(st.none(), durations), count=counts, floor=floors, cap=st.floats(min_value=0, max_value=48 * HOUR))
def test_cooldown_is_monotone_in_count(duration, count, floor, cap) -> None:
    settings = PolicySettings(migration_cooldown=floor, max_migration_cooldown=max(cap, floor) if cap else 0)
    assert effective_cooldown(duration, count + 1, settings)[1] >= effective_cooldown(duration, count, settings)[1]


@given(n=st.integers(min_value=1, max_value=5), age=st.floats(min_value=0, max_value=47 * 60))
def test_within_window_cooldown_holds_at_least_the_floor(n: int, age: float) -> None:
    migs = [migration_from_object(vmim(f"m{i}", "db", "Succeeded", age + 3 + i, mstate(f"m{i}", "a", "b", age + 2 + i, age + i)))
            for i in range(n)]
    st_ = cooldown_state(vmi_from_object(vmi("db", "b", created=100_000)), migs, NOW, DEFAULTS)
    assert st_ is not None and DEFAULTS.migration_cooldown <= st_.cooldown <= DEFAULTS.max_migration_cooldown
    assert st_.count == n
