"""The guard in front of real KubeVirt: virt-api's eviction admitter, virt-controller's evacuation and migration
controllers and its pod annotation, virt-api's ``evacuate/cancel``, all KubeVirt's own code (tests/e2e/kubevirt.py,
built from the Go module proxy); the actor plays only kubelet, the scheduler's binding and virt-handler
(tests/e2e/actor/node.py).

Every state is reached the way a cluster reaches it: a VMI created as a user creates one and started by KubeVirt, a
migration that KubeVirt's evacuation controller created after virt-api's admitter marked the VMI, its phases moved
by virt-controller from what virt-handler reports. Evictions go through the API server, so the guard's mutating
webhook answers first and virt-api's validating webhook (``virt-launcher-eviction-interceptor.kubevirt.io``) only
sees what the guard let through.

Most of its time is the failed attempts (KubeVirt's retry waits for virt-handler's heartbeat, 60 to 132 s). The three real-KubeVirt files (this one, test_real_evictions.py,
test_real_side_effects.py) share the session's one real-KubeVirt control plane: run them as one group.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess

import pytest
from kubernetes.client import ApiClient

from tests.e2e.controlplane import ROOT
from tests.e2e.kubevirt import GROUP, wait_for

VIRT_API_HOOK = "virt-launcher-eviction-interceptor.kubevirt.io"
EVICTION_IN_PROGRESS = "descheduler.alpha.kubernetes.io/eviction-in-progress"
EVICTION_SOURCE = "kubevirt.io/eviction-source"
EVACUATION = "kubevirt.io/evacuationMigration"
CANCEL = "kubevirt_eviction_guard_evacuation_canceller_info"

pytestmark = pytest.mark.timeout(600)  # KubeVirt's own pace: retries wait for virt-handler's heartbeat (<= 132 s)
_behaviours: dict[str, str] = {}  # what KubeVirt's own code did in this session: the "real kubevirt" check's detail


CAPTURED = ROOT / "build" / "e2e" / "kubevirt-objects"  # objects as real KubeVirt left them (tests/fixtures/kubevirt-1.8.3)


def capture(name: str, obj) -> None:
    """Keep an object as the API server returned it, for the fixtures of ``make test`` (managedFields dropped)."""
    if not isinstance(obj, dict):  # a typed core/v1 object from a list: name its kind, as the API server's GET does
        kind = type(obj).__name__.removeprefix("V1")
        obj = ApiClient().sanitize_for_serialization(obj)
        obj.update(apiVersion=obj.get("apiVersion") or "v1", kind=obj.get("kind") or kind)
    obj = json.loads(json.dumps(obj))
    obj.get("metadata", {}).pop("managedFields", None)
    CAPTURED.mkdir(parents=True, exist_ok=True)
    (CAPTURED / f"{name}.json").write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def ts(value: str) -> dt.datetime:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def phase_time(vmim: dict, phase: str) -> dt.datetime | None:
    for p in vmim.get("status", {}).get("phaseTransitionTimestamps", []):
        if p["phase"] == phase:
            return ts(p["phaseTransitionTimestamp"])
    return None


@pytest.fixture(scope="module")
def kv(real_kubevirt):
    return real_kubevirt


def evict(kv, namespace: str, pod: str, *, descheduler: bool = True, dry_run: bool = False) -> tuple[int, dict, dict]:
    """An eviction through the API server: (code, Status body, its audit event with both webhooks' annotations)."""
    c = kv.cluster
    before = c.evictions_audited(namespace, pod)
    code, body = c.evict(namespace, pod, descheduler=descheduler, dry_run=dry_run)
    return code, body, c.audit_of_eviction(namespace, pod, after=before)


def guard_reason(kv, audit: dict) -> str | None:
    return audit.get("annotations", {}).get(f"{kv.installation.webhook_name}/reason")


@pytest.mark.check("real kubevirt")
def test_descheduler_eviction_through_the_guard_and_virt_api_migrates_the_vm(kv, detail):
    ns = kv.cluster.fresh_namespace("real")
    a, b = kv.node("src"), kv.node("dst")
    kv.nodes.targets[(ns, "vm")] = b
    kv.nodes.copy_seconds[(ns, "vm")] = 3
    kv.nodes.plans[(ns, "vm")] = ["hold"]  # in flight until the guard has answered for it below
    kv.vm(ns, "vm", a)
    pod = kv.source_pod(ns, "vm")
    kv.cluster.sync()

    # the guard allows (a quiet VM); virt-api's admitter marks the VMI and answers with the background 429
    code, body, audit = evict(kv, ns, pod.metadata.name)
    assert guard_reason(kv, audit) == "allowed", audit.get("annotations")
    text = f'Eviction triggered evacuation of VMI "{ns}/vm"'
    assert code == 429 and body["message"] == f'admission webhook "{VIRT_API_HOOK}" denied the request: {text}', body
    vmi = kv.vmi(ns, "vm")
    assert vmi["status"]["evacuationNodeName"] == a
    assert vmi["metadata"]["annotations"][EVICTION_SOURCE] == "descheduler"
    # virt-controller: the pod annotation that tells the descheduler the eviction runs in the background
    annotated = wait_for(lambda: (p := kv.source_pod(ns, "vm")) and p.metadata.annotations.get(EVICTION_IN_PROGRESS),
                         30, "virt-controller's eviction-in-progress annotation")
    assert annotated == "true"
    capture("vmi-marked-by-descheduler-eviction", kv.vmi(ns, "vm"))
    capture("pod-virt-launcher-evacuating-source", kv.source_pod(ns, "vm"))
    # the evacuation controller's VMIM, and its Event
    (vmim,) = wait_for(lambda: kv.vmims(ns, "vm"), 30, "the evacuation VMIM")
    assert vmim["metadata"]["name"].startswith("kubevirt-evacuation-"), vmim["metadata"]
    assert vmim["metadata"]["annotations"][EVACUATION] == a
    priority = vmim["spec"].get("priority")
    assert priority is None  # MigrationPriorityQueue is Beta in v1.8, off unless the KubeVirt CR enables it
    wait_for(lambda: [e for e in kv.events(ns, "vm", "SuccessfulCreate")
                      if e.message == f"Created Migration {vmim['metadata']['name']}"], 30,
             "the evacuation controller's SuccessfulCreate Event")

    # while it migrates: the guard's own answer (the descheduler's background text), virt-api never asked
    wait_for(lambda: kv.vmims(ns, "vm")[0].get("status", {}).get("phase") in ("Scheduling", "Scheduled",
             "PreparingTarget", "TargetReady", "Running"), 30, "the migration to be under way")
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, pod.metadata.name)
    assert code == 429 and guard_reason(kv, audit) in ("migration_in_progress", "evacuation_pending"), audit
    assert body["message"].startswith(f'admission webhook "{kv.installation.webhook_name}" denied the request: '
                                      f'Evacuation in progress: {text}'), body
    assert len(kv.vmims(ns, "vm")) == 1
    (held,) = wait_for(lambda: kv.nodes.migrations_of(ns, "vm"), 30, "virt-handler to see the migration")
    kv.nodes.set_plan(held, "succeed")

    # KubeVirt completes it from what virt-handler reports; the VM is on b, the mark and the source annotation gone
    done = wait_for(lambda: (m := kv.vmims(ns, "vm")[0]).get("status", {}).get("phase") == "Succeeded" and m,
                    60, "the migration to succeed")
    # the VMI's migrationState is copied onto the finished VMIM at its next sync (what the guard's history reads)
    done = wait_for(lambda: (m := kv.vmims(ns, "vm")[0])["status"].get("migrationState", {}).get("endTimestamp")
                    and m, 30, "virt-controller to copy the migrationState onto the VMIM")
    capture("vmim-evacuation-succeeded", done)
    phases = [p["phase"] for p in done["status"]["phaseTransitionTimestamps"]]
    assert phases[-1] == "Succeeded" and "Running" in phases and "TargetReady" in phases, phases
    vmi = kv.vmi(ns, "vm")
    capture("vmi-after-evacuation", vmi)
    assert vmi["status"]["nodeName"] == b and not vmi["status"].get("evacuationNodeName")
    assert EVICTION_SOURCE not in (vmi["metadata"].get("annotations") or {})
    assert done["status"]["migrationState"]["sourceNode"] == a and done["status"]["migrationState"]["targetNode"] == b
    new_pod = wait_for(lambda: kv.source_pod(ns, "vm"), 30, "the VM's pod on b")
    assert new_pod.spec.node_name == b and new_pod.metadata.labels.get("kubevirt.io/migrationJobUID") == \
        done["metadata"]["uid"]

    # now in cooldown: the guard denies the descheduler (plain 429, no background text), virt-api is never asked
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, new_pod.metadata.name)
    assert code == 429 and guard_reason(kv, audit) == "cooldown", audit.get("annotations")
    assert "Eviction triggered evacuation" not in body["message"]
    assert not kv.vmi(ns, "vm")["status"].get("evacuationNodeName")
    # a dry-run eviction by a drain (not the descheduler): allowed by the guard, then virt-api honours the dry run
    code, body, audit = evict(kv, ns, new_pod.metadata.name, descheduler=False, dry_run=True)
    assert guard_reason(kv, audit) == "allowed" and code == 429 and text in body["message"], (code, body)
    assert not kv.vmi(ns, "vm")["status"].get("evacuationNodeName"), "virt-api marked on a dry run"
    _behaviours["admitter"] = (f"virt-api's eviction admitter: 429 '{text}', VMI marked (evacuationNodeName, "
                               f"{EVICTION_SOURCE}: descheduler), dry run honoured")
    _behaviours["evacuation"] = (f"evacuation controller: VMIM {vmim['metadata']['name']} ({EVACUATION}: {a}, "
                                 f"priority {priority or 'unset: MigrationPriorityQueue off'}), Event SuccessfulCreate")
    _behaviours["migration"] = (f"migration controller: phases {' > '.join(phases)}; target pod with "
                                "kubevirt.io/migrationJobUID; node switch and mark cleared on completion")
    _behaviours["pod annotation"] = f"virt-controller set {EVICTION_IN_PROGRESS}: true on the marked VM's pod"
    detail["detail"] = (f"{ns}/vm: guard allowed, virt-api marked and answered 429 background; VMIM "
                        f"{vmim['metadata']['name']} {' > '.join(phases)}; VM moved {a} -> {b}; then guard: "
                        "migration in progress while it ran, cooldown after")


