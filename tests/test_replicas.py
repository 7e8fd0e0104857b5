"""Two replicas agree: two guard processes watching one fake API server decide every eviction the same way.

The reference plugin keeps its history in memory, so two descheduler replicas
(or one, before and after a restart) can disagree about a VM's cooldown. The
guard derives every decision from cluster objects; this test holds it to that.

A scripted sequence drives the fake API through what a cluster does: a
migration completing, the descheduler's eviction of a VM answered by one
replica only and KubeVirt creating its VMIM, a node drain (cordon and
evacuation mark), a migration failing, KubeVirt garbage-collecting an old VMIM,
a VM stopping, an evacuation migration starting, the drain ending. Replica B is
restarted in the middle (after evictions that only it answered), so from then
on its cooldowns come from the VMIMs it lists at start-up, not from memory.

After each step the test waits until both replicas have seen it, with a
barrier that is independent of the decisions under comparison: sentinel
objects created *after* the step's changes, in every kind (a VMI in cooldown
and its launcher pod on a new cordoned node, allowed only once all three are
seen; a pending VMIM of another sentinel VMI, named in its denial), with names
of their own at every step. Each kind's watch delivers in order, so a replica
whose sentinels of step N decide as expected has applied every change of
the step before them. Then the same 18 reviews (9 pods, descheduler and
drain) go to both replicas at once, and their answers are compared.

Both replicas use the real clock (no ``--now``), so messages that count time
("finished 5m3s ago", "started 30s ago", "retry in 9m57s") can differ by a
second when the two reads of the clock straddle a second boundary. Rather than
retrying on boundaries, the comparison is exact on everything else (allowed,
HTTP status and reason in the denial, the reason label, the whole message with
those relative times blanked, warnings likewise) and the blanked times, and
the ``remaining-seconds`` audit annotation, must be within 1 s of each other.
Durations that come from history ("cooldown 1h0m0s (3 migrations in the last
48h0m0s)") are compared exactly: that is what a restarted replica must rebuild.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.domain.history import HISTORY_ANNOTATION
from app.timefmt import parse_duration
from app.transport.tls import issue_certs, write_certs
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o
from tests.guard_process import ROOT, GuardProcess
from tests.live_support import JSON, body, eventually, start_guard, wait_ready

pytestmark = pytest.mark.timeout(120)

NS, SYNC = "vms", "sync"
PODS = ["a", "b", "c", "c-target", "d", "e", "f", "g", "ghost"]
FIGURES_FILE = ROOT / "build" / "reliability" / "replicas.json"
RELATIVE = re.compile(r"(?<=finished )\w+(?= ago)|(?<=started )\w+(?= ago)|(?<=retry in )\w+")


def pod_name(vm: str) -> str:
    return f"virt-launcher-{vm}"


class Cluster:
    """The scripted cluster: what KubeVirt, the nodes and the descheduler's effects write to the API."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.t0 = time.time()

    def ago(self, seconds: float) -> float:
        return self.t0 - seconds

    def vmi(self, name: str, node: str, **kw) -> None:
        self.api.put(o.vmi(NS, name, node=node, uid=f"uid-{name}", created=self.ago(7 * 86400), **kw))

    def pod(self, vm: str, node: str, name: str = "", **kw) -> None:
        self.api.put(o.launcher_pod(NS, vm, node, name=name or pod_name(vm), vmi_uid=f"uid-{vm}", **kw))

    def vmim(self, name: str, vm: str, phase: str, created: float, **kw) -> None:
        self.api.put(o.vmim(NS, name, vm, phase=phase, uid=f"uid-{name}", created=created, **kw))

    def seed(self) -> None:
        """a quiet; b migrated 5 min ago; c migrating n2 -> n4 (its target pod on n4); d beside c on n2;
        e marked for evacuation from n3, f beside it; g with three migrations in the window (history that
        only the VMIMs keep: its VMI shows the last one)."""
        for n in ("n1", "n2", "n3", "n4", "sync-m"):
            self.api.put(o.node(n))
        self.vmi("a", "n1")
        self.pod("a", "n1")
        self.vmi("b", "n1", migration=o.migration_state(self.ago(400), self.ago(300), "n2", "n1", "uid-b-m1"))
        self.vmim("b-m1", "b", "Succeeded", self.ago(410), start=self.ago(400), end=self.ago(300),
                  source_node="n2", target_node="n1")
        self.pod("b", "n1")
        self.vmi("c", "n2", migration=o.migration_state(self.ago(30), None, "n2", "n4", "uid-c-m1"))
        self.vmim("c-m1", "c", "Running", self.ago(40), start=self.ago(30), source_node="n2", target_node="n4")
        self.pod("c", "n2")
        self.pod("c", "n4", name=pod_name("c-target"), migration_job_uid="uid-c-m1")
        for vm, node in (("d", "n2"), ("f", "n3")):
            self.vmi(vm, node)
            self.pod(vm, node)
        self.vmi("e", "n3", evacuation_node="n3")
        self.pod("e", "n3")
        for i, (start, end) in enumerate(((14400, 14280), (7200, 7080), (2520, 2400)), 1):
            self.vmim(f"g-m{i}", "g", "Succeeded", self.ago(start + 10), start=self.ago(start), end=self.ago(end),
                      source_node="n1", target_node="n4")
        self.vmi("g", "n4", migration=o.migration_state(self.ago(2520), self.ago(2400), "n1", "n4", "uid-g-m3"))
        self.pod("g", "n4")

    def barrier(self, step: int) -> None:
        """Sentinels of ``step``, replacing those of the step before (see the module docstring)."""
        if step > 0:
            prev = step - 1
            for kind, name in (("vmim", f"syncm-mig-{prev}"), ("pod", f"virt-launcher-sync-{prev}"),
                               ("pod", f"virt-launcher-syncm-{prev}"), ("vmi", f"sync-{prev}"),
                               ("vmi", f"syncm-{prev}")):
                self.api.delete(kind, SYNC, name)
            self.api.delete("node", "", f"sync-node-{prev}")
        now = time.time()
        self.api.put(o.node(f"sync-node-{step}", unschedulable=True))
        just_migrated = o.migration_state(now - 90, now - 60, "sync-m", f"sync-node-{step}", f"uid-sync-{step}")
        for vm, node, migration in ((f"sync-{step}", f"sync-node-{step}", just_migrated),
                                    (f"syncm-{step}", "sync-m", None)):
            self.api.put(o.vmi(SYNC, vm, node=node, uid=f"uid-{vm}", created=self.ago(86400), migration=migration))
            self.api.put(o.launcher_pod(SYNC, vm, node, name=f"virt-launcher-{vm}", vmi_uid=f"uid-{vm}"))
        self.api.put(o.vmim(SYNC, f"syncm-mig-{step}", f"syncm-{step}", phase="Pending", created=time.time()))


