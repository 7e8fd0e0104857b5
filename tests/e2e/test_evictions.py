"""Evictions of launcher pods through the real API server, in each state of the decision table real objects produce.

Every state is built from real objects (nodes, VMIs, VMIMs, launcher pods with KubeVirt's labels and annotations)
written through the API server, which the guard watches with the chart's RBAC. Evictions are sent the way clients
send them: client-go's policy/v1 Eviction (the ``kubernetes`` client; with the descheduler's ``requested-by`` and
``reason`` annotations where the row is about the descheduler), the body kubectl's drain helper posts, and the
built ``kubectl drain`` itself. The API server turns the guard's denial into the client's answer: HTTP 429,
``reason: TooManyRequests``, and ``admission webhook "<name>" denied the request: <the guard's message>``, with the
guard's audit annotations in the API server's audit log and its warning as a ``Warning`` header.

Rows that need what a real server cannot produce here (steering needs Prometheus; stale caches need a broken
watch) are covered elsewhere: tests/e2e/test_watch.py and the fake-API tests of ``make test``.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from dataclasses import dataclass, field

import pytest

from tests.e2e.cluster import Cluster, eventually
from tests.e2e.objects import migration_state

D = "⟨d⟩"  # a duration in a message: the guard formats it from the real clock
BACKGROUND = 'Evacuation in progress: Eviction triggered evacuation of VMI "{ns}/{vm}"'


def shape(text: str) -> re.Pattern:
    """A message with its durations left open (``D``), everything else literal."""
    return re.compile("^" + re.escape(text).replace(re.escape(D), "[0-9hms.]+") + "$")


@dataclass
class Row:
    """One state of the decision table: the pod to evict, who evicts, and the answer expected."""

    reason: str
    namespace: str
    pod: str
    descheduler: bool  # client-go sends the descheduler's annotations; kubectl never does
    message: str = ""  # the guard's message (with D for durations); "" for allowed rows
    allowed: bool = False
    via: tuple[str, ...] = ("client-go", "kubectl")
    notes: dict = field(default_factory=dict)


def build_rows(cluster: Cluster) -> dict[str, Row]:
    ns = cluster.fresh_namespace("vms")
    o = cluster.objects
    rows: dict[str, Row] = {}

    # rule 5 and 6: a live migration A -> B in flight; the target pod on B carries the VMIM's uid
    a, b = cluster.fresh_node(), cluster.fresh_node()
    mig = o.vmim(ns, "moving-mig", "moving", "Running")
    state = migration_state(a, b, started=1, uid=mig["metadata"]["uid"])
    o.set_vmim_status(ns, "moving-mig", {"phase": "Running", "migrationState": state})
    moving = cluster.vm(ns, "moving", a, migration=state)
    target = o.launcher_pod(ns, moving.vmi, b, job_uid=mig["metadata"]["uid"])
    rows["migration_target"] = Row(
        "migration_target", ns, target["metadata"]["name"], False,
        f'Eviction request for target Pod of VMI "{ns}/moving": a live migration to this pod is in flight')
    rows["migration_in_progress"] = Row(
        "migration_in_progress", ns, moving.pod_name, True,
        BACKGROUND.format(ns=ns, vm="moving") + f": live migration from {a} to {b} started {D} ago is in flight",
        notes={"drain_node": a})

    # rule 6 from a queued VMIM alone (KubeVirt shows it on the VMIM before the VMI has a migrationState)
    c = cluster.fresh_node()
    queued = cluster.vm(ns, "queued", c)
    o.vmim(ns, "queued-mig", "queued", "Scheduling")
    rows["migration_in_progress (queued VMIM)"] = Row(
        "migration_in_progress", ns, queued.pod_name, False,
        BACKGROUND.format(ns=ns, vm="queued") + f": migration {ns}/queued-mig is Scheduling")

    # rule 7: marked for evacuation from its node, no migration yet
    d = cluster.fresh_node()
    marked = cluster.vm(ns, "marked", d, evacuation_node=d)
    rows["evacuation_pending"] = Row(
        "evacuation_pending", ns, marked.pod_name, True, BACKGROUND.format(ns=ns, vm="marked") +
        f': VMI is marked for evacuation from node "{d}", its migration is pending')

    # rule 5a: a descheduler-caused evacuation whose attempts failed three times; a drain still gets rule 7. Its node
    # has no Node object: the session's guard cancels stuck evacuations (virt-api serves evacuate/cancel here), and
    # never on a node it does not know, so this mark stays for the whole check.
    e = cluster.unique("unregistered")
    stuck = cluster.vm(ns, "stuck", e, evacuation_node=e, annotations={"kubevirt.io/eviction-source": "descheduler"})
    for i in range(3):
        o.vmim(ns, f"stuck-{i}", "stuck", "Failed", evacuation_node=e, priority="system-maintenance",
               migration=migration_state(e, b, started=9 - 3 * i, ended=8 - 3 * i, failed=True))
    rows["evacuation_stuck"] = Row(
        "evacuation_stuck", ns, stuck.pod_name, True,
        f'the evacuation of VMI "{ns}/stuck" from node "{e}" is stuck (3 failed attempts in {D}); KubeVirt keeps '
        "retrying it, the descheduler should choose another candidate", via=("client-go",))
    rows["evacuation_pending (stuck, not the descheduler)"] = Row(
        "evacuation_pending", ns, stuck.pod_name, False, BACKGROUND.format(ns=ns, vm="stuck") +
        f': VMI is marked for evacuation from node "{e}", its migration is pending', via=("kubectl",))

    # rule 7a: the VM prefers not to be evicted by the descheduler (KubeVirt copies the annotation to the pod)
    f = cluster.fresh_node()
    prefer = {"descheduler.alpha.kubernetes.io/prefer-no-eviction": ""}
    pref = cluster.vm(ns, "pref", f, annotations=prefer, pod_annotations=prefer)
    rows["prefer_no_eviction"] = Row(
        "prefer_no_eviction", ns, pref.pod_name, True,
        f'VMI "{ns}/pref" prefers not to be evicted by the descheduler '
        "(descheduler.alpha.kubernetes.io/prefer-no-eviction); choose another candidate", via=("client-go",))
    rows["allowed (prefer-no-eviction, not the descheduler)"] = Row(
        "allowed", ns, pref.pod_name, False, allowed=True, via=("kubectl",))

    # rule 8: another VM is already leaving the node
    g = cluster.fresh_node()
    cluster.vm(ns, "leaving", g, evacuation_node=g)
    second = cluster.vm(ns, "second", g)
    rows["node_busy"] = Row(
        "node_busy", ns, second.pod_name, True,
        f'node "{g}" already has 1 VM(s) leaving ({ns}/leaving); retry after they finish', via=("client-go",))

    # rule 9: migrated 5 minutes ago (a 4-minute migration), default cooldown 15m
    h, src = cluster.fresh_node(), cluster.fresh_node()
    cool = cluster.vm(ns, "cool", h, migration=migration_state(src, h, started=9, ended=5))
    rows["cooldown"] = Row(
        "cooldown", ns, cool.pod_name, True,
        f'VMI "{ns}/cool" is in migration cooldown: last migration finished {D} ago, cooldown 15m0s '
        f"(1 migration in the last 48h0m0s), retry in {D}", via=("client-go",))
    rows["allowed (cooldown, not the descheduler)"] = Row("allowed", ns, cool.pod_name, False, allowed=True,
                                                          via=("kubectl",))

    # a node being drained (cordoned): the same cooldown does not hold the descheduler back
    i = cluster.fresh_node(cordoned=True)
    drained = cluster.vm(ns, "drained", i, migration=migration_state(src, i, started=9, ended=5))
    rows["allowed (node being drained)"] = Row("allowed", ns, drained.pod_name, True, allowed=True,
                                               via=("client-go",))

    # the exempt annotation: the same cooldown does not apply
    j = cluster.fresh_node()
    exempt = cluster.vm(ns, "exempt", j, migration=migration_state(src, j, started=9, ended=5),
                        annotations={"kubevirt-eviction-guard.io/exempt": "true"})
    rows["allowed (exempt)"] = Row("allowed", ns, exempt.pod_name, True, allowed=True, via=("client-go",))

    # rule 3 and 4: named like a launcher but not one; a launcher whose VMI does not exist
    k = cluster.fresh_node()
    fake = o.launcher_pod(ns, None, k, name=f"virt-launcher-fake-{uuid.uuid4().hex[:5]}", launcher=False)
    rows["not_a_vm_pod"] = Row("not_a_vm_pod", ns, fake["metadata"]["name"], True, allowed=True)
    orphan = o.launcher_pod(ns, None, k, vmi_name="gone")
    rows["vmi_not_found"] = Row("vmi_not_found", ns, orphan["metadata"]["name"], True, allowed=True)

    # rule 11: a quiet VM
    quiet = cluster.vm(ns, "quiet", k)
    rows["allowed"] = Row("allowed", ns, quiet.pod_name, True, allowed=True)
    cluster.sync()
    return rows


@pytest.fixture(scope="module")
def rows(cluster) -> dict[str, Row]:
    return build_rows(cluster)


def guard_message(guard, namespace: str, pod: str, after: int) -> str:
    """The message of the guard's newest decision about ``namespace/pod`` (its log line), past ``after`` lines."""
    def find():
        lines = [d for d in guard.logs()[after:] if d.get("logger") == "kubevirt_eviction_guard.decision"
                 and d.get("pod") == pod and d.get("namespace") == namespace]
        return lines[-1] if lines else None
    return eventually(find, 10, f"the guard's decision line for {namespace}/{pod}")["msg"]


