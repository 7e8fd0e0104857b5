"""The decision table through the API server in front of real KubeVirt: each state reached the way a cluster reaches
it, the guard's answer first, then what virt-api's eviction admitter made of what the guard let through.

Every VM is a VMI created as a user creates one, started by KubeVirt's virt-controller (its launcher pod), run by the
actor's kubelet and virt-handler (tests/e2e/actor/node.py). Every mark is virt-api's, written when its admitter saw a
real eviction; every migration is one KubeVirt's evacuation controller created and its migration controller moved
through its phases. States:

- a migration in flight: a descheduler eviction, virt-api's mark, the evacuation VMIM, its target pod bound on
  another node, and virt-handler's start held (rules 5 and 6);
- a migration queued: the same, with no node for the target pod (the VMIM stays ``Scheduling``; rule 6);
- a marked VM without a migration: ``evictionStrategy: External``, which virt-api marks and KubeVirt's evacuation
  controller leaves to someone else (rule 7; such a mark holds no node), and a second VM beside the migration in
  flight (rule 8);
- migrated a moment ago by KubeVirt (rules 9, and the cordoned-node and exempt exceptions);
- the VM's own ``prefer-no-eviction`` (rule 7a);
- pods that are not a VM's (rules 3 and 4), and a quiet VM (rule 11).

Allowed rows are dry runs (KubeVirt would otherwise move the VM, and the next row would see another state): the
guard allows, and virt-api answers as it does for a dry run: the background 429 without marking. The stuck row
(rule 5a) stays on the played control plane (tests/e2e/test_evictions.py): here the guard's own canceller ends a
stuck evacuation at the same count of failed attempts, so the state does not last long enough to be asked about.

Most of its time is the rows' VMs and migrations, and the two drains.
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass, field

import pytest

from tests.e2e.kubevirt import wait_for
from tests.e2e.test_evictions import BACKGROUND, D, guard_message, shape
from tests.e2e.test_real_kubevirt import VIRT_API_HOOK, evict, guard_reason, kv  # noqa: F401 - kv: the fixture

pytestmark = pytest.mark.timeout(600)
VIRT_API_TEXT = 'Eviction triggered evacuation of VMI "{ns}/{vm}"'


@dataclass
class RealRow:
    reason: str
    namespace: str
    pod: str
    descheduler: bool
    message: str = ""  # the guard's (with D for durations); "" when the guard allows
    allowed: bool = False
    via: tuple[str, ...] = ("client-go", "kubectl")
    then: tuple[int, str] | None = None  # what KubeVirt answered after the guard allowed: (code, message or "")
    notes: dict = field(default_factory=dict)


def _migrate(kv, ns: str, name: str) -> None:
    """A descheduler eviction through the guard and virt-api: KubeVirt moves the VM (the actor's plan: succeed)."""
    code, body, audit = evict(kv, ns, kv.source_pod(ns, name).metadata.name)
    assert code == 429 and guard_reason(kv, audit) == "allowed", (code, body, audit.get("annotations"))


def build_real_rows(kv) -> dict[str, RealRow]:
    c = kv.cluster
    ns = c.fresh_namespace("real-rows")
    nodes = {k: kv.node(k) for k in ("src", "dst", "queue", "ext", "misc", "cool", "cooled", "drain", "drained",
                                     "exempt", "exempted")}
    n = nodes.__getitem__
    for vm, node, target in (("moving", "src", "dst"), ("queued", "queue", "queue"), ("cool", "cool", "cooled"),
                             ("drained", "drain", "drained"), ("exempt", "exempt", "exempted")):
        kv.nodes.targets[(ns, vm)] = n(target)  # "queued": its own node, so its target pod is never bound
        kv.nodes.copy_seconds[(ns, vm)] = 1
    kv.nodes.plans[(ns, "moving")] = ["hold"]
    prefer = {"descheduler.alpha.kubernetes.io/prefer-no-eviction": ""}
    kv.vms(ns, [("moving", n("src"), {}), ("queued", n("queue"), {}),
                ("ext", n("ext"), {"eviction_strategy": "External"}), ("second", n("src"), {}),
                ("pref", n("misc"), {"annotations": prefer}), ("quiet", n("misc"), {}), ("cool", n("cool"), {}),
                ("drained", n("drain"), {}),
                ("exempt", n("exempt"), {"annotations": {"kubevirt-eviction-guard.io/exempt": "true"}})])
    c.sync()
    for vm in ("moving", "queued", "ext", "cool", "drained", "exempt"):
        _migrate(kv, ns, vm)
    # KubeVirt's states: the held migration started, the queued one's VMIM Scheduling, the three moved ones done
    (held,) = wait_for(lambda: [m for m in kv.nodes.migrations_of(ns, "moving") if m.started], 60,
                       "virt-handler to start the held migration")
    (target,) = wait_for(lambda: [p for p in kv.launcher_pods(ns, "moving") if p.spec.node_name == n("dst")
                                  and p.status.phase == "Running"], 30, "the migration's target pod on dst")
    queued = wait_for(lambda: (ms := kv.vmims(ns, "queued")) and ms[0].get("status", {}).get("phase") == "Scheduling"
                      and ms[0], 60, "the queued migration to be Scheduling")
    for vm, node in (("cool", "cooled"), ("drained", "drained"), ("exempt", "exempted")):
        wait_for(lambda vm=vm, node=node: kv.vmi(ns, vm)["status"].get("nodeName") == n(node)
                 and kv.source_pod(ns, vm), 60, f"KubeVirt to move {vm}")
    assert kv.vmi(ns, "ext")["status"].get("evacuationNodeName") == n("ext") and not kv.vmims(ns, "ext")
    c.core.patch_node(n("drained"), {"spec": {"unschedulable": True}})
    o = c.objects
    fake = o.launcher_pod(ns, None, n("misc"), name=f"virt-launcher-fake-{uuid.uuid4().hex[:5]}", launcher=False)
    orphan = o.launcher_pod(ns, None, n("misc"), vmi_name="gone")
    c.sync()

    pod = lambda vm: kv.source_pod(ns, vm).metadata.name  # noqa: E731
    background = lambda vm: (429, VIRT_API_TEXT.format(ns=ns, vm=vm))  # noqa: E731 - virt-api's dry-run answer
    a, b = n("src"), n("dst")
    rows = {
        "migration_target": RealRow(
            "migration_target", ns, target.metadata.name, False,
            f'Eviction request for target Pod of VMI "{ns}/moving": a live migration to this pod is in flight'),
        "migration_in_progress": RealRow(
            "migration_in_progress", ns, pod("moving"), True,
            BACKGROUND.format(ns=ns, vm="moving") + f": live migration from {a} to {b} started {D} ago is in flight",
            notes={"drain_node": a, "held": held}),
        "migration_in_progress (queued VMIM)": RealRow(
            "migration_in_progress", ns, pod("queued"), False,
            BACKGROUND.format(ns=ns, vm="queued") + f": migration {ns}/{queued['metadata']['name']} is Scheduling"),
        "evacuation_pending": RealRow(
            "evacuation_pending", ns, pod("ext"), True, BACKGROUND.format(ns=ns, vm="ext") +
            f': VMI is marked for evacuation from node "{n("ext")}", its migration is pending'),
        "prefer_no_eviction": RealRow(
            "prefer_no_eviction", ns, pod("pref"), True,
            f'VMI "{ns}/pref" prefers not to be evicted by the descheduler '
            "(descheduler.alpha.kubernetes.io/prefer-no-eviction); choose another candidate", via=("client-go",)),
        "allowed (prefer-no-eviction, not the descheduler)": RealRow(
            "allowed", ns, pod("pref"), False, allowed=True, via=("kubectl",), then=background("pref")),
        "node_busy": RealRow(
            "node_busy", ns, pod("second"), True,
            f'node "{n("src")}" already has 1 VM(s) leaving ({ns}/moving); retry after they finish', via=("client-go",)),
        "cooldown": RealRow(
            "cooldown", ns, pod("cool"), True,
            f'VMI "{ns}/cool" is in migration cooldown: last migration finished {D} ago, cooldown 15m0s '
            f"(1 migration in the last 48h0m0s), retry in {D}", via=("client-go",)),
        "allowed (cooldown, not the descheduler)": RealRow(
            "allowed", ns, pod("cool"), False, allowed=True, via=("kubectl",), then=background("cool")),
        "allowed (node being drained)": RealRow(
            "allowed", ns, pod("drained"), True, allowed=True, via=("client-go",), then=background("drained")),
        "allowed (exempt)": RealRow("allowed", ns, pod("exempt"), True, allowed=True, via=("client-go",),
                                    then=background("exempt")),
        # virt-api lets a pod that is not a launcher go (its admitter passes it)
        "not_a_vm_pod": RealRow("not_a_vm_pod", ns, fake["metadata"]["name"], True, allowed=True, then=(201, "")),
        # ... but refuses a launcher pod whose VMI it cannot read, where the guard had nothing to protect
        "vmi_not_found": RealRow("vmi_not_found", ns, orphan["metadata"]["name"], True, allowed=True,
                                 then=(429, f'kubevirt failed getting the vmi: virtualmachineinstances.kubevirt.io '
                                            f'"gone" not found')),
        "allowed": RealRow("allowed", ns, pod("quiet"), True, allowed=True, then=background("quiet")),
    }
    return rows


@pytest.fixture(scope="module")
def real_rows(kv) -> dict[str, RealRow]:
    rows = build_real_rows(kv)
    yield rows
    # let KubeVirt finish what the rows held, so the session's other checks see a calm cluster
    kv.nodes.set_plan(rows["migration_in_progress"].notes["held"], "succeed")


ROW_NAMES = ["migration_target", "migration_in_progress", "migration_in_progress (queued VMIM)", "evacuation_pending",
             "prefer_no_eviction", "allowed (prefer-no-eviction, not the descheduler)", "node_busy", "cooldown",
             "allowed (cooldown, not the descheduler)", "allowed (node being drained)", "allowed (exempt)",
             "not_a_vm_pod", "vmi_not_found", "allowed"]


@pytest.mark.check("eviction denied through the api server")
@pytest.mark.parametrize("name", ROW_NAMES)
def test_eviction_answer_through_the_guard_and_real_virt_api(name, real_rows, kv, detail):
    row = real_rows[name]
    cluster, guard, hook = kv.cluster, kv.guard, kv.installation.webhook_name
    seen = []
    for via in row.via:
        dry_run = row.allowed  # KubeVirt would move the VM otherwise
        after = len(guard.logs())
        audited = cluster.evictions_audited(row.namespace, row.pod)
        if via == "client-go":
            code, body = cluster.evict(row.namespace, row.pod, dry_run=dry_run, descheduler=row.descheduler)
        else:
            code, body = cluster.evict_raw(row.namespace, row.pod, dry_run=dry_run)
        audit = cluster.audit_of_eviction(row.namespace, row.pod, after=audited)
        annotations = audit.get("annotations", {})
        assert annotations.get(f"{hook}/reason") == row.reason, (via, annotations, body)
        if row.allowed:
            assert annotations[f"{hook}/decision"] == "allowed"
            want_code, want_text = row.then
            assert code == want_code, (via, code, body)
            if want_code == 429:  # virt-api's validating webhook, after the guard's mutating one let it through
                assert body["message"] == f'admission webhook "{VIRT_API_HOOK}" denied the request: {want_text}', body
                seen.append(f"{via}: guard allowed, virt-api {code} ({want_text})")
            else:
                seen.append(f"{via}: guard allowed, virt-api passed it ({code})")
            continue
        assert code == 429, (via, code, body)
        assert body["reason"] == "TooManyRequests" and "retryAfterSeconds" not in body.get("details", {}), body
        message = guard_message(guard, row.namespace, row.pod, after)
        assert shape(row.message).match(message), f"guard said {message!r}, expected {row.message!r}"
        assert body["message"] == f'admission webhook "{hook}" denied the request: {message}', body["message"]
        if via == "kubectl":
            quoted = f"kubevirt-eviction-guard: {message}".replace("\\", "\\\\").replace('"', '\\"')
            assert cluster.last_warnings == [f'299 - "{quoted}"'], cluster.last_warnings
        seen.append(f"{via}: guard 429")
    detail["detail"] = f"real KubeVirt, {name}: " + "; ".join(seen)


@pytest.mark.check("eviction denied through the api server")
def test_kubectl_drain_dry_run_refused_for_a_migrating_vm_through_real_kubevirt(real_rows, kv, detail):
    """``kubectl drain --dry-run=server`` of the node a held migration leaves: the migrating VM's eviction is refused
    with the guard's background text (kubectl retries until its timeout); a quiet VM's there passes the guard and
    virt-api answers the dry run with its own background 429, marking nothing."""
    row = real_rows["migration_in_progress"]
    node, ns = row.notes["drain_node"], row.namespace
    calm = f"calm-{uuid.uuid4().hex[:4]}"
    kv.vm(ns, calm, node)
    calm_pod = kv.source_pod(ns, calm).metadata.name
    kv.cluster.sync()
    hook = kv.installation.webhook_name
    out = kv.cp.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=4s",
                        "--dry-run=server", check=False, timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert f'admission webhook "{hook}" denied the request: ' + BACKGROUND.format(ns=ns, vm="moving") in text, text
    audit = kv.cluster.audit_of_eviction(ns, calm_pod)
    assert audit["annotations"][f"{hook}/reason"] == "allowed" and audit["responseStatus"]["code"] == 429, audit
    assert not kv.vmi(ns, calm)["status"].get("evacuationNodeName"), "virt-api marked on a dry run"
    kv.cp.kubectl("uncordon", node)
    detail["detail"] = ("real KubeVirt, kubectl drain --dry-run=server: the migrating VM's eviction refused by the guard "
                        "(background text); the quiet VM's allowed by the guard, answered 429 by virt-api's dry run")


@pytest.mark.check("eviction denied through the api server")
def test_kubectl_drain_moves_a_vm_in_cooldown_through_real_kubevirt(real_rows, kv, detail):
    """A real ``kubectl drain`` of the node a VM reached a moment ago (in cooldown): not the descheduler, so the
    guard lets each eviction through; virt-api turns it into an evacuation (429, kubectl retries every 5 s), KubeVirt
    migrates the VM back, and the completed pod's eviction passes: the node drains."""
    ns = real_rows["cooldown"].namespace
    node = kv.vmi(ns, "cool")["status"]["nodeName"]
    back = kv.node("back")
    kv.nodes.targets[(ns, "cool")] = back
    pod = kv.source_pod(ns, "cool").metadata.name
    before = kv.cluster.evictions_audited(ns, pod)
    out = subprocess.run([str(kv.cp.bin / "kubectl"), "--kubeconfig", str(kv.cp.admin_kubeconfig), "drain", node,
                          "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s"],
                         capture_output=True, text=True, timeout=180)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert f'Eviction triggered evacuation of VMI "{ns}/cool"' in text and f"node/{node} drained" in text, text
    key = f"{kv.installation.webhook_name}/reason"
    reasons = [e.get("annotations", {}).get(key) for e in kv.cp.audit_events() if e.get("verb") == "create"
               and e.get("objectRef", {}).get("subresource") == "eviction" and e["objectRef"].get("namespace") == ns
               and e["objectRef"].get("name") == pod][before:]
    # the guard allowed the first (virt-api marked the VM); while KubeVirt migrated it, kubectl's retries got the
    # guard's background answer; the completed pod's eviction, no VM's any more, passed
    assert reasons[0] == "allowed" and reasons[-1] == "not_a_vm_pod", reasons
    assert set(reasons[1:-1]) <= {"allowed", "migration_in_progress", "evacuation_pending"}, reasons
    assert kv.vmi(ns, "cool")["status"]["nodeName"] == back
    detail["detail"] = (f"real KubeVirt, kubectl drain of a node whose VM is in cooldown: guard allowed, virt-api "
                        f"marked it (429), the guard answered kubectl's retries while KubeVirt moved the VM to {back} "
                        f"({', '.join(reasons)}), node drained")