def step_changes(c: Cluster, step: int) -> None:
    """The cluster's side of each step (``step`` 0 is the seeded state)."""
    now = time.time()
    if step == 1:  # c's migration completes: the VM runs on n4, its old pod on n2 is done
        c.vmim("c-m1", "c", "Succeeded", c.ago(40), start=c.ago(30), end=now, source_node="n2", target_node="n4")
        c.vmi("c", "n4", migration=o.migration_state(c.ago(30), now, "n2", "n4", "uid-c-m1"))
        c.pod("c", "n2", phase="Succeeded")
    elif step == 2:  # d's eviction was allowed (by replica A alone): KubeVirt creates its migration
        c.vmim("d-m1", "d", "Pending", now)
    elif step == 3:  # a drain of n1 starts: cordon, and KubeVirt marks a for evacuation
        c.api.put(o.node("n1", unschedulable=True))
        c.vmi("a", "n1", evacuation_node="n1")
    elif step == 5:  # d's migration fails
        c.vmim("d-m1", "d", "Failed", now - 20, start=now - 20, end=now, source_node="n2", target_node="n1")
        c.vmi("d", "n2", migration=o.migration_state(now - 20, now, "n2", "n1", "uid-d-m1", failed=True))
    elif step == 6:  # KubeVirt garbage-collects g's oldest VMIM, which the guards have recorded on the VMI by
        # now (history annotation): still three in the window, cooldown 1h, 40m in
        eventually(lambda: "uid-g-m1" in (c.api.get("vmi", NS, "g")["metadata"].get("annotations") or {})
                   .get(HISTORY_ANNOTATION, ""), timeout=10, what="g's history recorded")
        c.api.delete("vmim", NS, "g-m1")
    elif step == 7:  # f's VM is stopped
        c.api.delete("vmi", NS, "f")
        c.api.delete("pod", NS, pod_name("f"))
    elif step == 8:  # e's evacuation migration starts
        c.vmim("e-m1", "e", "Running", now, start=now, source_node="n3", target_node="n2", evacuation_node="n3")
        c.vmi("e", "n3", evacuation_node="n3", migration=o.migration_state(now, None, "n3", "n2", "uid-e-m1"))
    elif step == 9:  # the drain of n1 is called off: uncordoned, a's mark cleared
        c.api.put(o.node("n1"))
        c.vmi("a", "n1")


