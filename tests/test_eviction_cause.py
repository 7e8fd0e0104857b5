"""Who caused each evacuation, kept where it outlives KubeVirt's own bookkeeping: the guard's
``kubevirt-eviction-guard.io/cause`` on the evacuation VMIM (``app.effects.cause``), read by ``cause_of``, the
node cooldowns, rule 5a's episode and the history annotation.

On KubeVirt 1.7/1.8 defaults the VMIM has no priority, and virt-handler removes ``kubevirt.io/eviction-source``
from the VMI in the update that completes the migration; these tests walk that sequence.
"""

from __future__ import annotations

import copy

import pytest

from app.domain.records import migration_from_object, vmi_from_object
from app.effects.cause import APPLIED, NO_EVIDENCE, NOT_NEEDED, CauseJob, CauseRecorder, cause_patch
from app.effects.history import known_migrations, merge
from app.policy import PolicySettings
from app.policy.cause import cause_of, needs_recorded_cause, recorded_evacuation_cause
from app.policy.decide import evacuation_episode, is_descheduler_caused
from app.policy.nodecool import descheduler_caused
from tests.builders import NOW, NS, mstate, node, store_of, vmi, vmim
from tests.test_history import VmiApi

SRC = {"kubevirt.io/eviction-source": "descheduler"}
CAUSE = "kubevirt-eviction-guard.io/cause"


def evacuation(phase: str = "Running", cause: str = "", priority: str | None = None, name: str = "ev") -> dict:
    m = vmim(name, "db", phase, 100, evacuation="worker-a", priority=priority,
             state=mstate(name, "worker-a", "worker-b", 90, 80 if phase in ("Succeeded", "Failed") else None))
    if cause:
        m["metadata"].setdefault("annotations", {})[CAUSE] = cause
    return m


class CauseApi(VmiApi):
    """VMIs to read, and the VMIM patches the job sends."""

    def __init__(self, *objs: dict) -> None:
        super().__init__(*objs)
        self.vmim_patches: list[tuple[str, list]] = []

    def patch_vmim(self, namespace, name, patch):
        self.vmim_patches.append((name, copy.deepcopy(patch)))


@pytest.mark.parametrize(("row", "the_vmi", "the_node", "expected"), [
    ("the descheduler's mark, live", vmi("db", "worker-a", evacuation="worker-a", annotations=SRC), None,
     "descheduler"),
    ("a drain's or another client's mark (no eviction source)", vmi("db", "worker-a", evacuation="worker-a"), None,
     "evacuation"),
    ("the node is being drained: a leftover source does not count", vmi("db", "worker-a", evacuation="worker-a",
                                                                        annotations=SRC),
     node("worker-a", cordoned=True), "evacuation"),
    ("the mark is gone (migrated, or cancelled): no evidence", vmi("db", "worker-b"), None, None),
    ("marked from another node than this VMIM empties", vmi("db", "worker-c", evacuation="worker-c",
                                                           annotations=SRC), None, None),
])
def test_the_cause_is_read_from_the_vmi_only_while_it_is_marked_from_the_vmims_node(row, the_vmi, the_node, expected):
    m = migration_from_object(evacuation())
    n = store_of(the_node).node("worker-a") if the_node else None
    assert recorded_evacuation_cause(m, vmi_from_object(the_vmi), n) == expected, row


def test_only_running_evacuations_without_priority_or_record_need_one():
    assert needs_recorded_cause(migration_from_object(evacuation()))
    assert not needs_recorded_cause(migration_from_object(evacuation(cause="descheduler")))
    assert not needs_recorded_cause(migration_from_object(evacuation(priority="system-maintenance")))
    assert not needs_recorded_cause(migration_from_object(evacuation("Succeeded")))
    assert not needs_recorded_cause(migration_from_object(vmim("user", "db", "Running", 100)))  # virtctl migrate


def test_job_writes_the_descheduler_cause_on_the_vmim_while_it_runs():
    marked = vmi("db", "worker-a", evacuation="worker-a", annotations=SRC)
    api = CauseApi(marked)
    job = CauseJob(store_of(marked, evacuation()), api, NS, "ev", "db")
    assert job.run() == APPLIED
    assert api.vmim_patches == [("ev", cause_patch("descheduler"))]
    assert cause_patch("descheduler") == [{"op": "add", "path": "/metadata/annotations/kubevirt-eviction-guard.io~1cause",
                                           "value": "descheduler"}]


