"""What the guard writes and how it counts, in front of real KubeVirt: Events, the ``eviction-in-progress``
annotation, the node budget against the watch's lag. Every mark here is virt-api's, written by its eviction admitter
while it answered a real eviction; every migration is KubeVirt's.

- Events: an allowed descheduler eviction becomes virt-api's mark and KubeVirt's migration, and only then the
  guard's ``EvictionAllowed``; denials of the VM in its cooldown afterwards are one ``EvictionBlocked``, counted up.
- The annotation: virt-controller (v1.7+) puts ``eviction-in-progress: "true"`` on a marked VM's pod itself, so the
  guard's rule-7 denial finds it there and writes nothing (what its job does when the patch is needed, a
  resourceVersion-tested JSON patch, is shown on the played control plane: tests/e2e/test_side_effects.py, because
  v1.8's virt-controller never leaves a marked VM's ready pod without it for long enough).
- The node budget: virt-api marks the first VM of a node while it answers the descheduler, and the descheduler's
  next eviction from that node follows at once; the guard must refuse it whether or not its watch has brought the
  mark, with its own connection idle and lagging (tests/e2e/lag.py).

Most of its time is the race's 16 VMs and two guards.
"""

from __future__ import annotations

import pytest

from tests.e2e.guard import GuardProcess
from tests.e2e.kubevirt import wait_for
from tests.e2e.lag import LaggingProxy
from tests.e2e.test_real_kubevirt import EVICTION_IN_PROGRESS, evict, guard_reason, kv  # noqa: F401 - kv: fixture

pytestmark = pytest.mark.timeout(600)
SIDE_EFFECTS = "kubevirt_eviction_guard_side_effects_total"


def guard_writes(kv, verb: str, resource: str, namespace: str, name: str | None = None) -> list[dict]:
    return [e for e in kv.cp.audit_events(kv.installation.username) if e.get("verb") == verb
            and e.get("objectRef", {}).get("resource") == resource and not e["objectRef"].get("subresource")
            and e["objectRef"].get("namespace") == namespace and (name is None or e["objectRef"].get("name") == name)]


@pytest.mark.check("event")
def test_events_from_a_real_evacuation_and_the_cooldown_after_it(kv, detail):
    ns = kv.cluster.fresh_namespace("real-events")
    a, b = kv.node("src"), kv.node("dst")
    kv.nodes.targets[(ns, "vm")] = b
    kv.nodes.copy_seconds[(ns, "vm")] = 1
    vmi = kv.vm(ns, "vm", a)
    kv.cluster.sync()
    code, _, audit = evict(kv, ns, kv.source_pod(ns, "vm").metadata.name)
    assert code == 429 and guard_reason(kv, audit) == "allowed"
    # written once the guard's watch shows the migration virt-api's mark started, never on the review's word
    (allowed,) = wait_for(lambda: kv.events(ns, "vm", "EvictionAllowed"), 30, "the EvictionAllowed Event")
    assert allowed.type == "Normal" and allowed.count == 1 and allowed.message.startswith("Eviction of pod ")
    assert allowed.involved_object.uid == vmi["metadata"]["uid"]
    wait_for(lambda: kv.vmi(ns, "vm")["status"].get("nodeName") == b and kv.source_pod(ns, "vm"), 60,
             "KubeVirt to move the VM")
    kv.cluster.sync()
    pod = kv.source_pod(ns, "vm").metadata.name
    for _ in range(3):
        code, body, audit = evict(kv, ns, pod)
        assert code == 429 and guard_reason(kv, audit) == "cooldown", body
    event = wait_for(lambda: [e for e in kv.events(ns, "vm", "EvictionBlocked") if e.count == 3], 20,
                     "the EvictionBlocked Event's count to reach 3")[0]
    assert event.type == "Warning" and event.involved_object.kind == "VirtualMachineInstance"
    assert event.source.component == "kubevirt-eviction-guard"
    assert event.message.startswith(f"Eviction of pod {pod} denied (cooldown): VMI \"{ns}/vm\" is in migration "
                                    "cooldown"), event.message
    created = guard_writes(kv, "create", "events", ns)
    assert [e["responseStatus"]["code"] for e in created] == [201, 201], created  # EvictionAllowed, EvictionBlocked
    out = kv.cp.kubectl("-n", ns, "describe", "vmi", "vm").stdout
    assert "EvictionBlocked" in out and "EvictionAllowed" in out and "SuccessfulCreate" in out, out
    detail["detail"] = (f"real KubeVirt: {ns}/vm evicted by the descheduler, virt-api marked it, KubeVirt migrated it "
                        f"{a} -> {b}: EvictionAllowed (Normal) once the migration showed; then 3 denials in its "
                        "cooldown: one EvictionBlocked (Warning), count 3; kubectl describe vmi shows them beside "
                        "KubeVirt's own Events")