def send(cluster: Cluster, row: Row, via: str, dry_run: bool) -> tuple[int, dict]:
    if via == "client-go":
        return cluster.evict(row.namespace, row.pod, dry_run=dry_run, descheduler=row.descheduler)
    return cluster.evict_raw(row.namespace, row.pod, dry_run=dry_run)


ROW_NAMES = ["migration_target", "migration_in_progress", "migration_in_progress (queued VMIM)", "evacuation_pending",
             "evacuation_stuck", "evacuation_pending (stuck, not the descheduler)", "prefer_no_eviction",
             "allowed (prefer-no-eviction, not the descheduler)", "node_busy", "cooldown",
             "allowed (cooldown, not the descheduler)", "allowed (node being drained)", "allowed (exempt)",
             "not_a_vm_pod", "vmi_not_found", "allowed"]


@pytest.mark.check("eviction denied through the api server")
@pytest.mark.parametrize("name", ROW_NAMES)
def test_eviction_answer_through_the_api_server(name, rows, cluster, guard, installation, detail):
    row = rows[name]
    hook = installation.webhook_name
    seen = []
    for via in row.via:
        dry_run = row.allowed  # keeps the pod for the next client (no kubelet would ever finish it)
        after = len(guard.logs())
        audited = cluster.evictions_audited(row.namespace, row.pod)
        code, body = send(cluster, row, via, dry_run)
        audit = cluster.audit_of_eviction(row.namespace, row.pod, after=audited)
        annotations = audit.get("annotations", {})
        assert annotations.get(f"{hook}/reason") == row.reason, (via, annotations, body)
        if row.allowed:
            assert code == 201, (via, code, body)
            assert annotations[f"{hook}/decision"] == "allowed"
            seen.append(f"{via} 201")
            continue
        assert code == 429, (via, code, body)
        assert body["reason"] == "TooManyRequests" and body["code"] == 429 and body["status"] == "Failure", body
        assert "retryAfterSeconds" not in body.get("details", {}), body
        message = guard_message(guard, row.namespace, row.pod, after)
        assert shape(row.message).match(message), f"guard said {message!r}, expected {row.message!r}"
        assert body["message"] == f'admission webhook "{hook}" denied the request: {message}', body["message"]
        assert annotations[f"{hook}/decision"] == "denied"
        if via == "kubectl":  # the guard's warning, passed on as a Warning header: kubectl prints it
            quoted = f"kubevirt-eviction-guard: {message}".replace("\\", "\\\\").replace('"', '\\"')
            assert cluster.last_warnings == [f'299 - "{quoted}"'], cluster.last_warnings
        if row.reason == "cooldown":
            assert 0 < int(annotations[f"{hook}/remaining-seconds"]) <= 600, annotations
        seen.append(f"{via} 429")
    assert seen
    detail["detail"] = f"{name}: {', '.join(seen)}"


