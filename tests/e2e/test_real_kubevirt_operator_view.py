"""What an operator sees, on real KubeVirt 1.8.3 with its defaults (``MigrationPriorityQueue`` off: VMIMs carry no
``spec.priority``; virt-handler, the actor, removes ``kubevirt.io/eviction-source`` when a migration succeeds).

- "cause of each move": a descheduler move, a user's migration (a VMIM created through the API, as ``virtctl
  migrate`` does) and a drain are told apart after they finished, by ``report -o json`` and by
  ``migrations_total{cause}``, from the cause the guard recorded on each evacuation VMIM while it ran.
- "external evacuation": a VM with ``evictionStrategy: External`` marked by virt-api does not hold its node.
- "failing evacuation visible": a drain's evacuation whose every attempt fails raises the ``EvacuationFailing``
  Event and the chart's alert (a real Prometheus scraping the guard, with the chart's rules), and is not cancelled.

Shares the session's real-KubeVirt control plane (the ``kubevirt`` group) with test_real_kubevirt.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.e2e.controlplane import ROOT
from tests.e2e.guard_prometheus import GuardPrometheus
from tests.e2e.kubevirt import GROUP, wait_for

EVICTION_SOURCE = "kubevirt.io/eviction-source"
CAUSE = "kubevirt-eviction-guard.io/cause"
MIGRATIONS = "kubevirt_eviction_guard_migrations_total"

pytestmark = pytest.mark.timeout(600)


FAILING_FOR = "20s"  # the alert's `for` in these tests (the chart's default is 5m)


@pytest.fixture(scope="module")
def kv(real_kubevirt):
    return real_kubevirt


@pytest.fixture(scope="module")
def prometheus(kv, tmp_path_factory):
    """A real Prometheus scraping the live guard, with the chart's PrometheusRule groups."""
    from tests.test_chart import FULLNAME, MONITORING, NS, one, render
    from tests.values import merge

    values = merge(MONITORING, {"metrics": {"prometheusRule": {"rules": {"evacuationFailing": {"for": FAILING_FOR}}}}})
    groups = one(render(values), "PrometheusRule")["spec"]["groups"]
    p = GuardPrometheus(tmp_path_factory.mktemp("guard-prometheus"), f"{kv.guard.host}:{kv.guard.metrics_port}",
                        FULLNAME, NS, groups)
    try:
        p.wait_until_scraping()
        yield p
    finally:
        p.stop()


