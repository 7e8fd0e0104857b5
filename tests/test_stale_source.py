"""KubeVirt's ``kubevirt.io/eviction-source: descheduler`` after the evacuation it named ended without a migration.

virt-api writes it with the mark and never clears it; only a successful migration removes it. So after an
``evacuate/cancel`` a later evacuation the descheduler did not cause would look descheduler-caused (to rule 5a, the
canceller and the node cooldowns). The rows of ``policy.source.stale_eviction_source``, what the rules make of a
stale annotation, and the effect that removes it (``effects.source``).
"""

from __future__ import annotations

import copy

import pytest

from app.domain.records import vmi_from_object
from app.effects.queue import Retry
from app.effects.source import APPLIED, NOT_NEEDED, StaleSourceCleaner, StaleSourceJob, source_patch
from app.policy import PolicySettings
from app.policy.cancel import evacuations_to_cancel
from app.policy.nodecool import descheduler_caused
from app.policy.source import stale_eviction_source
from tests.builders import NOW, NS, failing_evacuation, mstate, node, pod, store_of, vmi, vmim
from tests.test_history import VmiApi

SRC = {"kubevirt.io/eviction-source": "descheduler"}
CANCELLED = failing_evacuation("db", "worker-a", 3, priority=None)  # KubeVirt 1.8 without its priority gate


def stale(*objects) -> bool:
    store = store_of(*objects)
    v = store.vmi(NS, "db") or next(iter(store.vmis()))
    return stale_eviction_source(v, store.migrations(v.namespace, v.name))


@pytest.mark.parametrize(("row", "objects", "expected"), [
    ("marked: the evacuation it names runs", [vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
                                              *CANCELLED], False),
    ("cancelled, every attempt finished", [vmi("db", "worker-a", annotations=SRC), *CANCELLED], True),
    ("cancelled, a retry still queued (it still runs)", [
        vmi("db", "worker-a", annotations=SRC), *failing_evacuation("db", "worker-a", 2, priority=None, running=True)],
     False),
    ("cancelled, the last attempt still copying", [
        vmi("db", "worker-a", annotations=SRC, migration=mstate("m", "worker-a", "worker-b", 1)), *CANCELLED], False),
    ("no annotation", [vmi("db", "worker-a"), *CANCELLED], False),
    ("another value", [vmi("db", "worker-a", annotations={"kubevirt.io/eviction-source": "someone"})], False),
    ("annotated, never migrated (nothing left of it)", [vmi("db", "worker-a", annotations=SRC)], True),
    ("an earlier incarnation's unfinished VMIM does not hold it", [
        vmi("db", "worker-a", annotations=SRC, created=5), vmim("old", "db", "Running", 30)], True),
])
def test_rows(row, objects, expected):
    assert stale(*objects) is expected, row


def _store_after_cancel_then_user_eviction():
    """The guard's canceller cancelled the descheduler's evacuation (3 failures); then a user evicted the VM:
    virt-api marked it again without touching the annotation."""
    return [node("worker-a"), node("worker-b"), pod("db", "worker-a"), *CANCELLED]


def test_the_stale_annotation_made_a_users_evacuation_cancellable_and_its_removal_does_not():
    """The bug: with the annotation left over, a user's evacuation from the same node inherits the cancelled
    one's failures and is cancelled at once. With it removed (what the cleaner does), it is not."""
    before = store_of(vmi("db", "worker-a", evacuation="worker-a", annotations=SRC),
                      *_store_after_cancel_then_user_eviction())
    assert [s.name for s in evacuations_to_cancel(before.vmis(), before, NOW, PolicySettings())] == ["db"]
    after = store_of(vmi("db", "worker-a", evacuation="worker-a"), *_store_after_cancel_then_user_eviction())
    assert evacuations_to_cancel(after.vmis(), after, NOW, PolicySettings()) == []


def test_a_node_cooldown_never_counts_a_move_on_a_stale_annotation():
    done = vmim("moved", "db", "Succeeded", 20, mstate("moved", "worker-b", "worker-a", 19, 18))
    live = store_of(vmi("db", "worker-a", evacuation="worker-a", annotations=SRC), done)
    assert descheduler_caused(live.migrations(NS, "db")[0], live)
    left = store_of(vmi("db", "worker-a", annotations=SRC), done)
    assert not descheduler_caused(left.migrations(NS, "db")[0], left)


# ---- the effect ---------------------------------------------------------------------------------------------


def _cancelled_vmi(rv: str = "7") -> dict:
    v = vmi("db", "worker-a", annotations={**SRC, "kubevirt.io/latest-observed-api-version": "v1"})
    v["metadata"]["resourceVersion"] = rv
    return v


def test_job_removes_a_stale_annotation_guarded_by_resource_version_and_value():
    v = _cancelled_vmi()
    api = VmiApi(v)
    job = StaleSourceJob(store_of(v, *CANCELLED), api, NS, "db")
    assert job.run() == APPLIED
    assert api.patches == [source_patch("7")]
    assert api.objs["db"]["metadata"]["annotations"] == {"kubevirt.io/latest-observed-api-version": "v1"}


def test_job_leaves_it_when_the_api_server_shows_the_vm_marked_again():
    """The store says stale, the API server has the descheduler's new mark: the annotation is live again."""
    v = _cancelled_vmi()
    marked = copy.deepcopy(v)
    marked["status"]["evacuationNodeName"] = "worker-a"
    api = VmiApi(marked)
    assert StaleSourceJob(store_of(v, *CANCELLED), api, NS, "db").run() == NOT_NEEDED
    assert api.patches == []


def test_job_retries_when_the_vmi_changed_between_read_and_patch():
    v = _cancelled_vmi()
    api = VmiApi(v)
    api.conflicts = 1
    job = StaleSourceJob(store_of(v, *CANCELLED), api, NS, "db")
    with pytest.raises(Retry):
        job.run()
    assert job.run() == APPLIED and len(api.patches) == 2


def test_job_does_nothing_for_a_live_annotation():
    v = vmi("db", "worker-a", evacuation="worker-a", annotations=SRC)
    api = VmiApi(v)
    assert StaleSourceJob(store_of(v, *CANCELLED), api, NS, "db").run() == NOT_NEEDED
    assert api.gets == []


class _Queue:
    def __init__(self):
        self.jobs = []

    def submit(self, job, delay=0.0):
        self.jobs.append(job)
        return True


def test_cleaner_queues_on_the_cancel_and_on_a_relist_only_for_stale_ones():
    store = store_of(_cancelled_vmi(), *CANCELLED, vmi("quiet", "worker-b"))
    queue = _Queue()
    cleaner = StaleSourceCleaner(store, VmiApi(), queue)
    marked = vmi_from_object(vmi("db", "worker-a", evacuation="worker-a", annotations=SRC))
    cleaner.on_change("vmi", marked, store.vmi(NS, "db"))  # the cancel: the mark went
    cleaner.on_change("vmi", None, store.vmi(NS, "quiet"))
    cleaner.on_change("vmi", None, None)  # a relist
    assert [j.key for j in queue.jobs] == [("eviction_source", NS, "db")] * 2
