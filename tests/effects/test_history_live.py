"""The history annotation end to end: real ``serve`` processes, the fake API server, KubeVirt's VMIM GC.

The issue's case: six 10-minute migrations of one VM within 48 h. The
reference plugin counts 6 (8 h, capped at 6 h); KubeVirt keeps only the 5 most
recent finished VMIMs, so a guard reading only those counts 5 (4 h).

The test plays KubeVirt: for each migration it creates a VMIM, writes the
VMI's ``migrationState`` (through the status, as KubeVirt does, so other
annotations stay), finishes both, moves the launcher pod, and garbage-collects
finished VMIMs down to 5. A guard watches throughout and records the history
on the VMI. Then the guard is restarted and a second replica started: both
must answer the 6 h cap (count 6), from the annotation and the 5 VMIMs left.
Then a seventh migration with both replicas running: one write between them.

Checked on the way: every VMI patch tests ``/metadata/resourceVersion``; one
successful write per migration; no writes while nothing happens (no loop).
"""

from __future__ import annotations

import json
import time

import pytest

from app import cli
from app.domain.history import HISTORY_ANNOTATION
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o
from tests.live_support import eventually, evict, scrape, start_guard

pytestmark = pytest.mark.timeout(120)
NS, VM, POD = "vms", "db", "virt-launcher-db"
NODES = ("node-a", "node-b")
EXPECTED = "cooldown 6h0m0s (6 migrations in the last 48h0m0s)"


