"""The migration-history annotation: codec, bound, merge, what policy believes of it, the recorder's job."""

from __future__ import annotations

import copy
import json

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.cluster.store import ClusterStore
from app.domain.history import HISTORY_ANNOTATION, MAX_ENTRIES, HistoryEntry, encode_history, parse_history
from app.domain.records import migration_from_object, vmi_from_object
from app.effects.history import (
    HistoryJob,
    HistoryRecorder,
    history_bound,
    known_migrations,
    merge,
    needs_write,
)
from app.effects.kubeapi import Conflict
from app.effects.queue import EffectQueue, Retry
from app.metrics import Metrics
from app.policy import PolicySettings, cooldown_state, effective_cooldown
from tests.builders import HOUR, MIN, NOW, history_annotation, mstate, six_short_migrations, store_of, ts, vmi, vmim

DEFAULTS = PolicySettings()


def entry(uid: str, start_min: float | None, end_min: float, outcome: str = "Succeeded") -> HistoryEntry:
    return HistoryEntry(uid, NOW - start_min * MIN if start_min is not None else None, NOW - end_min * MIN, outcome)


# ---- codec ------------------------------------------------------------------------------------------


def test_round_trip() -> None:
    entries = (entry("a", 70, 60), entry("b", None, 30, "Failed"), entry("", 12, 2))
    assert parse_history(encode_history(entries)) == entries
    assert json.loads(encode_history(entries))[0] == {"uid": "a", "start": ts(70), "end": ts(60), "outcome": "Succeeded"}


@pytest.mark.parametrize("raw", [None, 7, "", "not json", "{}", '{"uid": "a"}', "[1, 2]", '[{"uid": "a"}]',
                                 '[{"uid": "a", "end": "yesterday"}]', '[{"uid": "a", "end": 1800000000}]',
                                 "[" * 5000, "[]", " " * (20 * 1024) + "[]"])
def test_malformed_reads_as_no_history(raw) -> None:
    assert parse_history(raw) == ()


def test_bad_entries_are_skipped_good_ones_kept() -> None:
    raw = json.dumps([{"uid": ["x"], "start": 5, "end": ts(10), "outcome": {"a": 1}}, "junk",
                      {"uid": "b", "end": ts(5), "outcome": "Exploded"}])
    assert parse_history(raw) == (HistoryEntry("", None, NOW - 10 * MIN), HistoryEntry("b", None, NOW - 5 * MIN))


@pytest.mark.parametrize("bad", [{"uid": "x"}, {"uid": "x", "end": None}, {"uid": "x", "end": "yesterday"},
                                 {"uid": "x", "end": 1800000000}, {"uid": "x", "start": ts(20), "end": ""}])
def test_an_entry_without_a_readable_end_is_skipped_beside_good_ones(bad) -> None:
    """Only that entry goes: the good ones on either side of it still count (a history dropped whole would
    shorten every cooldown the annotation carries)."""
    raw = json.dumps([{"uid": "a", "start": None, "end": ts(30)}, bad, {"uid": "b", "start": None, "end": ts(10)}])
    assert parse_history(raw) == (HistoryEntry("a", None, NOW - 30 * MIN), HistoryEntry("b", None, NOW - 10 * MIN))


def test_projection_reads_the_annotation_and_ignores_garbage() -> None:
    good = vmi_from_object(vmi("db", "a", annotations=history_annotation(("m1", 20, 10))))
    assert good.history == (entry("m1", 20, 10),)
    bad = vmi_from_object(vmi("db", "a", annotations={HISTORY_ANNOTATION: "{oops"}))
    assert bad.history == ()
    assert vmi_from_object(vmi("db", "a", annotations={HISTORY_ANNOTATION: ["not", "a", "string"]})).history == ()


def test_only_the_newest_max_entries_are_read() -> None:
    many = [entry(f"u{i}", None, 1000 - i) for i in range(MAX_ENTRIES + 10)]
    parsed = parse_history(encode_history(many))
    assert len(parsed) == MAX_ENTRIES and parsed[-1].uid == f"u{MAX_ENTRIES + 9}"


@given(st.text(max_size=300) | st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                                            lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                                            max_leaves=20).map(lambda v: json.dumps(v)))
def test_parse_never_raises(raw: str) -> None:
    assert isinstance(parse_history(raw), tuple)


# ---- the bound ---------------------------------------------------------------------------------------


def test_bound_with_defaults_is_six() -> None:
    # 15m x 2^4 = 4h < 6h; 15m x 2^5 = 8h -> the cap
    assert history_bound(DEFAULTS) == 6
    assert effective_cooldown(10 * MIN, 5, DEFAULTS)[1] == 4 * HOUR
    assert effective_cooldown(10 * MIN, 6, DEFAULTS)[1] == 6 * HOUR