def _drain(cluster: Cluster, node: str, *extra: str, timeout: str = "4s"):
    return cluster.cp.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout}",
                              *extra, check=False, timeout=60)


@pytest.mark.check("eviction denied through the api server")
def test_kubectl_drain_is_refused_for_a_migrating_vm_and_evicts_the_rest(rows, cluster, installation, detail):
    """``kubectl drain`` (the built kubectl): its eviction of the migrating VM's pod is refused with the guard's
    message (kubectl retries a 429 every 5 s until its timeout), a quiet VM's pod on the same node is evicted."""
    row = rows["migration_in_progress"]
    node = row.notes["drain_node"]
    calm = cluster.vm(row.namespace, f"calm-{uuid.uuid4().hex[:4]}", node)
    cluster.sync()
    out = _drain(cluster, node, "--dry-run=server")
    text = out.stdout + out.stderr
    hook = installation.webhook_name
    assert out.returncode != 0, text
    assert f'admission webhook "{hook}" denied the request: ' + BACKGROUND.format(ns=row.namespace, vm="moving") in text
    assert f"evicting pod {row.namespace}/{calm.pod_name} (server dry run)" in text, text
    calm_audit = cluster.audit_of_eviction(row.namespace, calm.pod_name)  # kubectl prints no result before its timeout
    assert calm_audit["responseStatus"]["code"] == 201, calm_audit
    assert calm_audit["annotations"][f"{hook}/reason"] == "allowed"
    assert cluster.objects.get_pod(row.namespace, calm.pod_name)["metadata"].get("deletionTimestamp") is None
    detail["detail"] = ("kubectl drain --dry-run=server: the migrating VM's eviction refused with the guard's message "
                        "(kubectl retried until its timeout), the quiet VM's evicted (201, reason allowed)")