def cli(kv, *args: str) -> tuple[int, str, str]:
    run = subprocess.run([sys.executable, "-m", "app", *args, "--kubeconfig", str(kv.cp.admin_kubeconfig)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout, run.stderr


def evict(kv, namespace: str, pod: str, *, descheduler: bool = True) -> tuple[int, dict, dict]:
    """An eviction through the API server: (code, Status body, its audit event with the webhooks' annotations)."""
    c = kv.cluster
    before = c.evictions_audited(namespace, pod)
    code, body = c.evict(namespace, pod, descheduler=descheduler)
    return code, body, c.audit_of_eviction(namespace, pod, after=before)


def guard_reason(kv, audit: dict) -> str | None:
    return audit.get("annotations", {}).get(f"{kv.installation.webhook_name}/reason")


def counts(kv) -> dict[str, float]:
    return {c: kv.guard.metric(MIGRATIONS, cause=c, outcome="succeeded")
            for c in ("descheduler", "evacuation", "user", "unknown")}


def recorded(kv, ns: str, vm: str) -> str:
    """The guard's cause on the VM's one running evacuation VMIM, once written (while virt-handler holds it)."""
    return wait_for(lambda: next((m["metadata"].get("annotations", {}).get(CAUSE) for m in kv.vmims(ns, vm)
                                  if m["metadata"].get("annotations", {}).get(CAUSE)), None),
                    30, f"the guard's cause annotation on {ns}/{vm}'s VMIM")


def finish(kv, ns: str, vm: str) -> dict:
    (held,) = wait_for(lambda: kv.nodes.migrations_of(ns, vm), 30, f"virt-handler to see {ns}/{vm}'s migration")
    kv.nodes.set_plan(held, "succeed")
    return wait_for(lambda: (ms := kv.vmims(ns, vm)) and ms[-1].get("status", {}).get("phase") == "Succeeded"
                    and ms[-1], 60, f"{ns}/{vm}'s migration to succeed")


@pytest.mark.check("cause of each move")
def test_descheduler_user_and_drain_moves_told_apart_after_they_finished(kv, detail):
    ns = kv.cluster.fresh_namespace("cause")
    a, b, c = kv.node("src"), kv.node("dst"), kv.node("drained")
    for vm, node in (("desched", a), ("user", a), ("drained", c)):
        kv.nodes.targets[(ns, vm)] = b
        kv.nodes.copy_seconds[(ns, vm)] = 1
        kv.nodes.plans[(ns, vm)] = ["hold"]
    kv.vms(ns, [("desched", a, {}), ("user", a, {}), ("drained", c, {})])
    kv.nodes.plans[(ns, "user")] = ["succeed"]
    before = counts(kv)
    kv.cluster.sync()

    # 1. the descheduler's eviction: the guard lets it through, virt-api marks the VMI with the eviction source
    code, _, audit = evict(kv, ns, kv.source_pod(ns, "desched").metadata.name)
    assert code == 429 and guard_reason(kv, audit) == "allowed", audit.get("annotations")
    assert kv.vmi(ns, "desched")["metadata"]["annotations"].get(EVICTION_SOURCE) == "descheduler"
    assert recorded(kv, ns, "desched") == "descheduler"
    moved = finish(kv, ns, "desched")
    assert moved["spec"].get("priority") is None  # KubeVirt 1.8's default: nothing in KubeVirt says who caused it
    assert EVICTION_SOURCE not in (kv.vmi(ns, "desched")["metadata"].get("annotations") or {})  # gone with success

    # 2. a user's migration: a VMIM created through the API (what virtctl migrate does)
    kv.custom.create_namespaced_custom_object(
        "kubevirt.io", "v1", ns, "virtualmachineinstancemigrations",
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
         "metadata": {"name": "by-hand", "namespace": ns}, "spec": {"vmiName": "user"}})
    mine = wait_for(lambda: (ms := kv.vmims(ns, "user")) and ms[-1].get("status", {}).get("phase") == "Succeeded"
                    and ms[-1], 90, "the user's migration to succeed")
    assert CAUSE not in (mine["metadata"].get("annotations") or {})  # not an evacuation: nothing to record

    # 3. kubectl drain of c: the guard lets the drain through, virt-api marks the VMI without an eviction source
    cp = kv.cp
    drain = subprocess.Popen([str(cp.bin / "kubectl"), "--kubeconfig", str(cp.admin_kubeconfig), "drain", c,
                              "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=150s"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert recorded(kv, ns, "drained") == "evacuation"
        finish(kv, ns, "drained")
        out, _ = drain.communicate(timeout=180)
    finally:
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode == 0, out

    # after the fact: report -o json and migrations_total{cause}
    kv.cluster.sync()
    code, out, err = cli(kv, "report", "-o", "json")
    assert code == 0, err
    rows = {(r["vmi"], r["migration"]): r["cause"] for r in json.loads(out)["migrations"] if r["namespace"] == ns}
    by_vm = {vm: {cause for (v, _), cause in rows.items() if v == vm} for vm in ("desched", "user", "drained")}
    assert by_vm == {"desched": {"descheduler"}, "user": {"user"}, "drained": {"evacuation"}}, rows
    after = wait_for(lambda: (n := counts(kv)) and all(n[k] > before[k] for k in ("descheduler", "user",
                                                                                    "evacuation")) and n,
                     30, "migrations_total to count the three moves")
    delta = {k: after[k] - before[k] for k in after}
    assert min(delta["descheduler"], delta["user"], delta["evacuation"]) >= 1, delta
    detail["detail"] = (f"{ns}: KubeVirt 1.8.3 defaults (no VMIM priority; eviction-source removed on success); "
                        f"report -o json causes {by_vm}; migrations_total{{cause}} increases {delta}")


@pytest.mark.check("external evacuation")
def test_an_external_vm_marked_by_virt_api_does_not_hold_its_node(kv, detail):
    """``evictionStrategy: External``: virt-api marks the VM and answers with its background text, and KubeVirt
    migrates nothing (its evacuation controller skips External VMs). The guard does not count such a mark as a
    departure, so the descheduler's next eviction from that node goes through (not ``node_busy``) and KubeVirt
    migrates that VM; ``report`` notes the waiting VM as ``external-evacuation``."""
    ns = kv.cluster.fresh_namespace("external")
    a, b = kv.node("src"), kv.node("dst")
    for vm in ("ext", "other"):
        kv.nodes.targets[(ns, vm)] = b
        kv.nodes.copy_seconds[(ns, vm)] = 1
    kv.vms(ns, [("ext", a, {"eviction_strategy": "External"}), ("other", a, {})])
    kv.cluster.sync()
    code, body, audit = evict(kv, ns, kv.source_pod(ns, "ext").metadata.name)
    text = f'Eviction triggered evacuation of VMI "{ns}/ext"'
    assert code == 429 and text in body["message"] and guard_reason(kv, audit) == "allowed", (body, audit)
    marked = kv.vmi(ns, "ext")
    assert marked["status"]["evacuationNodeName"] == a and marked["spec"]["evictionStrategy"] == "External"
    kv.cluster.sync()

    # the descheduler's next eviction from the same node: the guard lets it through, KubeVirt migrates that VM
    code, body, audit = evict(kv, ns, kv.source_pod(ns, "other").metadata.name)
    assert guard_reason(kv, audit) == "allowed", audit.get("annotations")  # not node_busy
    assert code == 429 and f'Eviction triggered evacuation of VMI "{ns}/other"' in body["message"], body
    (vmim,) = wait_for(lambda: kv.vmims(ns, "other"), 30, "the evacuation VMIM of the other VM")
    wait_for(lambda: kv.vmims(ns, "other")[0].get("status", {}).get("phase") == "Succeeded", 90,
             "the other VM's migration")
    # meanwhile KubeVirt created nothing for the External VM: it is still marked, on its node, waiting
    assert kv.vmims(ns, "ext") == [] and kv.vmi(ns, "ext")["status"]["evacuationNodeName"] == a
    assert kv.vmi(ns, "other")["status"]["nodeName"] == b
    kv.cluster.sync()
    code, out, err = cli(kv, "report", "-o", "json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["vmis"] if r["namespace"] == ns}
    assert "external-evacuation" in rows["ext"]["notes"] and rows["ext"]["externalEvacuation"] == a, rows["ext"]
    # tidy: the mark is the external controller's to act on; none runs here, so cancel it as an admin would
    with kv.cp.admin_http(timeout=10) as http:
        r = http.put(f"/apis/{GROUP}/v1/namespaces/{ns}/virtualmachineinstances/ext/evacuate/cancel",
                     json={"evacuationNodeName": a})
        assert r.status_code == 200, r.text
    detail["detail"] = (f"{ns}: virt-api marked the External VM (429 background text), KubeVirt created no VMIM "
                        f"for it; the descheduler's next eviction from {a} was let through by the guard and "
                        f"KubeVirt migrated that VM ({vmim['metadata']['name']}); report notes external-evacuation")


@pytest.mark.check("failing evacuation visible")
def test_a_drains_failing_evacuation_raises_the_event_and_the_alert_and_is_not_cancelled(kv, prometheus, detail):
    """kubectl drain of a node whose VM's every migration fails: KubeVirt retries it without limit. After
    evacuationStaleAfterFailures (2 here) failed attempts the guard writes ``EvacuationFailing`` on the VMI (count,
    age, cause, ``virtctl evacuate-cancel``), ``failing_evacuations{cause="evacuation"}`` turns 1 and the chart's
    alert fires after its ``for``; the canceller, which runs every 2 s, leaves the drain's evacuation alone."""
    g = kv.guard
    ns = kv.cluster.fresh_namespace("drainfail")
    a, b = kv.node("src"), kv.node("dst")
    kv.nodes.targets[(ns, "vm")] = b
    kv.nodes.copy_seconds[(ns, "vm")] = 1
    kv.nodes.plans[(ns, "vm")] = ["fail"] * 8
    kv.vm(ns, "vm", a)
    kv.cluster.sync()
    cp = kv.cp
    drain = subprocess.Popen([str(cp.bin / "kubectl"), "--kubeconfig", str(cp.admin_kubeconfig), "drain", a,
                              "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=500s"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # KubeVirt's retry waits for its backoff and the evacuation controller's next look at the node (virt-handler's
        # heartbeat, 60 to 132 s)
        wait_for(lambda: sum(1 for m in kv.vmims(ns, "vm") if m.get("status", {}).get("phase") == "Failed") >= 2,
                 300, "two failed attempts of the drain's evacuation")
        second = max(m["metadata"]["creationTimestamp"] for m in kv.vmims(ns, "vm"))
        t0 = time.time()
        (event,) = wait_for(lambda: kv.events(ns, "vm", "EvacuationFailing"), 60,
                            "the guard's EvacuationFailing Event")[:1]
        event_after = time.time() - t0
        assert event.type == "Warning" and f'from node "{a}"' in event.message, event.message
        assert "time(s)" in event.message and f"virtctl evacuate-cancel vmi vm -n {ns}" in event.message, event.message
        assert "caused by a drain or another eviction" in event.message, event.message
        causes = {(m["metadata"].get("annotations") or {}).get(CAUSE) for m in kv.vmims(ns, "vm")}
        assert causes <= {"evacuation", None} and "evacuation" in causes, causes
        assert g.metric("kubevirt_eviction_guard_failing_evacuations", cause="evacuation") >= 1
        firing = wait_for(lambda: [al for al in prometheus.alerts()
                                   if al["labels"].get("alertname") == "KubevirtEvictionGuardEvacuationFailing"
                                   and al["state"] == "firing" and al["labels"].get("cause") == "evacuation"],
                          90, f"the alert to fire (for: {FAILING_FOR})")
        alert_after = time.time() - t0
        # not cancelled: still marked after more canceller passes, and the guard never called evacuate/cancel
        passes = g.metric("kubevirt_eviction_guard_background_passes_total", loop="canceller")
        wait_for(lambda: g.metric("kubevirt_eviction_guard_background_passes_total", loop="canceller") >= passes + 3,
                 30, "three more canceller passes")
        assert kv.vmi(ns, "vm")["status"].get("evacuationNodeName") == a, "the drain's evacuation was cancelled"
        cancels = [e for e in kv.cp.audit_events(kv.installation.username) if e["verb"] == "update"
                   and e.get("objectRef", {}).get("subresource") == "evacuate"
                   and e["objectRef"].get("namespace") == ns]
        assert cancels == [], cancels
    finally:
        drain.kill()
        drain.wait(10)
        kv.nodes.plans[(ns, "vm")] = ["succeed"]
        for m in kv.nodes.migrations_of(ns, "vm"):
            if m.result is None:
                kv.nodes.set_plan(m, "succeed")
        with kv.cp.admin_http(timeout=10) as http:
            http.put(f"/apis/{GROUP}/v1/namespaces/{ns}/virtualmachineinstances/vm/evacuate/cancel",
                     json={"evacuationNodeName": a})
        cp.kubectl("uncordon", a, check=False)
    failures = sum(1 for m in kv.vmims(ns, "vm") if m.get("status", {}).get("phase") == "Failed")
    detail["detail"] = (f"{ns}/vm: kubectl drain {a}, every attempt failed ({failures} Failed VMIMs, the last created "
                        f"{second}); EvacuationFailing Event {event_after:.0f} s and the alert (for {FAILING_FOR}, "
                        f"cause={firing[0]['labels']['cause']}) {alert_after:.0f} s after the second failure was "
                        "seen; not cancelled by the guard")


@pytest.mark.check("dashboard queries")
def test_every_dashboard_panel_returns_data_from_a_real_prometheus_scraping_the_guard(kv, prometheus, detail):
    """Each query of the chart's dashboard, Grafana's variables filled in as Grafana would (``$job`` = the
    release's job, ``$__rate_interval`` = 1m at a 1 s scrape), run against the real Prometheus that has scraped the
    live guard through this module's moves, failures and refusals: every one returns at least one sample."""
    from tests.test_chart import FULLNAME
    from tools.dashboard import OUT

    board = json.loads(OUT.read_text())
    # fresh decisions for the rate() panels: a drain's dry-run eviction of a quiet VM, answered by the guard
    ns = kv.cluster.fresh_namespace("dash")
    a = kv.node("dash")
    kv.vm(ns, "vm", a)
    kv.cluster.sync()
    for _ in range(3):
        kv.cluster.evict(ns, kv.source_pod(ns, "vm").metadata.name, descheduler=False, dry_run=True)
    wait_for(lambda: kv.guard.metric("kubevirt_eviction_guard_vms_in_cooldown") >= 0
             and prometheus.query(f'kubevirt_eviction_guard_vms_in_cooldown{{job="{FULLNAME}"}}'), 60,
             "a pass of the guard's VM walk scraped")
    results: dict[str, list] = {}

    def all_answer() -> bool:
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$job", FULLNAME).replace("$__rate_interval", "1m")
                results[f"{panel['title']} / {target['legendFormat']}"] = prometheus.query(expr)
        return all(results.values())

    try:
        wait_for(all_answer, 60, "every dashboard query to return data")
    except AssertionError:
        empty = [k for k, v in results.items() if not v]
        raise AssertionError(f"dashboard queries without data: {empty}") from None
    nan = sorted(k for k, v in results.items() if all(s["value"][1] == "NaN" for s in v))
    detail["detail"] = (f"{len(results)} queries of {len(board['panels'])} panels all returned data from a real "
                        f"Prometheus scraping the live guard" + (f"; NaN (no traffic in the window): {nan}" if nan else ""))