def test_bound_without_cap_is_the_maximum() -> None:
    assert history_bound(PolicySettings(max_migration_cooldown=0)) == MAX_ENTRIES


@given(st.integers(0, 7 * 86400), st.integers(1, 365 * 86400), st.integers(1, 86400))
def test_bound_is_where_the_cap_is_reached(floor: int, cap: int, duration: int) -> None:
    if cap < floor:
        return  # refused by settings validation
    s = PolicySettings(migration_cooldown=floor, max_migration_cooldown=cap)
    n = history_bound(s)
    # with n migrations any last migration (whole seconds, >= 1 s) is at the cap: more cannot change a thing
    assert effective_cooldown(duration, n, s)[1] == cap
    if n > 1:  # and n is the least such count for the shortest migration
        assert effective_cooldown(max(floor, 1), n - 1, s)[1] < cap


# ---- merge -------------------------------------------------------------------------------------------


def test_merge_adds_what_kubevirt_shows_and_keeps_the_rest() -> None:
    existing = (entry("a", 200, 190), entry("b", 100, 90))
    known = [entry("b", 100, 90), entry("c", 20, 10)]
    merged, adds = merge(existing, known, NOW, DEFAULTS)
    assert adds and [e.uid for e in merged] == ["a", "b", "c"]


@given(st.lists(st.tuples(st.sampled_from("abcdefghij"), st.integers(0, 4000)), max_size=12),
       st.lists(st.tuples(st.sampled_from("abcdefghij"), st.integers(0, 4000)), max_size=8))
@example(ex=[], kn=[(u, 0) for u in "abcdefg"])  # ties beyond the bound: which ones are kept must not flip
def test_merge_never_invents_and_is_idempotent(ex: list, kn: list) -> None:
    existing = tuple(parse_history(encode_history([entry(u, None, m) for u, m in ex])))
    known = [entry(u, None, m) for u, m in kn]
    merged, adds = merge(existing, known, NOW, DEFAULTS)
    assert all(e in existing or e in known for e in merged)
    assert len(merged) <= history_bound(DEFAULTS)
    assert all(e.end >= NOW - DEFAULTS.migration_history_window for e in merged)
    written = parse_history(encode_history(merged)) if adds else existing
    assert merge(written, known, NOW, DEFAULTS)[1] is False  # a write (or none) leaves nothing more to write
    assert merge(written, known, NOW + 3600, DEFAULTS)[1] is False  # nor does time passing


def test_merge_does_not_write_just_to_trim() -> None:
    stale = (entry("old", 50 * 60, 49 * 60),) + tuple(entry(f"u{i}", 100 - i, 90 - i) for i in range(8))
    merged, adds = merge(stale, [entry("u7", 93, 83)], NOW, DEFAULTS)
    assert adds is False
    merged, adds = merge(stale, [entry("new", 12, 2)], NOW, DEFAULTS)
    assert adds and len(merged) == 6 and "old" not in {e.uid for e in merged} and merged[-1].uid == "new"


def test_an_entry_the_bound_would_drop_is_not_a_reason_to_write() -> None:
    settings = PolicySettings(migration_cooldown=15 * MIN, max_migration_cooldown=30 * MIN)  # bound 2
    existing = (entry("b", 40, 30), entry("c", 20, 10))
    assert merge(existing, [entry("a", 60, 50), entry("b", 40, 30), entry("c", 20, 10)], NOW, settings)[1] is False


# ---- what policy believes --------------------------------------------------------------------------------


def six(history: bool = True):
    objs = six_short_migrations()
    if not history:
        objs[0]["metadata"].pop("annotations")
    v = vmi_from_object(objs[0])
    return v, [migration_from_object(o) for o in objs[1:]]


def test_six_ten_minute_migrations_reach_the_plugins_cap() -> None:
    v, kept = six()
    assert len(kept) == 5  # KubeVirt garbage-collected the sixth
    state = cooldown_state(v, kept, NOW, DEFAULTS)
    assert state is not None and (state.count, state.base, state.cooldown) == (6, 15 * MIN, 6 * HOUR)
    v, kept = six(history=False)
    state = cooldown_state(v, kept, NOW, DEFAULTS)
    assert state is not None and (state.count, state.cooldown) == (5, 4 * HOUR)  # what the guard said before


def test_annotation_alone_counts_nothing() -> None:
    # no finished migration in KubeVirt's objects: nothing anchors the annotation
    v = vmi_from_object(vmi("db", "a", annotations=history_annotation(("m1", 20, 10), ("m2", 40, 30))))
    assert cooldown_state(v, [], NOW, DEFAULTS) is None