@pytest.mark.check("annotation patch")
def test_virt_controller_annotates_the_marked_pod_and_the_guard_adds_nothing(kv, detail):
    """A VM with ``evictionStrategy: External``: virt-api marks it and KubeVirt's evacuation controller leaves it to
    someone else, so it stays marked without a migration (rule 7). virt-controller puts the annotation on its pod;
    the guard's rule-7 denials find it there: no patch of its own."""
    g = kv.guard
    ns = kv.cluster.fresh_namespace("real-annot")
    node = kv.node("ext")
    kv.vm(ns, "ext", node, eviction_strategy="External")
    pod = kv.source_pod(ns, "ext").metadata.name
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, pod)
    assert code == 429 and guard_reason(kv, audit) == "allowed", body
    assert kv.vmi(ns, "ext")["status"]["evacuationNodeName"] == node and not kv.vmims(ns, "ext")
    wait_for(lambda: (kv.source_pod(ns, "ext").metadata.annotations or {}).get(EVICTION_IN_PROGRESS) == "true", 30,
             "virt-controller's annotation")
    kv.cluster.sync()
    before = g.metric(SIDE_EFFECTS, kind="annotation", outcome="applied")
    for descheduler in (True, False):
        code, body, audit = evict(kv, ns, pod, descheduler=descheduler)
        assert code == 429 and guard_reason(kv, audit) == "evacuation_pending", body
    assert guard_writes(kv, "patch", "pods", ns) == []
    assert g.metric(SIDE_EFFECTS, kind="annotation", outcome="applied") == before
    writers = {e["user"]["username"] for e in kv.cp.audit_events() if e.get("verb") == "patch"
               and e.get("objectRef", {}).get("resource") == "pods" and e["objectRef"].get("namespace") == ns
               and e["objectRef"].get("name") == pod and not e["objectRef"].get("subresource")}
    assert writers == {"system:serviceaccount:kubevirt:kubevirt-controller"}, writers
    kv.custom.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", "ext")
    detail["detail"] = ("real KubeVirt: virt-api marked an External VM (no migration), virt-controller patched "
                        f"{EVICTION_IN_PROGRESS}: \"true\" onto its pod; the guard's two rule-7 denials found it and "
                        "patched nothing")


TRIALS = 4
LAG = 0.5
LEAVER_READS = "kubevirt_eviction_guard_leaver_reads_total"


def race(kv, guard: GuardProcess) -> dict[str, float]:
    """``TRIALS`` nodes with two VMs each: the descheduler evicts the first (virt-api marks it while it answers,
    and KubeVirt starts moving it), then at once the second. Returns the guard's reads before an
    allow meanwhile, by result (``changed``: they found the mark the guard's store did not have yet)."""
    c = kv.cluster
    ns = c.fresh_namespace("real-race")
    hook = kv.installation.webhook_name
    pairs = [(kv.node("race"), f"first-{i}", f"second-{i}") for i in range(TRIALS)]
    kv.vms(ns, [spec for node, first, second in pairs
                for spec in ((first, node, {}), (second, node, {}))])
    pods = {name: kv.source_pod(ns, name).metadata.name for _, first, second in pairs for name in (first, second)}
    c.sync(guard, timeout=60)
    reads_before = leaver_reads(guard)
    answers = []
    for node, first, second in pairs:
        code, body = c.evict(ns, pods[first], descheduler=True)
        assert code == 429 and "Eviction triggered evacuation" in body.get("message", ""), (guard.dir.name, first, code, body)
        answers.append((node, second, *c.evict(ns, pods[second], descheduler=True)))
    reads = {k: v - reads_before.get(k, 0) for k, v in leaver_reads(guard).items()}
    refused = [a for a in answers if a[2] == 429 and a[3].get("message", "").startswith(
        f'admission webhook "{hook}" denied the request: node "') and "already has 1 VM(s) leaving" in a[3]["message"]]
    got = (f"guard {guard.dir.name}: answers to the second evictions not refused node_busy "
           f"{[(n, s, code, body.get('message')) for n, s, code, body in answers if (n, s, code, body) not in refused]}; "
           f"its reads before an allow meanwhile {reads}; its log on them {read_warnings(guard)}")
    assert len(refused) == TRIALS, got
    marked = {s: kv.vmi(ns, s)["status"].get("evacuationNodeName") for _, _, s in pairs}
    assert not any(marked.values()), (marked, got)
    c.cp.kubectl("-n", ns, "delete", "vmi", "--all", "--wait=false")
    return reads


def leaver_reads(guard: GuardProcess) -> dict[str, float]:
    """The guard's reads before an allow so far, by result (changed, same, failed, over_budget)."""
    return {r: guard.metric(LEAVER_READS, result=r) or 0 for r in ("changed", "same", "failed", "over_budget")}


def read_warnings(guard: GuardProcess) -> list[str]:
    """The guard's log lines on reads before an allow that did not happen or did not finish."""
    try:
        lines = guard.log.read_text(errors="replace").splitlines()
    except OSError as e:
        return [f"no log: {e}"]
    return [ln[:400] for ln in lines if "read the VMIs of node" in ln][-10:]