# What the descheduler is told about each VM after each step (only what the step changes; the full batch is
# compared between the replicas regardless). It keeps the script honest: each step does what it says.
EXPECTED = {
    0: {"a": "allowed", "b": "cooldown", "c": "migration_in_progress", "c-target": "migration_target",
        "d": "node_busy", "e": "evacuation_pending", "f": "node_busy", "g": "cooldown", "ghost": "not_a_vm_pod"},
    1: {"c": "not_a_vm_pod", "c-target": "cooldown", "d": "allowed"},
    2: {"d": "migration_in_progress"},
    3: {"a": "evacuation_pending", "b": "allowed"},
    5: {"d": "cooldown"},
    6: {"g": "cooldown"},
    7: {"f": "not_a_vm_pod", "e": "evacuation_pending"},
    8: {"e": "migration_in_progress"},
    9: {"a": "allowed", "b": "cooldown"},
}
STEPS = 10
RESTART_BEFORE = 4  # replica B is restarted just before step 4


# ---- talking to the replicas ------------------------------------------------------------------


def batch() -> list[tuple[str, str, bytes]]:
    """(pod, requester, body): every pod, asked by the descheduler and by a drain."""
    out = []
    for vm in PODS:
        out.append((vm, "descheduler", body(pod_name(vm), uid=f"d-{vm}")))
        out.append((vm, "drain", body(pod_name(vm), uid=f"k-{vm}", requested_by="", reason="",
                                      username="system:serviceaccount:kube-system:drain")))
    return out


def ask(guard: GuardProcess, requests: list[tuple[str, str, bytes]]) -> list[dict]:
    with guard.client() as http:
        out = []
        for _, _, b in requests:
            r = http.post("/validate", content=b, headers=JSON)
            assert r.status_code == 200, r.text
            out.append(r.json()["response"])
        return out


def sentinels_seen(guard: GuardProcess, step: int) -> bool:
    with guard.client() as http:
        def decision(pod: str) -> dict:
            r = http.post("/validate", content=body(pod, SYNC, uid=f"sync-{step}"), headers=JSON)
            return r.json()["response"]

        # in cooldown, but on a cordoned node: allowed once pod, VMI and node are all seen (else not_a_vm_pod,
        # vmi_not_found, or cooldown while the node is unknown)
        drained = decision(f"virt-launcher-sync-{step}")
        pending = decision(f"virt-launcher-syncm-{step}")
    return (drained["auditAnnotations"]["reason"] == "allowed" and
            f"migration {SYNC}/syncm-mig-{step} is Pending" in pending.get("status", {}).get("message", ""))


def wait_both_seen(guards: list[GuardProcess], step: int) -> float:
    began = time.monotonic()
    for g in guards:
        eventually(lambda: sentinels_seen(g, step), timeout=15, what=f"{g.url} to see step {step}", every=0.02)
    return time.monotonic() - began