def test_forged_entries_cannot_move_the_last_migration_or_count_twice() -> None:
    real = mstate("real", "a", "b", 100, 90)
    forged = history_annotation(("future", 5, 1), ("real", 3, 2), ("dup-end", 100, 90), ("twin", 200, 190), ("twin", 200, 190),
                                ("before-vmi", 20_000, 19_990))
    v = vmi_from_object(vmi("db", "b", created=10_000, migration=real, annotations=forged))
    state = cooldown_state(v, [], NOW, DEFAULTS)
    assert state is not None
    assert state.last_end == NOW - 90 * MIN and state.last_duration == 10 * MIN  # KubeVirt's, not the annotation's
    assert state.count == 2  # "real" and one "twin"


def test_forged_entries_raise_the_count_only_up_to_the_cap() -> None:
    many = [(f"f{i}", 100 + 10 * i, 95 + 10 * i) for i in range(40)]
    v = vmi_from_object(vmi("db", "b", migration=mstate("real", "a", "b", 12, 2), annotations=history_annotation(*many)))
    state = cooldown_state(v, [], NOW, DEFAULTS)
    assert state is not None and state.cooldown == DEFAULTS.max_migration_cooldown and state.last_end == NOW - 2 * MIN


# ---- the recorder's job ---------------------------------------------------------------------------------


class VmiApi:
    """An EffectsApi holding VMI objects: GET returns a copy, PATCH applies a JSON patch with its test."""

    def __init__(self, *objs: dict) -> None:
        self.objs = {o["metadata"]["name"]: copy.deepcopy(o) for o in objs}
        self.gets: list[str] = []
        self.patches: list[list] = []
        self.conflicts = 0  # answer this many patches 422 (the VMI changed meanwhile)

    def read_vmi(self, namespace, name):
        self.gets.append(name)
        return copy.deepcopy(self.objs[name])

    def patch_vmi(self, namespace, name, patch):
        import jsonpatch

        self.patches.append(copy.deepcopy(patch))
        obj = self.objs[name]
        if self.conflicts:
            self.conflicts -= 1
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        try:
            new = jsonpatch.JsonPatch(patch).apply(obj)
        except jsonpatch.JsonPatchTestFailed:
            raise Conflict("422") from None
        new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.objs[name] = new


def cluster_after_gc(history: bool = False) -> tuple[list[dict], dict]:
    objs = six_short_migrations()
    v = objs[0]
    if not history:
        v["metadata"]["annotations"] = {"kubevirt.io/latest-observed-api-version": "v1"}
    v["metadata"]["resourceVersion"] = "41"
    return objs, v


def test_job_writes_what_kubevirt_shows_guarded_by_resource_version() -> None:
    objs, v = cluster_after_gc()
    store, api = store_of(*objs), VmiApi(v)
    job = HistoryJob(store, api, "vms", "db", DEFAULTS, clock=lambda: NOW)
    assert job.run() == "applied"
    (patch,) = api.patches
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert patch[1]["path"] == "/metadata/annotations/kubevirt-eviction-guard.io~1migration-history"
    written = parse_history(api.objs["db"]["metadata"]["annotations"][HISTORY_ANNOTATION])
    assert [e.uid for e in written] == ["m4", "m3", "m2", "m1", "m0"]  # the 5 KubeVirt still shows, nothing invented
    store.upsert(vmi_from_object(api.objs["db"]))
    assert HistoryJob(store, api, "vms", "db", DEFAULTS, clock=lambda: NOW).run() == "not_needed"
    assert len(api.patches) == 1 and len(api.gets) == 1  # the second run needed no API call


def test_job_adds_the_annotations_map_when_there_is_none() -> None:
    objs, v = cluster_after_gc()
    del v["metadata"]["annotations"]
    api = VmiApi(v)
    assert HistoryJob(store_of(*objs), api, "vms", "db", DEFAULTS, clock=lambda: NOW).run() == "applied"
    assert api.patches[0][1]["path"] == "/metadata/annotations" and HISTORY_ANNOTATION in api.patches[0][1]["value"]


def test_conflict_is_retried_after_reading_again() -> None:
    objs, v = cluster_after_gc()
    store, api = store_of(*objs), VmiApi(v)
    api.conflicts = 1
    job = HistoryJob(store, api, "vms", "db", DEFAULTS, clock=lambda: NOW)
    with pytest.raises(Retry):
        job.run()
    assert job.run() == "applied"
    assert [p[0]["value"] for p in api.patches] == ["41", "42"] and len(api.gets) == 2


def test_job_for_another_incarnation_writes_nothing() -> None:
    objs, v = cluster_after_gc()
    v = copy.deepcopy(v)
    v["metadata"]["uid"] = "uid-new-incarnation"
    api = VmiApi(v)
    assert HistoryJob(store_of(*objs), api, "vms", "db", DEFAULTS, clock=lambda: NOW).run() == "not_needed"
    assert api.patches == []