def test_job_reads_the_vmi_from_the_api_server_not_the_store():
    """The store has not seen the mark's eviction source yet; the API server has."""
    stale_copy = vmi("db", "worker-a", evacuation="worker-a")
    api = CauseApi(vmi("db", "worker-a", evacuation="worker-a", annotations=SRC))
    assert CauseJob(store_of(stale_copy, evacuation()), api, NS, "ev", "db").run() == APPLIED
    assert api.vmim_patches == [("ev", cause_patch("descheduler"))]


def test_job_writes_nothing_when_the_migration_already_completed():
    """virt-handler removed the mark and the source together: a drain's and the descheduler's look alike now."""
    api = CauseApi(vmi("db", "worker-b"))
    assert CauseJob(store_of(vmi("db", "worker-a", evacuation="worker-a"), evacuation()), api, NS, "ev",
                    "db").run() == NO_EVIDENCE
    assert api.vmim_patches == []


def test_job_does_nothing_for_a_recorded_or_finished_vmim():
    api = CauseApi(vmi("db", "worker-a", evacuation="worker-a", annotations=SRC))
    assert CauseJob(store_of(evacuation(cause="evacuation")), api, NS, "ev", "db").run() == NOT_NEEDED
    assert CauseJob(store_of(evacuation("Failed")), api, NS, "ev", "db").run() == NOT_NEEDED
    assert api.gets == [] and api.vmim_patches == []


class _Queue:
    def __init__(self):
        self.jobs = []

    def submit(self, job, delay=0.0):
        self.jobs.append(job)
        return True


def test_recorder_queues_new_evacuations_and_unrecorded_ones_after_a_relist():
    store = store_of(vmi("db", "worker-a", evacuation="worker-a"), evacuation(),
                     vmi("web", "worker-b"), vmim("mine", "web", "Running", 100))
    queue = _Queue()
    rec = CauseRecorder(store, CauseApi(), queue)
    rec.on_change("vmim", None, store.migrations(NS, "db")[0])
    rec.on_change("vmim", None, store.migrations(NS, "web")[0])  # a user's VMIM: nothing to record
    rec.on_change("vmim", None, None)  # a relist
    assert [j.key for j in queue.jobs] == [("cause", NS, "ev")] * 2


def test_after_the_move_the_recorded_cause_is_what_tells_descheduler_from_drain():
    """The VMI as virt-handler leaves it after success: no mark, no eviction source."""
    after = vmi("db", "worker-b", migration=mstate("ev", "worker-a", "worker-b", 90, 80))
    for recorded, expected in (("descheduler", True), ("evacuation", False), ("", False)):
        store = store_of(after, evacuation("Succeeded", cause=recorded))
        m = store.migrations(NS, "db")[0]
        assert descheduler_caused(m, store) is expected, recorded
        assert cause_of(m) == (recorded or "evacuation")
    # a priority is KubeVirt's own word, over the record
    store = store_of(after, evacuation("Succeeded", cause="descheduler", priority="system-critical"))
    assert not descheduler_caused(store.migrations(NS, "db")[0], store)


def test_a_drain_recorded_in_the_episode_is_never_the_descheduler_s():
    """A leftover eviction source (a cancelled descheduler evacuation) beside a VMIM recorded as a drain's: the
    episode is not the descheduler's, so rule 5a and the canceller leave it alone."""
    v = vmi_from_object(vmi("db", "worker-a", evacuation="worker-a", annotations=SRC))
    for recorded, expected in (("evacuation", False), ("descheduler", True), ("", True)):
        ms = [migration_from_object(evacuation("Failed", cause=recorded))]
        assert is_descheduler_caused(v, evacuation_episode(v, ms, "worker-a")) is expected, recorded


def test_the_history_annotation_keeps_the_cause_once_the_vmim_is_gone():
    v = vmi_from_object(vmi("db", "worker-b", migration=mstate("ev", "worker-a", "worker-b", 90, 80)))
    ms = [migration_from_object(evacuation("Succeeded", cause="descheduler"))]
    entries, adds = merge((), known_migrations(v, ms), NOW, PolicySettings())
    assert adds and [(e.uid, e.cause) for e in entries] == [("ev", "descheduler")]
    # later, the VMIM gone: the VMI's migrationState alone knows no cause; the annotation's stays
    again, adds = merge(entries, known_migrations(v, []), NOW, PolicySettings())
    assert not adds and [e.cause for e in again] == ["descheduler"]
    # an entry written without a cause gets it from the VMIM (one write)
    bare = [type(entries[0])(e.uid, e.start, e.end, e.outcome) for e in entries]
    fixed, adds = merge(bare, known_migrations(v, ms), NOW, PolicySettings())
    assert adds and [e.cause for e in fixed] == ["descheduler"]