@pytest.mark.check("real kubevirt")
def test_node_budget_and_virt_api_refusal_of_a_marked_vm(kv, detail):
    """Two VMs on one node: the first one's migration is held before it starts (virt-handler does not report its
    start yet); the guard refuses the second for the node budget before virt-api is asked, and answers a drain's
    eviction of the first with KubeVirt's own background text."""
    ns = kv.cluster.fresh_namespace("budget")
    a, b = kv.node("src"), kv.node("dst")
    for name in ("first", "second"):
        kv.nodes.targets[(ns, name)] = b
        kv.vm(ns, name, a)
    kv.nodes.plans[(ns, "first")] = ["hold-start"]
    first, second = kv.source_pod(ns, "first"), kv.source_pod(ns, "second")
    kv.cluster.sync()
    code, _, audit = evict(kv, ns, first.metadata.name)
    assert code == 429 and guard_reason(kv, audit) == "allowed"
    wait_for(lambda: kv.vmims(ns, "first"), 30, "the evacuation VMIM")
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, second.metadata.name)
    assert code == 429 and guard_reason(kv, audit) == "node_busy", audit.get("annotations")
    assert kv.installation.webhook_name in body["message"] and not kv.vmi(ns, "second")["status"].get(
        "evacuationNodeName")
    # a drain's eviction of the marked VM: the guard answers for KubeVirt (the background text), before virt-api
    code, body, audit = evict(kv, ns, first.metadata.name, descheduler=False)
    assert code == 429 and guard_reason(kv, audit) in ("evacuation_pending", "migration_in_progress"), audit
    assert body["message"].startswith(f'admission webhook "{kv.installation.webhook_name}" denied the request: '
                                      f'Evacuation in progress: Eviction triggered evacuation of VMI "{ns}/first"'), body
    (held,) = wait_for(lambda: kv.nodes.migrations_of(ns, "first"), 30, "virt-handler to see the migration")
    # the migration's target pod, created by virt-controller and bound by the scheduler: a drain's eviction of it
    # is refused by the guard (rule 5) before virt-api, which would refuse it too ("Eviction request for target Pod")
    (target,) = [p for p in kv.launcher_pods(ns, "first") if "kubevirt.io/migrationJobUID" in p.metadata.labels]
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, target.metadata.name, descheduler=False)
    assert code == 429 and guard_reason(kv, audit) == "migration_target", audit.get("annotations")
    assert f'Eviction request for target Pod of VMI "{ns}/first"' in body["message"], body
    kv.nodes.set_plan(held, "succeed")
    wait_for(lambda: kv.vmims(ns, "first")[0].get("status", {}).get("phase") == "Succeeded", 60, "the migration")
    _behaviours["budget"] = ("node budget: the guard refused a second VM while KubeVirt migrated the first; the "
                             "target pod virt-controller created refused as a migration target")
    detail["detail"] = f"{ns}: first marked by virt-api and migrating; second refused node_busy by the guard"


