"""The node budget against the watch's lag, on the real API server.

KubeVirt marks a VMI for evacuation while it answers the descheduler's eviction, and the descheduler sends its
next eviction from the same node as soon as that answer is back. Here the mark is written through the API server
and the second eviction sent the moment the write returns, before the guard's watch may have delivered it. The
guard reads the node's VMIs again before it lets a descheduler eviction go (app/cluster/fresh.py), so every second
eviction must be refused; ``leaver_reads_total{result="changed"}`` counts the times the watch had not yet brought
the mark, which is how often the store alone would have let a second VM leave.

Twice: with the session's guard (idle loopback API server: the watch is usually first), and with a guard whose
connection to the same API server lags (``tests/e2e/lag.py``), as a busy API server's watch does, so that the
window is open every time.
"""

from __future__ import annotations

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.guard import GuardProcess
from tests.e2e.lag import LaggingProxy

TRIALS = 20
LAG = 0.5
CHANGED = ("kubevirt_eviction_guard_leaver_reads_total", {"result": "changed"})


def race(cluster: Cluster, guard: GuardProcess, hook: str) -> tuple[list[tuple[int, str]], int]:
    """``TRIALS`` nodes with two VMs each: mark the first, evict the second at once. (answers, reads that changed)"""
    ns = cluster.fresh_namespace("race")
    pairs = []
    for _ in range(TRIALS):
        node = cluster.fresh_node()
        pairs.append((node, cluster.vm(ns, cluster.unique("first"), node), cluster.vm(ns, cluster.unique("second"), node)))
    cluster.sync(guard, timeout=60)
    changed_before = guard.metric(CHANGED[0], **CHANGED[1])
    answers = []
    for node, first, second in pairs:
        cluster.objects.patch_vmi(ns, first.name, {"status": {"evacuationNodeName": node}})  # KubeVirt's mark
        code, body = cluster.evict(ns, second.pod_name, descheduler=True)
        answers.append((code, body.get("message", "")))
    refused = [a for a in answers if a[0] == 429 and a[1].startswith(f'admission webhook "{hook}" denied the request: node "')
               and "already has 1 VM(s) leaving" in a[1]]
    assert len(refused) == TRIALS, [a for a in answers if a not in refused]
    return answers, int(guard.metric(CHANGED[0], **CHANGED[1]) - changed_before)


@pytest.mark.check("node budget against the watch's lag")
def test_a_second_eviction_right_after_a_mark_is_refused(cluster, guard, installation, control_plane, detail):
    hook = installation.webhook_name
    _, idle = race(cluster, guard, hook)
    host, _, port = control_plane.url.removeprefix("https://").partition(":")
    proxy = LaggingProxy((host, int(port)), LAG).start()
    lagging = GuardProcess(installation, name="lagging")
    lagging.kubeconfig.write_text(lagging.kubeconfig.read_text().replace(control_plane.url, f"https://127.0.0.1:{proxy.port}"))
    guard.stop()
    try:
        lagging.start()
        _, late = race(cluster, lagging, hook)
    finally:
        lagging.stop()
        proxy.stop()
        guard.start()
    assert late >= 1, "the lagging watch never let an eviction arrive before the mark: the check measured nothing"
    detail["detail"] = (f"{TRIALS} of {TRIALS} second evictions refused node_busy, twice; the guard's store had not yet "
                        f"seen the mark in {idle} of {TRIALS} on the idle API server and in {late} of {TRIALS} with its "
                        f"connection lagging {LAG:g} s (the fresh read of the node's VMIs refused those)")
