"""Kubernetes' declarative eviction API beside the guard: a kube-apiserver of its own with the alpha
``EvictionRequestAPI`` feature gate and the ``lifecycle.k8s.io/v1alpha1`` API on (both off by default in 1.37:
pkg/features/kube_features.go ``EvictionRequestAPI: {Version 1.37, Default: false, Alpha}``, and the group version
is in pkg/controlplane/instance.go's ``alphaAPIGroupVersionsDisabledByDefault``).

With the gate on, pods may carry ``spec.evictionResponders`` (dropped by the API server while the gate is off,
pkg/api/pod/util.go ``dropDisabledEvictionResponders``), and ``EvictionRequest`` and ``Eviction`` objects are served.
1.37's kube-controller-manager has no evictionrequest-controller, and none runs here: no Eviction is made from a
request, so no ``pods/eviction`` call comes of one. What is checked: the guard judges launcher pods that carry
responders exactly as those without, and ``explain``/``report`` list the requests for a launcher pod as pending, with
their requester; on an API server without the API they say nothing and fail nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.controlplane import ROOT, ControlPlane
from tests.e2e.guard import GuardProcess, Installation, install_chart
from tests.e2e.objects import migration_state

GATES = ("--feature-gates=EvictionRequestAPI=true", "--runtime-config=lifecycle.k8s.io/v1alpha1=true")
RESPONDERS = [{"name": "kubevirt.io/live-migration", "priority": 10000}]
REQUESTER = "descheduler.example.io/balance"


@pytest.fixture(scope="module")
def gated(binaries: Path, e2e_dir: Path) -> Iterator[tuple[ControlPlane, Installation, GuardProcess, Cluster]]:
    cp = ControlPlane(e2e_dir / "eviction-request-api", binaries, extra_args=GATES).start()
    guard = None
    try:
        cp.install_crds()
        inst = install_chart(cp, e2e_dir / "eviction-request-api" / "chart", values={})
        guard = GuardProcess(inst, ("--event-interval=2s",)).start()
        yield cp, inst, guard, Cluster(cp, guard)
    finally:
        if guard is not None:
            guard.stop()
        cp.stop()


def _vm(cluster: Cluster, ns: str, name: str, node: str, responders: bool, **vmi_kw) -> dict:
    vmi = cluster.objects.vmi(ns, name, node, **vmi_kw)
    return cluster.objects.launcher_pod(ns, vmi, node, spec={"evictionResponders": RESPONDERS} if responders else None)


def _raw_pod(cp: ControlPlane, ns: str, name: str) -> dict:
    return json.loads(cp.kubectl("-n", ns, "get", "pod", name, "-o", "json").stdout)


def _cli(cp: ControlPlane, *args: str) -> tuple[int, str, str]:
    run = subprocess.run([sys.executable, "-m", "app", *args, "--kubeconfig", str(cp.admin_kubeconfig)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    return run.returncode, run.stdout, run.stderr


@pytest.mark.check("EvictionRequest API: responders judged as before")
def test_launcher_pods_with_eviction_responders_are_judged_as_before(gated, detail):
    cp, inst, guard, cluster = gated
    with cp.admin_http(timeout=10) as c:
        served = {r["name"] for r in c.get("/apis/lifecycle.k8s.io/v1alpha1").json()["resources"]}
    assert {"evictionrequests", "evictions"} <= served, served
    ns = cluster.fresh_namespace("responders")
    src = cluster.fresh_node()
    seen = {}
    for responders in (False, True):
        node = cluster.fresh_node()
        quiet = _vm(cluster, ns, f"quiet-{int(responders)}", node, responders)
        there = cluster.fresh_node()
        cool = _vm(cluster, ns, f"cool-{int(responders)}", there, responders,
                   migration=migration_state(src, there, started=9, ended=5))
        for pod in (quiet, cool):
            stored = _raw_pod(cp, ns, pod["metadata"]["name"])["spec"].get("evictionResponders")
            assert stored == (RESPONDERS if responders else None), stored
        cluster.sync()
        for what, pod in (("quiet", quiet), ("cooldown", cool)):
            for dry_run in (True, False) if what == "cooldown" else (True,):
                code, body = cluster.evict(ns, pod["metadata"]["name"], descheduler=True, dry_run=dry_run)
                reason = cluster.audit_of_eviction(ns, pod["metadata"]["name"])["annotations"].get(
                    f"{inst.webhook_name}/reason")
                seen[(what, dry_run, responders)] = (code, reason)
    for what, dry_run, _ in [k for k in seen if not k[2]]:
        assert seen[(what, dry_run, True)] == seen[(what, dry_run, False)], seen
    assert seen[("quiet", True, True)] == (201, "allowed"), seen
    assert seen[("cooldown", False, True)] == (429, "cooldown"), seen
    detail["detail"] = (f"kube-apiserver with {' '.join(GATES)}: lifecycle.k8s.io/v1alpha1 serves "
                        f"{', '.join(sorted(served))}; launcher pods with spec.evictionResponders {RESPONDERS} kept by "
                        "the API server and judged as those without: " + ", ".join(
                            f"{w}{' dry-run' if d else ''} {seen[(w, d, True)][0]} {seen[(w, d, True)][1]}"
                            for w, d, r in seen if r))


@pytest.mark.check("EvictionRequest API: explain and report list pending requests")
def test_explain_and_report_list_eviction_requests(gated, control_plane, detail):
    cp, inst, guard, cluster = gated
    ns = cluster.fresh_namespace("requested")
    node = cluster.fresh_node()
    pod = _vm(cluster, ns, "requested", node, True)
    other = _vm(cluster, ns, "untouched", cluster.fresh_node(), False)
    name = pod["metadata"]["name"]
    request = {"apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "EvictionRequest",
               "metadata": {"name": f"{name}-balance", "namespace": ns},
               "spec": {"target": {"pod": {"name": name, "uid": pod["metadata"]["uid"]}},
                        "requester": REQUESTER, "intent": "Eviction"}}
    cp.kubectl("create", "-f", "-", input=json.dumps(request))
    live = json.loads(cp.kubectl("-n", ns, "get", "evictionrequests.lifecycle.k8s.io", f"{name}-balance",
                                 "-o", "json").stdout)
    assert live["spec"]["requester"] == REQUESTER and not live.get("status", {}).get("conditions"), live

    code, out, err = _cli(cp, "explain", "-o", "json", "-n", ns, "--pod", name)
    assert code in (0, 1), err
    listed = json.loads(out)["evictionRequests"]
    assert [(r["name"], r["requester"], r["pending"]) for r in listed] == [(f"{name}-balance", REQUESTER, True)]
    code, text, err = _cli(cp, "explain", "-n", ns, "--pod", name)
    assert f"{name}-balance: requester {REQUESTER}, pending" in text, text
    code, out, err = _cli(cp, "explain", "-o", "json", "-n", ns, "--pod", other["metadata"]["name"])
    assert json.loads(out)["evictionRequests"] == [], out
    code, out, err = _cli(cp, "report", "-o", "json")
    assert code == 0, err
    model = json.loads(out)
    mine = [r for r in model["evictionRequests"] if r["namespace"] == ns]
    assert [(r["vmi"], r["pod"], r["requester"]) for r in mine] == [("requested", name, REQUESTER)], mine
    (row,) = [r for r in model["vmis"] if r["namespace"] == ns and r["name"] == "requested"]
    assert "eviction-requested" in row["notes"]

    # withdrawn: no longer pending, and report no longer lists it
    cp.kubectl("-n", ns, "patch", "evictionrequests.lifecycle.k8s.io", f"{name}-balance", "--type=merge",
               "-p", json.dumps({"spec": {"intent": "Withdrawn"}}))
    code, out, err = _cli(cp, "explain", "-o", "json", "-n", ns, "--pod", name)
    assert [(r["intent"], r["pending"]) for r in json.loads(out)["evictionRequests"]] == [("Withdrawn", False)]
    code, out, err = _cli(cp, "report", "-o", "json")
    assert not [r for r in json.loads(out)["evictionRequests"] if r["namespace"] == ns]

    # the session's API server (the API off): nothing said, nothing failed
    plain = Cluster(control_plane)
    pns = plain.fresh_namespace("no-lifecycle-api")
    plain_pod = _vm(plain, pns, "plain", plain.fresh_node(), True)
    assert "evictionResponders" not in _raw_pod(control_plane, pns, plain_pod["metadata"]["name"])["spec"]
    code, out, err = _cli(control_plane, "explain", "-o", "json", "-n", pns, "--pod", plain_pod["metadata"]["name"])
    assert code in (0, 1) and json.loads(out)["evictionRequests"] is None, (out, err)
    code, text, err = _cli(control_plane, "explain", "-n", pns, "--pod", plain_pod["metadata"]["name"])
    assert "eviction requests" not in text and err == "", (text, err)
    code, out, err = _cli(control_plane, "report", "-o", "json")
    assert code == 0 and json.loads(out)["evictionRequests"] is None and err == "", err
    detail["detail"] = (f"EvictionRequest {ns}/{name}-balance (requester {REQUESTER}, intent Eviction, no status: no "
                        "controller) listed by explain and report as pending for VMI requested; once Withdrawn, not "
                        "pending; on the API server without the API: evictionRequests null, nothing printed, exit as "
                        "before; spec.evictionResponders dropped there")
