"""Forged AdmissionReviews against the real ``serve`` process: no write the cluster state does not justify.

Anyone who can reach the webhook's port can POST an AdmissionReview (unless
``--client-ca`` is set), naming any pod in any namespace, with any operation,
and an Eviction body that says something else. The guard trusts none of it
beyond the pod's namespace/name: every decision, and every write a decision
causes, comes from the watched cluster state. In-process tests cover the
pieces (``test_effects_units``: ``why_not``; ``test_effects_api``: a forged
*decision*, a ghost pod, a mark cleared before the job runs). This test runs
the whole path: HTTPS in, ``serve --kubeconfig`` wiring, watches, the effects
queue, writes out to the fake API server, with these reviews:

- the evacuating VM's pod name in another namespace, where a quiet VM's pod
  has the same name;
- a pod that does not exist;
- the pod of a VM that is migrating but not marked for evacuation;
- the migration target pod of the VM that is marked (on another node);
- the VM's old, completed launcher pod on the marked node;
- a quiet pod in ``request.name`` with the evacuating pod in the Eviction body;
- not an eviction (DELETE of the pod; CREATE of another subresource) of the
  evacuating pod;
- dry-run evictions of the evacuating pod (``request.dryRun`` and the
  Eviction's ``deleteOptions.dryRun``);
- a descheduler eviction of a quiet VM whose user name holds a newline, a
  forged JSON log line and ANSI escapes, and whose reason is 100 KiB.

Then a genuine eviction of another marked VM's pod (the control: the effects
worker runs jobs in order, so once its patch lands, everything the forged
reviews caused has run, and it shows the pipeline could write all along). At
that point the control's must be the only patch, and the Events exactly those
of the denials the state justifies (the migrating VM, the target pod, the
control), and no EvictionAllowed for the allowed ones: no migration followed
them. The log holds no control character and no line over 16 KiB. Last,
the genuine eviction of the evacuating pod is patched.
"""

from __future__ import annotations

import re
import time

import orjson
import pytest

from tests.effects.support import EIP, review_doc
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o
from tests.live_support import JSON, eventually, start_guard

pytestmark = pytest.mark.timeout(60)
NS, OTHER = "vms", "other"
EVAC, TARGET, OLD = "virt-launcher-evac", "virt-launcher-evac-target", "virt-launcher-evac-old"
MIGR, QUIET, GHOST = "virt-launcher-migr", "virt-launcher-quiet", "virt-launcher-ghost"
CONTROL = "virt-launcher-ctl"
FORGED_USER = 'mallory\n{"level":"info","msg":"EvictionAllowed"}\x1b[2J\x1b[31m'


def seed(api: FakeApiServer) -> None:
    now = time.time()
    for n in ("node-a", "node-b", "node-c"):
        api.put(o.node(n))
    # evac: marked for evacuation from node-a, its target pod already on node-b, an old pod done on node-a
    api.put(o.vmi(NS, "evac", node="node-a", uid="uid-evac", evacuation_node="node-a", created=now - 86400))
    api.put(o.launcher_pod(NS, "evac", "node-a", name=EVAC, vmi_uid="uid-evac"))
    api.put(o.launcher_pod(NS, "evac", "node-b", name=TARGET, vmi_uid="uid-evac", migration_job_uid="uid-m-evac"))
    api.put(o.launcher_pod(NS, "evac", "node-a", name=OLD, vmi_uid="uid-evac", phase="Succeeded"))
    # migr: migrating node-a -> node-c, not marked
    api.put(o.vmi(NS, "migr", node="node-a", uid="uid-migr", created=now - 86400,
                  migration=o.migration_state(start=now - 60, source_node="node-a", target_node="node-c",
                                              uid="uid-m-migr")))
    api.put(o.launcher_pod(NS, "migr", "node-a", name=MIGR, vmi_uid="uid-migr"))
    api.put(o.vmi(NS, "quiet", node="node-c", uid="uid-quiet", created=now - 86400))
    api.put(o.launcher_pod(NS, "quiet", "node-c", name=QUIET, vmi_uid="uid-quiet"))
    # a quiet twin of evac in another namespace: same VMI name, same pod name
    api.put(o.vmi(OTHER, "evac", node="node-c", uid="uid-other-evac", created=now - 86400))
    api.put(o.launcher_pod(OTHER, "evac", "node-c", name=EVAC, vmi_uid="uid-other-evac"))


def forged(pod: str, uid: str, namespace: str = NS, **changes) -> dict:
    doc = review_doc(pod, uid=uid, namespace=namespace)
    for path, value in changes.items():
        target = doc
        *parents, last = path.split("__")
        for p in parents:
            target = target[p]
        target[last] = value
    return doc