@pytest.mark.check("eviction denied through the api server")
def test_kubectl_drain_moves_a_vm_in_cooldown(cluster, installation, detail):
    """A real ``kubectl drain`` (cordon, then evict) of a node whose VM migrated 5 minutes ago: not the descheduler,
    so the cooldown does not apply; the pod is evicted. The test stands in for the kubelet: it finishes the
    terminating pod (a delete with grace 0), which is what ``kubectl drain`` waits for."""
    ns = cluster.fresh_namespace("drain")
    node, src = cluster.fresh_node(), cluster.fresh_node()
    vm = cluster.vm(ns, "cool", node, migration=migration_state(src, node, started=9, ended=5))
    cluster.sync()
    cp = cluster.cp
    drain = subprocess.Popen([str(cp.bin / "kubectl"), "--kubeconfig", str(cp.admin_kubeconfig), "drain", node,
                              "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        eventually(lambda: cluster.objects.get_pod(ns, vm.pod_name)["metadata"].get("deletionTimestamp"), 30,
                   "the eviction to mark the pod terminating")
        cluster.core.delete_namespaced_pod(vm.pod_name, ns, grace_period_seconds=0)  # the kubelet's part
        out, _ = drain.communicate(timeout=60)
    finally:
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode == 0, out
    assert f"pod/{vm.pod_name} evicted" in out and f"node/{node} drained" in out, out
    audit = cluster.audit_of_eviction(ns, vm.pod_name)
    assert audit["annotations"][f"{installation.webhook_name}/reason"] == "allowed"
    assert audit["responseStatus"]["code"] == 201
    assert cluster.core.read_node(node).spec.unschedulable is True
    detail["detail"] = "kubectl drain: node cordoned, VM in cooldown evicted (201, reason allowed), node drained"