def test_job_keeps_what_the_annotation_had_and_adds_the_new_migration() -> None:
    objs, v = cluster_after_gc(history=True)
    # the annotation knows m0..m5; a seventh migration m6 has just finished
    v["status"]["migrationState"] = mstate("m6", "worker-a", "worker-b", 0.5, 0.2)
    objs = [v, *objs[1:], vmim("m6", "db", "Succeeded", 0.6, mstate("m6", "worker-a", "worker-b", 0.5, 0.2))]
    api = VmiApi(v)
    assert HistoryJob(store_of(*objs), api, "vms", "db", DEFAULTS, clock=lambda: NOW).run() == "applied"
    written = parse_history(api.objs["db"]["metadata"]["annotations"][HISTORY_ANNOTATION])
    assert [e.uid for e in written] == ["m4", "m3", "m2", "m1", "m0", "m6"]  # 6 newest: m5 has done its work


# ---- the recorder's triggers ------------------------------------------------------------------------------


def recorder_on(store: ClusterStore, capacity: int = 1000) -> tuple[HistoryRecorder, EffectQueue]:
    queue = EffectQueue(Metrics(), capacity=capacity)
    rec = HistoryRecorder(store, VmiApi(), queue, DEFAULTS, clock=lambda: NOW)
    store.add_listener(rec.on_change)
    return rec, queue


def test_a_vmim_turning_final_queues_one_job() -> None:
    store = ClusterStore()
    store.upsert(vmi_from_object(vmi("db", "a")))
    rec, queue = recorder_on(store)
    store.upsert(migration_from_object(vmim("m1", "db", "Running", 5, mstate("m1", "a", "b", 4))))
    assert len(queue) == 0
    store.upsert(migration_from_object(vmim("m1", "db", "Succeeded", 5, mstate("m1", "a", "b", 4, 1))))
    store.upsert(migration_from_object(vmim("m1", "db", "Succeeded", 5, mstate("m1", "a", "b", 4, 1))))  # resync
    assert len(queue) == 1


def test_own_write_does_not_trigger_again() -> None:
    store = ClusterStore()
    ended = vmi("db", "a", migration=mstate("m1", "b", "a", 4, 1))
    store.upsert(vmi_from_object(ended))
    rec, queue = recorder_on(store)
    store.upsert(vmi_from_object(vmi("db", "a", migration=mstate("m1", "b", "a", 4, 1),
                                     annotations=history_annotation(("m1", 4, 1)))))
    assert len(queue) == 0
    store.upsert(vmi_from_object(vmi("db", "b", migration=mstate("m2", "a", "b", 0.5, 0.1))))
    assert len(queue) == 1


def test_reconcile_finds_what_is_missing_and_leaves_half_the_queue() -> None:
    objs = [vmi(f"vm{i}", "a", migration=mstate(f"m{i}", "b", "a", 4, 1)) for i in range(10)]
    objs.append(vmi("quiet", "a"))
    objs.append(vmi("done", "a", migration=mstate("md", "b", "a", 4, 1), annotations=history_annotation(("md", 4, 1))))
    store = store_of(*objs)
    rec, queue = recorder_on(store, capacity=8)
    assert rec.reconcile() == 4 and len(queue) == 4
    assert not needs_write(store, store.vmi("vms", "quiet"), NOW, DEFAULTS)
    assert not needs_write(store, store.vmi("vms", "done"), NOW, DEFAULTS)


def test_known_migrations_are_only_kubevirts() -> None:
    objs = six_short_migrations()
    v = vmi_from_object(objs[0])
    known = known_migrations(v, [migration_from_object(o) for o in objs[1:]])
    assert {e.uid for e in known} == {"m0", "m1", "m2", "m3", "m4"}  # m5 is only in the annotation
    assert orjson.loads(encode_history(known))  # and writable


def test_the_bound_follows_the_vms_own_cooldown() -> None:
    from app.domain.records import COOLDOWN_OVERRIDE
    from app.policy.cooldown import vm_settings

    quick = vmi_from_object(vmi("db", "a", annotations={COOLDOWN_OVERRIDE: "1m"}))
    assert history_bound(vm_settings(quick, DEFAULTS)) == 10  # 1m x 2^9 >= 6h > 1m x 2^8
    # ten entries kept for it, where the global settings keep six
    existing = tuple(entry(f"u{i}", 100 - 5 * i, 99 - 5 * i) for i in range(10))
    merged, adds = merge(existing, [entry("new", 3, 2)], NOW, vm_settings(quick, DEFAULTS))
    assert adds and len(merged) == 10 and merged[-1].uid == "new"
    assert len(merge(existing, [entry("new", 3, 2)], NOW, DEFAULTS)[0]) == 6