# (review, what the guard must answer: allowed, reason)
FORGED = [
    (forged(EVAC, "f-other-ns", namespace=OTHER), (True, "allowed")),
    (forged(GHOST, "f-ghost"), (True, "not_a_vm_pod")),
    (forged(MIGR, "f-not-marked"), (False, "migration_in_progress")),
    (forged(TARGET, "f-target"), (False, "migration_target")),
    (forged(OLD, "f-old-pod"), (True, "not_a_vm_pod")),
    (forged(QUIET, "f-body-names-evac", request__object__metadata__name=EVAC), (True, "allowed")),
    (forged(EVAC, "f-delete", request__operation="DELETE"), (True, "not_an_eviction")),
    (forged(EVAC, "f-status", request__subResource="status"), (True, "not_an_eviction")),
    (forged(EVAC, "f-dry-run", request__dryRun=True), (False, "evacuation_pending")),
    (review_doc(EVAC, uid="f-body-dry-run", body_dry_run=True), (False, "evacuation_pending")),
    # a user name that would forge a log line and repaint a terminal, and a 100 KiB reason
    (forged(QUIET, "f-control-chars", request__userInfo={"username": FORGED_USER},
            request__object__metadata__annotations={"requested-by": "sigs.k8s.io/descheduler", "reason": "r" * 102400}),
     (True, "allowed")),
]


def annotated(api: FakeApiServer, pod: str, namespace: str = NS) -> bool:
    return EIP in api.get("pod", namespace, pod)["metadata"]["annotations"]


def writes(api: FakeApiServer) -> tuple[list, list]:
    """(patches as (resource, namespace, name, status), Events as (namespace, VMI, decision reason)), sorted."""
    patches = [(p.resource, p.namespace, p.name, p.status) for p in api.patches]
    events = sorted((e["involvedObject"]["namespace"], e["involvedObject"]["name"],
                     m.group(1) if (m := re.search(r"denied \((\w+)\)", e["message"]))
                     else f'{e["reason"]}:{e["involvedObject"]["uid"]}') for e in api.events())
    return patches, events


def test_forged_reviews_cause_no_patch_and_only_justified_events(tmp_path):
    with FakeApiServer(bookmark_interval=1.0) as api:
        seed(api)
        api.put(o.vmi(NS, "ctl", node="node-b", uid="uid-ctl", evacuation_node="node-b", created=time.time() - 86400))
        api.put(o.launcher_pod(NS, "ctl", "node-b", name=CONTROL, vmi_uid="uid-ctl"))
        guard = start_guard(tmp_path, api, "--event-interval", "1m", "--max-body-bytes", "1048576")
        try:
            with guard.client() as http:
                def evict(doc: dict) -> dict:
                    r = http.post("/validate", content=orjson.dumps(doc), headers=JSON)
                    assert r.status_code == 200
                    return r.json()["response"]

                for doc, (allowed, reason) in FORGED:
                    resp = evict(doc)
                    got = (resp["allowed"], resp["auditAnnotations"]["reason"])
                    assert got == (allowed, reason), doc["request"]["uid"]
                # Control: a genuine eviction of another marked VM's pod. One worker runs the jobs in order, so
                # once its patch has landed, every job the forged reviews caused has run.
                assert evict(review_doc(CONTROL, uid="control"))["auditAnnotations"]["reason"] == "evacuation_pending"
                eventually(lambda: annotated(api, CONTROL), timeout=10, what="the control's annotation")
                after_forged = writes(api)
                # and the genuine eviction of the evacuating pod itself
                assert evict(review_doc(EVAC, uid="genuine"))["auditAnnotations"]["reason"] == "evacuation_pending"
                eventually(lambda: annotated(api, EVAC), timeout=10, what="the genuine annotation")
        finally:
            guard.stop()
        log = guard.log.read_bytes()
        final = writes(api)
        untouched = [annotated(api, name, ns) for ns, name in
                     ((OTHER, EVAC), (NS, TARGET), (NS, OLD), (NS, MIGR), (NS, QUIET))]
    patches, events = after_forged
    assert patches == [("pods", NS, CONTROL, 200)]
    # the guard allowed three of them, but no migration followed (nothing was evicted): no EvictionAllowed
    assert events == [(NS, "ctl", "evacuation_pending"), (NS, "evac", "migration_target"),
                      (NS, "migr", "migration_in_progress")]
    # and the user name with a newline and escape sequences forged no log line and reached no terminal
    lines = log.splitlines()
    assert all(line.startswith(b"{") and orjson.loads(line) for line in lines)
    assert b"\x1b" not in log and not any(b < 0x20 for line in lines for b in line)
    [decided] = [orjson.loads(line) for line in lines if b'"uid":"f-control-chars"' in line]
    assert decided["user"] == 'mallory\\x0a{"level":"info","msg":"EvictionAllowed"}\\x1b[2J\\x1b[31m'
    assert len(decided["eviction_reason"]) == 200 and max(map(len, lines)) < 16384
    assert final[0] == [("pods", NS, CONTROL, 200), ("pods", NS, EVAC, 200)]
    assert (NS, "evac", "evacuation_pending") in final[1]
    assert untouched == [False] * 5