@pytest.mark.check("real kubevirt")
def test_failed_attempts_backoff_and_the_canceller_through_real_evacuate_cancel(kv, detail):
    """Every attempt fails (virt-handler reports the failure): virt-controller retries with its backoff (20 s after
    the first failure), the pod keeps ``eviction-in-progress`` through the failed attempt, and after 2 failed
    attempts (the chart's evacuationStaleAfterFailures here) the guard's canceller calls virt-api's real
    ``evacuate/cancel``: the mark goes, and virt-controller takes the pod annotation away again. KubeVirt leaves
    ``kubevirt.io/eviction-source: descheduler`` on the VMI; the guard removes it once the cancelled evacuation's
    last attempt has ended, so that a user's eviction of the VM afterwards, which inherits the failed attempts, is
    not taken for the descheduler's and cancelled."""
    g = kv.guard
    wait_for(lambda: g.metric(CANCEL, enabled="true", reason="enabled") == 1, 30, "the canceller to be on")
    ns = kv.cluster.fresh_namespace("fail")
    a, b = kv.node("src"), kv.node("dst")
    kv.nodes.targets[(ns, "vm")] = b
    kv.nodes.plans[(ns, "vm")] = ["fail"] * 6
    kv.nodes.copy_seconds[(ns, "vm")] = 1
    kv.vm(ns, "vm", a)
    pod = kv.source_pod(ns, "vm")
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, pod.metadata.name)
    assert code == 429 and guard_reason(kv, audit) == "allowed", (code, body, audit.get("annotations"))

    first = wait_for(lambda: (ms := kv.vmims(ns, "vm")) and ms[0].get("status", {}).get("phase") == "Failed" and ms[0],
                     60, "the first attempt to fail")
    # the pod annotation stays through the failed attempt (the VMI is still marked)
    status = kv.vmi(ns, "vm")["status"]
    assert status.get("evacuationNodeName") == a, status
    annotations = kv.source_pod(ns, "vm").metadata.annotations or {}
    assert annotations.get(EVICTION_IN_PROGRESS) == "true", annotations
    capture("vmi-marked-after-failed-attempt", kv.vmi(ns, "vm"))
    capture("pod-virt-launcher-source-after-failed-attempt", kv.source_pod(ns, "vm"))
    # the retry: the evacuation controller wakes on a Node, VMI or VMIM update (not on pods), so after the failed
    # target pod ended it creates the next VMIM at virt-handler's next heartbeat at the latest (60 to 132 s)
    wait_for(lambda: len(kv.vmims(ns, "vm")) >= 2, 240, "the evacuation controller's retry")
    failed, retry = kv.vmims(ns, "vm")[:2]
    capture("vmim-evacuation-failed", failed)
    capture("vmim-evacuation-retry", retry)
    # ... and virt-controller's backoff holds it until 20 s after the first failure
    failed_at = phase_time(first, "Failed")
    scheduling = wait_for(lambda: phase_time(kv.vmims(ns, "vm")[1], "Scheduling"), 90, "the retry to be scheduled")
    waited = (scheduling - failed_at).total_seconds()
    assert waited >= 19, f"retry scheduled {waited} s after the failure; virt-controller's backoff is 20 s"
    held = bool(kv.events(ns, "vm", "MigrationBackoff"))
    # the canceller: after the second failure the evacuation is stuck; the guard PUTs evacuate/cancel, virt-api
    # patches the mark away
    wait_for(lambda: not kv.vmi(ns, "vm")["status"].get("evacuationNodeName"), 120,
             "the canceller to clear the mark through virt-api")
    # The mark goes while virt-api answers the PUT, the PUT's audit event only once kube-apiserver has passed
    # virt-api's answer on: the event is awaited, not read at once.
    user = kv.installation.username

    def cancels() -> list[dict]:
        return [e for e in kv.cp.audit_events(user) if e["verb"] == "update"
                and e.get("objectRef", {}).get("subresource") == "evacuate" and e["objectRef"].get("name") == "vm"
                and e["objectRef"].get("namespace") == ns]

    def writers() -> list[tuple]:
        """Every write to the VMI (its status included) and every evacuate call: who, what, and the answer."""
        return [(e["user"]["username"], e["verb"], e["objectRef"].get("subresource"), e["responseStatus"]["code"],
                 e.get("stageTimestamp")) for e in kv.cp.audit_events()
                if e.get("verb") in ("update", "patch") and e.get("objectRef", {}).get("resource") ==
                "virtualmachineinstances" and e["objectRef"].get("name") == "vm" and e["objectRef"].get("namespace") == ns]

    try:
        puts = wait_for(cancels, 30, "the guard's PUT of evacuate/cancel in the audit log")
    except AssertionError as e:
        raise AssertionError(f"{e}; the VMI's writers meanwhile: {writers()}") from None
    assert puts[0]["responseStatus"]["code"] == 200 and puts[0]["objectRef"]["apiGroup"] == GROUP, puts
    patches = [e for e in kv.cp.audit_events("system:serviceaccount:kubevirt:kubevirt-apiserver")
               if e["verb"] == "patch" and e.get("objectRef", {}).get("resource") == "virtualmachineinstances"
               and e["objectRef"].get("name") == "vm" and e["objectRef"].get("namespace") == ns]
    assert len(patches) >= 2, f"virt-api's own patches (the mark, then its removal): {writers()}"
    phases = [m.get("status", {}).get("phase") for m in kv.vmims(ns, "vm")]
    assert phases.count("Failed") >= 2, phases
    # virt-controller removes the pod annotation once the VMI is no longer marked
    wait_for(lambda: EVICTION_IN_PROGRESS not in (kv.source_pod(ns, "vm").metadata.annotations or {}), 30,
             "virt-controller to remove eviction-in-progress")
    vmi = kv.vmi(ns, "vm")
    capture("vmi-after-evacuate-cancel", vmi)
    assert vmi["status"]["nodeName"] == a, vmi["status"]
    source = (vmi["metadata"].get("annotations") or {}).get(EVICTION_SOURCE)
    wait_for(lambda: kv.events(ns, "vm", "EvacuationCancelled"), 30, "the guard's EvacuationCancelled Event")

    # KubeVirt leaves kubevirt.io/eviction-source on the VMI after the cancel (only a successful migration removes
    # it); once nothing of the cancelled evacuation runs (a retry created before the cancel still does), the guard
    # removes it, with its own patch
    wait_for(lambda: all(m.get("status", {}).get("phase") in ("Succeeded", "Failed") for m in kv.vmims(ns, "vm")),
             120, "the retry created before the cancel to end")
    wait_for(lambda: EVICTION_SOURCE not in (kv.vmi(ns, "vm")["metadata"].get("annotations") or {}), 30,
             "the guard to remove the stale eviction-source")
    try:
        wait_for(lambda: [e for e in kv.cp.audit_events(user) if e["verb"] == "patch"
                          and e.get("objectRef", {}).get("resource") == "virtualmachineinstances"
                          and e["objectRef"].get("name") == "vm" and e["objectRef"].get("namespace") == ns
                          and e["responseStatus"]["code"] == 200], 30, "the guard's patch of the VMI in the audit log")
    except AssertionError as e:
        raise AssertionError(f"{e}; the VMI's writers: {writers()}") from None
    # a user's eviction then (not the descheduler): virt-api marks the VM again, and this evacuation inherits the
    # cancelled one's failed attempts (the same node, no success since). Had the annotation stayed, the guard would
    # take it for the descheduler's, stuck, and cancel it at its next pass; it must not.
    kv.nodes.plans[(ns, "vm")] = ["hold-start"]
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, kv.source_pod(ns, "vm").metadata.name, descheduler=False)
    assert code == 429 and guard_reason(kv, audit) == "allowed", (code, body, audit.get("annotations"))
    marked = kv.vmi(ns, "vm")
    assert marked["status"].get("evacuationNodeName") == a and EVICTION_SOURCE not in (
        marked["metadata"].get("annotations") or {}), (marked["status"], marked["metadata"].get("annotations"))
    kv.cluster.sync()
    passes = g.metric("kubevirt_eviction_guard_background_passes_total", loop="canceller")
    wait_for(lambda: g.metric("kubevirt_eviction_guard_background_passes_total", loop="canceller") >= passes + 2,
             30, "two canceller passes after the guard saw the user's mark")
    status = kv.vmi(ns, "vm")["status"]
    assert status.get("evacuationNodeName") == a, f"the guard cancelled a user's evacuation: {status}, {writers()}"
    assert len(cancels()) == len(puts), (puts, cancels())
    # done: the user cancels it (virt-api, as an admin would with virtctl); a VMIM already created may still run
    kv.nodes.plans[(ns, "vm")] = ["succeed"]
    for m in kv.nodes.migrations_of(ns, "vm"):
        if m.result is None:
            kv.nodes.set_plan(m, "succeed")
    with kv.cp.admin_http(timeout=10) as http:
        r = http.put(f"/apis/{GROUP}/v1/namespaces/{ns}/virtualmachineinstances/vm/evacuate/cancel",
                     json={"evacuationNodeName": a})
        assert r.status_code == 200, r.text
    _behaviours["stale source"] = (f"{EVICTION_SOURCE} left on the VMI by the cancel, removed by the guard once the "
                                   "evacuation's last attempt ended; a user's eviction afterwards: marked by "
                                   "virt-api without it, not cancelled by the guard over two passes")
    _behaviours["backoff"] = (f"retry VMIM scheduled {waited:.0f} s after the first failure"
                              + (" (held by virt-controller's MigrationBackoff)" if held else
                                 " (created after the 20 s backoff had passed, at a Node update)"))
    _behaviours["cancel"] = ("virt-api evacuate/cancel: the guard's PUT (chart RBAC) authorized by kube-apiserver and "
                             "virt-api, mark removed by virt-api's patch; virt-controller then removed "
                             f"{EVICTION_IN_PROGRESS}; {EVICTION_SOURCE} left on the VMI ({source!r})")
    detail["detail"] = (f"{ns}/vm: {phases.count('Failed')} failed attempts, retry {waited:.0f} s after the first failure, "
                        "eviction-in-progress kept through the failure, cancelled through real evacuate/cancel; the "
                        "stale eviction-source removed by the guard, and a user's eviction after it not cancelled")