def comparable(response: dict) -> tuple[dict, list[float]]:
    """The response with relative times blanked, and those times (seconds) in order."""
    times: list[float] = []

    def blank(text: str) -> str:
        times.extend(parse_duration(m) for m in RELATIVE.findall(text))
        return RELATIVE.sub("<t>", text)

    status = response.get("status") or {}
    audit = dict(response["auditAnnotations"])
    remaining = audit.pop("remaining-seconds", None)
    if remaining is not None:
        times.append(float(remaining))
    return {"allowed": response["allowed"], "code": status.get("code"), "status_reason": status.get("reason"),
            "message": blank(status.get("message", "")), "audit": audit,
            "warnings": [blank(w) for w in response.get("warnings", [])]}, times


def disagreements(requests, answers_a: list[dict], answers_b: list[dict]) -> list[str]:
    out = []
    for (vm, who, _), a, b in zip(requests, answers_a, answers_b):
        (ca, ta), (cb, tb) = comparable(a), comparable(b)
        if ca != cb or len(ta) != len(tb) or any(abs(x - y) > 1 for x, y in zip(ta, tb)):
            out.append(f"{vm} by {who}: A={a} B={b}")
    return out


# ---- the test ---------------------------------------------------------------------------------


def test_two_replicas_decide_alike_through_a_scripted_sequence_and_a_restart(tmp_path):
    certs = write_certs(issue_certs("kubevirt-eviction-guard", "test"), tmp_path / "certs")
    requests = batch()
    figures = {"steps": STEPS, "requests_compared": 0, "identical": 0, "one_replica_only_evictions": 0}
    with FakeApiServer(bookmark_interval=1.0) as api:
        cluster = Cluster(api)
        cluster.seed()
        cluster.barrier(0)
        a = start_guard(tmp_path / "a", api, certs=certs, wait=False)
        b = start_guard(tmp_path / "b", api, certs=certs, wait=False)
        guards = [a, b]
        try:
            wait_ready(a), wait_ready(b)
            barrier_waits = []
            for step in range(STEPS):
                if step == RESTART_BEFORE:
                    # evictions that only B answers, then B restarts: nothing it answered may matter afterwards
                    figures["one_replica_only_evictions"] += len(ask(b, requests))
                    began = time.monotonic()
                    b.stop()
                    b = start_guard(tmp_path / "b2", api, certs=certs)
                    guards = [a, b]
                    figures["restart_to_ready_s"] = round(time.monotonic() - began, 2)
                if step == 2:  # the descheduler's eviction of d reaches replica A only; A allows it
                    [d_answer] = ask(a, [r for r in requests if r[0] == "d" and r[1] == "descheduler"])
                    assert d_answer["allowed"] is True
                    figures["one_replica_only_evictions"] += 1
                step_changes(cluster, step)
                cluster.barrier(step)
                barrier_waits.append(wait_both_seen(guards, step))
                with ThreadPoolExecutor(2) as pool:
                    answers_a, answers_b = pool.map(lambda g: ask(g, requests), guards)
                differ = disagreements(requests, answers_a, answers_b)
                assert differ == [], f"step {step}: the replicas disagree:\n" + "\n".join(differ)
                figures["requests_compared"] += len(requests)
                figures["identical"] += len(requests) - len(differ)
                got = {vm: ans["auditAnnotations"]["reason"]
                       for (vm, who, _), ans in zip(requests, answers_a) if who == "descheduler"}
                want = EXPECTED.get(step, {})
                assert {vm: got[vm] for vm in want} == want, f"step {step}"
            figures["barrier_wait_s_max"] = round(max(barrier_waits), 2)
        finally:
            for g in guards:
                g.stop()
    figures["agreement_percent"] = round(100.0 * figures["identical"] / figures["requests_compared"], 1)
    FIGURES_FILE.parent.mkdir(parents=True, exist_ok=True)
    FIGURES_FILE.write_text(json.dumps(figures, indent=2) + "\n")
    print("\nReplicas, figures:\n" + json.dumps(figures, indent=2))
    assert figures["agreement_percent"] == 100.0