class KubeVirt:
    """What KubeVirt writes for one VM's migrations, at times relative to ``t0`` (now)."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.t0 = time.time()
        self.node = NODES[0]
        api.put(o.vmi(NS, VM, node=self.node, uid="uid-db", created=self.t0 - 7 * 86400))
        api.put(o.launcher_pod(NS, VM, self.node, name=POD, vmi_uid="uid-db"))

    def migrate(self, i: int, start: float, end: float) -> None:
        """Migration ``mig-i``: 10 minutes long, ``start``/``end`` in seconds before t0."""
        src, dst = self.node, NODES[1] if self.node == NODES[0] else NODES[0]
        uid, name = f"uid-mig-{i}", f"mig-{i}"
        start_t, end_t = self.t0 - start, self.t0 - end
        self.api.put(o.vmim(NS, name, VM, phase="Running", start=start_t, source_node=src, target_node=dst, uid=uid,
                            created=start_t - 5))
        vmi = self.api.get("vmi", NS, VM)
        running = o.migration_state(start=start_t, source_node=src, target_node=dst, uid=uid)
        self.api.update_status("vmi", NS, VM, {**vmi["status"], "migrationState": running})
        self.api.put(o.vmim(NS, name, VM, phase="Succeeded", start=start_t, end=end_t, source_node=src,
                            target_node=dst, uid=uid, created=start_t - 5))
        done = o.migration_state(start=start_t, end=end_t, source_node=src, target_node=dst, uid=uid)
        vmi = self.api.get("vmi", NS, VM)
        self.api.update_status("vmi", NS, VM, {**vmi["status"], "nodeName": dst, "migrationState": done})
        self.api.put(o.launcher_pod(NS, VM, dst, name=POD, vmi_uid="uid-db"))
        self.node = dst
        self.api.gc_finished_migrations(NS, VM)  # KubeVirt keeps the 5 most recent


def history_uids(api: FakeApiServer) -> list[str]:
    raw = (api.get("vmi", NS, VM)["metadata"].get("annotations") or {}).get(HISTORY_ANNOTATION)
    return [e["uid"] for e in json.loads(raw)] if raw else []


def vmi_patches(api: FakeApiServer) -> list:
    return [p for p in api.patches if p.resource == "virtualmachineinstances.kubevirt.io"]


def history_jobs(guard) -> float:
    """History jobs the replica has finished, whatever their outcome (the side-effect queue's job counter)."""
    with guard.client() as http:
        return sum(v for (name, labels), v in scrape(http).items()
                   if name == "kubevirt_eviction_guard_side_effects_total" and ("kind", "history") in labels)


def reconciles(guard) -> float:
    """The replica's finished history reconcile passes (each (re)list is followed by one)."""
    with guard.client() as http:
        return scrape(http).get(("kubevirt_eviction_guard_background_passes_total",
                                 frozenset({("loop", "history_reconcile")})), 0.0)


def cooldown_answer(guard) -> dict:
    with guard.client() as http:
        return evict(http, POD, uid=f"probe-{time.monotonic_ns()}")


def test_history_survives_vmim_gc_restart_and_a_second_replica(tmp_path, capsys):
    with FakeApiServer(bookmark_interval=0.5) as api:
        for n in NODES:
            api.put(o.node(n))
        kv = KubeVirt(api)
        guard = start_guard(tmp_path / "a", api)
        second = None
        try:
            # six 10-minute migrations, one an hour, the last ending a minute ago
            for i in range(6):
                start = (6 - i) * 3600 - 3600 + 660
                kv.migrate(i, start=start, end=start - 600)
                eventually(lambda: f"uid-mig-{i}" in history_uids(api), timeout=10, what=f"mig-{i} recorded")
            assert history_uids(api) == [f"uid-mig-{i}" for i in range(6)]
            assert [m["metadata"]["name"] for m in api.objects("vmim")] == [f"mig-{i}" for i in range(1, 6)]
            writes = [p for p in vmi_patches(api) if p.status == 200]
            assert len(writes) == 6  # one write per migration

            # restart: the count comes from the cluster (annotation + 5 VMIMs), not from memory
            guard.stop()
            guard = start_guard(tmp_path / "a2", api)
            first = cooldown_answer(guard)
            assert (first["allowed"], first["auditAnnotations"]["reason"]) == (False, "cooldown")
            assert EXPECTED in first["status"]["message"], first["status"]["message"]

            second = start_guard(tmp_path / "b", api)
            first, other = cooldown_answer(guard), cooldown_answer(second)  # asked together: same clock
            assert EXPECTED in other["status"]["message"], other["status"]["message"]
            assert other["auditAnnotations"]["reason"] == "cooldown"
            assert abs(int(other["auditAnnotations"]["remaining-seconds"])
                       - int(first["auditAnnotations"]["remaining-seconds"])) <= 1

            code = cli.main(["--log-level", "warning", "explain", "--kubeconfig", str(tmp_path / "b" / "kubeconfig"),
                             "-n", NS, "--pod", POD])
            out = capsys.readouterr().out
            assert code == 1 and "reason: cooldown" in out and "x2^(6-1) for 6 in 48h0m0s" in out, out

            # nothing happening: nothing written (two fresh replicas, each reconciled after its list)
            quiet_from = len(vmi_patches(api))
            eventually(lambda: reconciles(guard) >= 1 and reconciles(second) >= 1, timeout=15,
                       what="each replica's reconcile after its list")
            assert len(vmi_patches(api)) == quiet_from == 6

            # a seventh migration with both replicas running: both react, one write lands
            jobs = (history_jobs(guard), history_jobs(second))
            kv.migrate(6, start=40, end=30)
            eventually(lambda: "uid-mig-6" in history_uids(api), timeout=10, what="mig-6 recorded")
            eventually(lambda: history_jobs(guard) > jobs[0] and history_jobs(second) > jobs[1], timeout=10,
                       what="both replicas' jobs for mig-6 to finish")
            seventh = vmi_patches(api)[quiet_from:]
            assert [p.status for p in seventh].count(200) == 1, [p.status for p in seventh]
            assert all(p.status in (200, 422) for p in seventh) and len(seventh) <= 2
            assert history_uids(api) == [f"uid-mig-{i}" for i in range(1, 7)]  # the 6 newest: the bound
            for g in (guard, second):
                answer = cooldown_answer(g)
                assert EXPECTED in answer["status"]["message"], answer["status"]["message"]
        finally:
            guard.stop()
            if second is not None:
                second.stop()

    for p in vmi_patches(api):
        assert p.content_type == "application/json-patch+json"
        assert p.body[0]["op"] == "test" and p.body[0]["path"] == "/metadata/resourceVersion"
        assert len(p.body) == 2 and p.body[1]["op"] == "add"


def test_off_switch_writes_nothing(tmp_path):
    with FakeApiServer(bookmark_interval=0.5) as api:
        for n in NODES:
            api.put(o.node(n))
        kv = KubeVirt(api)
        guard = start_guard(tmp_path, api, "--no-history-annotation")
        try:
            kv.migrate(0, start=700, end=100)
            with guard.client() as http:  # the guard has seen the migration: it is in cooldown
                eventually(lambda: evict(http, POD)["auditAnnotations"]["reason"] == "cooldown", timeout=10,
                           what="the migration to reach the guard")
            # the denial's Event is queued behind anything the migration's watch event queued (one worker, in
            # order): once it is written, a history job would have run too
            eventually(lambda: [e for e in api.events() if e.get("reason") == "EvictionBlocked"], timeout=10,
                       what="the denial's Event")
            with guard.client() as http:
                assert ("kubevirt_eviction_guard_background_passes_total",
                        frozenset({("loop", "history_reconcile")})) not in scrape(http)  # no recorder at all
        finally:
            guard.stop()
        assert vmi_patches(api) == [] and history_uids(api) == []
