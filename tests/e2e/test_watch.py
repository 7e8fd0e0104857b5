"""The guard's watches against a kube-apiserver that dies, restarts, and forgets history.

Both checks restart the session's API server (same port, same etcd); they leave it running and the guard fresh.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.cluster import eventually

KINDS = ("vmi", "vmim", "pod", "node")
OUTAGE = 12.0  # seconds kube-apiserver stays dead: the guard's retries back off to 6-13 s meanwhile


def reason_of(cluster, hook: str, namespace: str, pod: str) -> tuple[int, str | None]:
    """A descheduler dry-run eviction of ``pod``: (HTTP status, the guard's reason from the audit log)."""
    n = cluster.evictions_audited(namespace, pod)
    code, _ = cluster.evict(namespace, pod, dry_run=True, descheduler=True)
    audit = cluster.audit_of_eviction(namespace, pod, after=n)
    return code, audit.get("annotations", {}).get(f"{hook}/reason")


def listed_lines(guard, kind: str) -> int:
    return len([d for d in guard.logs() if d.get("msg") == "listed" and d.get("kind") == kind])


@pytest.mark.check("watch survives api server restart")
def test_guard_survives_a_kube_apiserver_crash_and_never_decides_on_the_old_state(cluster, guard, installation,
                                                                                   control_plane, detail):
    """SIGKILL kube-apiserver, restart it on the same port, mark a VMI for evacuation the moment it is back, and
    evict: every answer is the fail-open ``cache_stale`` or the new state's ``evacuation_pending``, never the
    ``allowed`` of the VMI from before the restart. Meanwhile the guard stays ready and names its stale kinds
    (/readyz), and it relists every kind once the API server answers."""
    hook = installation.webhook_name
    ns = cluster.fresh_namespace("restart")
    node = cluster.fresh_node()
    vm = cluster.vm(ns, "v", node)
    cluster.sync()
    assert reason_of(cluster, hook, ns, vm.pod_name) == (201, "allowed")
    lists = {k: listed_lines(guard, k) for k in KINDS}
    broken = {k: guard.metric("kubevirt_eviction_guard_watch_restarts_total", kind=k, cause="connection")
              for k in KINDS}

    control_plane.stop_apiserver(signal.SIGKILL)
    killed = time.monotonic()
    ready = eventually(lambda: (r := guard.readyz())[0] == 200 and set(r[1]["stale"]) == set(KINDS) and r, 20,
                       "the guard to report every kind stale")
    assert ready[1]["ready"] is True  # readiness stays: the webhook keeps answering (failing open)
    time.sleep(max(0.0, killed + OUTAGE - time.monotonic()))  # long enough for the loops' backoff to grow
    control_plane.start_apiserver()
    back = time.monotonic()
    cluster.objects.patch_vmi(ns, "v", {"status": {"evacuationNodeName": node}})
    answers = []
    while not answers or answers[-1][1] != "evacuation_pending":
        assert time.monotonic() - back < 20, f"no decision on the new state 20 s after the restart: {answers}"
        answers.append(reason_of(cluster, hook, ns, vm.pod_name))
    fresh_after = time.monotonic() - back
    assert set(answers) <= {(201, "cache_stale"), (429, "evacuation_pending")}, answers
    eventually(lambda: guard.readyz() == (200, {"ready": True, "stale": []}), 20, "every kind to be fresh again")
    for k in KINDS:
        assert guard.metric("kubevirt_eviction_guard_watch_restarts_total", kind=k, cause="connection") > broken[k]
        # the log is written in batches off the request path: wait for the line, do not race the writer
        eventually(lambda: listed_lines(guard, k) > lists[k], 10, f"{k} to be relisted after the restart")
    stale_answers = sum(1 for a in answers if a[1] == "cache_stale")
    detail["detail"] = (f"SIGKILL kube-apiserver: /readyz stayed 200 listing {sorted(ready[1]['stale'])} stale; "
                        f"restarted after {back - killed:.1f} s; VMI marked at once; {len(answers)} evictions: "
                        f"{stale_answers} cache_stale then evacuation_pending {fresh_after:.1f} s after the restart, "
                        "never the pre-restart 'allowed'; every kind relisted")


@pytest.mark.check("410 relist")
def test_a_resume_from_compacted_history_gets_410_and_the_guard_relists(cluster, guard, installation,
                                                                      control_plane, detail):
    """The guard's watches end cleanly (kube-apiserver's graceful shutdown) while the guard is paused (SIGSTOP:
    a process that could not read its sockets, as in a long GC pause or a frozen node); the API server restarts,
    objects change through it, and etcd is compacted past the guard's resourceVersion. Resumed, the guard asks to
    watch from that version: neither the restarted API server's watch cache nor etcd holds that history, and the
    real server answers 410 Expired. The guard relists and decides on the new state."""
    hook = installation.webhook_name
    ns = cluster.fresh_namespace("relist")
    node, other = cluster.fresh_node(), cluster.fresh_node()
    vm = cluster.vm(ns, "v", node)
    gone = cluster.vm(ns, "gone", other)
    cluster.sync()
    assert reason_of(cluster, hook, ns, vm.pod_name) == (201, "allowed")
    assert reason_of(cluster, hook, ns, gone.pod_name) == (201, "allowed")
    expired = {k: guard.metric("kubevirt_eviction_guard_watch_restarts_total", kind=k, cause="expired") for k in KINDS}
    lines = len(guard.logs())

    guard.pause()
    try:
        control_plane.stop_apiserver(signal.SIGTERM)  # ends every open watch cleanly, then exits
        # the restarted API server's watch cache then starts past every kind's last resourceVersion; else a kind
        # whose last event was the newest write resumes from exactly where the cache starts and needs no relist
        # (seen with kube-apiserver 1.30: the pod watch resumed, no 410)
        control_plane.bump_etcd_revision()
        control_plane.start_apiserver()
        cluster.objects.patch_vmi(ns, "v", {"status": {"evacuationNodeName": node}})
        cluster.objects.custom.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances",
                                                               "gone")
        compacted = control_plane.compact_etcd()
    finally:
        guard.resume()

    def relisted_since_resume() -> dict[str, int]:
        """The four kinds' relists (the KubeVirt CR's watch may relist too, when its backoff from the restart check
        ends in this window: not what this check is about)."""
        return {d["kind"]: int(d["resource_version"]) for d in guard.logs()[lines:] if d.get("msg") == "listed"
                and d.get("kind") in KINDS}

    eventually(lambda: set(relisted_since_resume()) == set(KINDS), 30, "every kind to be relisted")
    assert min(relisted_since_resume().values()) >= compacted
    # what the real server answered each resume: 410, or (a CRD's watch cache being built on first use) 429
    # every answer per kind: a kind may get its 410, then a 429 while the restarted server's cache is rebuilt
    answered: dict[str, list[str]] = {}
    for d in guard.logs()[lines:]:
        if d.get("kind") in KINDS and (d.get("msg") == "resourceVersion expired; relisting"
                                       or d.get("cause") == "throttled"):
            answered.setdefault(d["kind"], []).append(d.get("why") or d["msg"])
    gone_410 = {k: whys for k, whys in answered.items()
                if any("too old resource version" in why or why.startswith("410") for why in whys)}
    restarts = [(d.get("kind"), d.get("cause"), d.get("msg")) for d in guard.logs()[lines:] if d.get("kind") in KINDS
                and d.get("msg") != "listed"]
    assert gone_410, f"no 410 from the real server: {answered}; the watches' log since the pause: {restarts}"
    for k in gone_410.keys() & set(KINDS):  # (the KubeVirt CR's watch may get its 410 too: counted under its own kind)
        assert guard.metric("kubevirt_eviction_guard_watch_restarts_total", kind=k, cause="expired") > expired[k]
    eventually(lambda: guard.readyz() == (200, {"ready": True, "stale": []}), 20, "every kind to be current")
    assert reason_of(cluster, hook, ns, vm.pod_name) == (429, "evacuation_pending")
    assert reason_of(cluster, hook, ns, gone.pod_name) == (201, "vmi_not_found")
    detail["detail"] = (f"guard paused across a graceful kube-apiserver restart, objects changed, etcd compacted at "
                        f"revision {compacted}; on resume the real server answered {answered}; all 4 kinds relisted "
                        f"at resourceVersion >= {compacted}; decisions follow the new state (evacuation_pending, "
                        "vmi_not_found)")