@pytest.mark.check("real kubevirt")
def test_kubectl_drain_moves_a_vm_through_real_kubevirt(kv, detail):
    """``kubectl drain``: cordon, then evictions; the guard lets the drain through, virt-api turns each eviction
    into an evacuation (429, kubectl retries every 5 s), KubeVirt migrates the VM away, and the completed source
    pod's eviction passes (KubeVirt lets a completed pod go): the node drains."""
    ns = kv.cluster.fresh_namespace("drain")
    a, b = kv.node("src"), kv.node("dst")
    kv.nodes.targets[(ns, "vm")] = b
    kv.vm(ns, "vm", a)
    kv.cluster.sync()
    cp = kv.cp
    out = subprocess.run([str(cp.bin / "kubectl"), "--kubeconfig", str(cp.admin_kubeconfig), "drain", a,
                          "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s"],
                         capture_output=True, text=True, timeout=180)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert f'Eviction triggered evacuation of VMI "{ns}/vm"' in text and f"node/{a} drained" in text, text
    vmi = kv.vmi(ns, "vm")
    assert vmi["status"]["nodeName"] == b
    (vmim,) = kv.vmims(ns, "vm")
    assert vmim["metadata"]["annotations"][EVACUATION] == a and vmim["status"]["phase"] == "Succeeded"
    _behaviours["drain"] = "kubectl drain: virt-api's 429 per eviction, KubeVirt migrated the VM, node drained"
    detail["detail"] = f"kubectl drain {a}: VM {ns}/vm migrated to {b} by KubeVirt; node drained"


@pytest.mark.check("real kubevirt")
def test_real_kubevirt_summary(kv, detail):
    """Last: the summary of what came from KubeVirt's code in this session (the check's detail)."""
    from tests.e2e.kubevirt import KubeVirt

    info = KubeVirt.summary()
    assert info and info["version"] and info["version_from"] == "virt-api", info
    assert not kv.nodes.errors, kv.nodes.errors[:5]
    assert kv.kubevirt.api.alive() and kv.kubevirt.controller.alive()
    detail["detail"] = (f"KubeVirt {info['version']} ({info['git_commit']}) virt-api and virt-controller from the Go "
                        "module proxy; from KubeVirt's code: " + "; ".join(f"{k}: {v}" for k, v in _behaviours.items()))