@pytest.mark.check("node budget against the watch's lag")
def test_a_second_eviction_right_after_virt_apis_mark_is_refused(kv, detail):
    idle_reads = race(kv, kv.guard)
    host, _, port = kv.cp.url.removeprefix("https://").partition(":")
    proxy = LaggingProxy((host, int(port)), LAG).start()
    lagging = GuardProcess(kv.installation, name="lagging")
    lagging.kubeconfig.write_text(lagging.kubeconfig.read_text().replace(kv.cp.url, f"https://127.0.0.1:{proxy.port}"))
    kv.guard.stop()
    try:
        lagging.start()
        late_reads = race(kv, lagging)
    finally:
        lagging.stop()
        proxy.stop()
        kv.guard.start()
    idle, late = int(idle_reads.get("changed", 0)), int(late_reads.get("changed", 0))
    assert late >= 1, (f"the lagging watch never let an eviction arrive before the mark: the check measured nothing "
                       f"(reads before an allow by result: idle {idle_reads}, lagging {late_reads})")
    detail["detail"] = (f"real KubeVirt: virt-api marked the first VM of each of {TRIALS} nodes while answering the "
                        f"descheduler; the second eviction sent at once was refused node_busy {TRIALS} of {TRIALS}, "
                        f"twice; the guard's store lacked the mark in {idle} of {TRIALS} (idle) and {late} of "
                        f"{TRIALS} (connection lagging {LAG:g} s), the fresh read refused those; reads before an "
                        f"allow by result: idle {idle_reads}, lagging {late_reads}")


@pytest.mark.check("canceller through the aggregated api")
def test_the_canceller_probes_real_virt_api_which_refuses_a_drain_and_an_identity_without_the_second_rule(kv, detail):
    """The canceller turns on because real virt-api serves ``evacuate/cancel`` and both of the guard's
    SelfSubjectAccessReviews allow it (its PUT of a stuck evacuation: tests/e2e/test_real_kubevirt.py). Here the two
    refusals that are virt-api's own: a VM on a node with KubeVirt's drain taint (``kubevirt.io/drain``, which makes
    KubeVirt's evacuation controller drain the node) is refused with 400 whoever asks; and an identity with only the
    chart's first rule passes kube-apiserver's authorizer, then virt-api's SubjectAccessReview refuses it (401)."""
    from tests.e2e.test_canceller import _half_token, audited, put_cancel

    cp, user, g = kv.cp, kv.installation.username, kv.guard
    wait_for(lambda: g.metric("kubevirt_eviction_guard_evacuation_canceller_info", enabled="true",
                              reason="enabled") == 1, 30, "the canceller to be on")
    probes = [e for e in cp.audit_events(user) if e.get("objectRef", {}).get("resource") == "selfsubjectaccessreviews"]
    assert len(probes) >= 2 and all(e["responseStatus"]["code"] == 201 for e in probes), probes
    assert any(e["requestURI"] == "/apis/subresources.kubevirt.io/v1" and e["responseStatus"]["code"] == 200
               for e in cp.audit_events(user)), "the guard's discovery of subresources.kubevirt.io/v1"

    ns = kv.cluster.fresh_namespace("real-drain-taint")
    node = kv.node("tainted")
    kv.nodes.targets[(ns, "vm")] = node  # its own node: KubeVirt's drain migration stays queued
    kv.vm(ns, "vm", node)
    kv.cluster.core.patch_node(node, {"spec": {"taints": [{"key": "kubevirt.io/drain", "effect": "NoSchedule"}]}})
    wait_for(lambda: kv.vmims(ns, "vm"), 30, "KubeVirt's evacuation controller to drain the tainted node")
    token = cp.service_account_token(kv.installation.namespace, kv.installation.service_account, seconds=600)
    r = put_cancel(cp, token, ns, "vm", node)
    # virt-api prints the *Taint with its generated String() (evacuate_cancel.go validateEvacuationNode)
    refusal = f'Node "{node}" has NodeDrainTaintKey "&Taint{{Key:kubevirt.io/drain,Value:,Effect:NoSchedule,TimeAdded:<nil>,}}"'
    assert r.status_code == 400 and r.json()["message"] == refusal, r.text
    half = _half_token(cp)
    r = put_cancel(cp, half, ns, "vm", node)
    assert r.status_code == 401, (r.status_code, r.text)
    (passed,) = audited(cp, "system:serviceaccount:default:half-canceller", "update", "virtualmachineinstances", ns,
                        "vm", "evacuate")
    assert passed["annotations"]["authorization.k8s.io/decision"] == "allow", passed["annotations"]
    reviews = [e for e in cp.audit_events("system:serviceaccount:kubevirt:kubevirt-apiserver")
               if e.get("objectRef", {}).get("resource") == "subjectaccessreviews"]
    assert reviews, "virt-api's own SubjectAccessReviews"
    kv.custom.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", "vm")
    detail["detail"] = (f"real virt-api: the guard's canceller on (discovery, 2 SelfSubjectAccessReviews); the guard's "
                        f"token asking to cancel on a node with kubevirt.io/drain:NoSchedule: 400 ({refusal}); an "
                        f"identity with only the first rule: allowed by kube-apiserver, 401 from virt-api's review "
                        f"({len(reviews)} SubjectAccessReviews by virt-api in the audit log)")
