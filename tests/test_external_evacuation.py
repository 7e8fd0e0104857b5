"""``evictionStrategy: External``: virt-api marks the VM, KubeVirt never migrates it, its external controller
replaces it on its own schedule. Such a mark is no departure by live migration: the node budget (``node_busy``)
does not count it, so it cannot hold its node for as long as the mark stays; once a migration of it runs, it
counts like any other."""

from __future__ import annotations

import pytest

from app.policy import PolicySettings, decide
from app.policy.decide import awaits_external_controller, held_node, leavers
from app.policy.model import EvictionAttempt
from tests.builders import NOW, NS, kubevirt_cr, mstate, node, pod, store_of, vmi, vmim

DESCHEDULER = dict(username="system:serviceaccount:kube-system:descheduler-sa", requested_by="sigs.k8s.io/descheduler")


def evict_db(store):
    req = EvictionAttempt("CREATE", "pods", "eviction", NS, "virt-launcher-db-abcde", **DESCHEDULER)
    return decide(req, store, NOW, PolicySettings())


def cluster(*web: dict, cr: dict | None = None):
    objs = [node("worker-a"), node("worker-b"), vmi("db", "worker-a"), pod("db", "worker-a", name="virt-launcher-db-abcde"),
            pod("web", "worker-a", name="virt-launcher-web-abcde"), *web]
    return store_of(*objs, *([cr] if cr else []))


@pytest.mark.parametrize(("row", "web", "cr", "reason"), [
    ("External on the VMI, marked, nothing migrating: not counted",
     [vmi("web", "worker-a", evacuation="worker-a", strategy="External")], None, "allowed"),
    ("External from the KubeVirt CR's default: not counted",
     [vmi("web", "worker-a", evacuation="worker-a")], kubevirt_cr("External"), "allowed"),
    ("LiveMigrate, marked: counted (KubeVirt migrates it)",
     [vmi("web", "worker-a", evacuation="worker-a", strategy="LiveMigrate")], None, "node_busy"),
    ("no strategy and no KubeVirt CR known: counted, as before",
     [vmi("web", "worker-a", evacuation="worker-a")], None, "node_busy"),
    ("External with a migration its controller started: counted",
     [vmi("web", "worker-a", evacuation="worker-a", strategy="External"), vmim("m", "web", "Running", 5)], None,
     "node_busy"),
    ("External, migrating (migrationState in flight): counted",
     [vmi("web", "worker-a", evacuation="worker-a", strategy="External",
          migration=mstate("m", "worker-a", "worker-b", 3))], None, "node_busy"),
])
def test_the_node_budget_and_an_external_mark(row, web, cr, reason):
    d = evict_db(cluster(*web, cr=cr))
    assert d.reason == reason, (row, d.message)


def test_an_external_mark_is_no_leaver_and_holds_no_node():
    store = cluster(vmi("web", "worker-a", evacuation="worker-a", strategy="External"))
    settings = PolicySettings(evacuation_stale_after=0.0)
    assert leavers("worker-a", store, NOW, settings) == []
    assert held_node(store.node("worker-a"), store, NOW, settings) is None
    web = store.vmi(NS, "web")
    assert awaits_external_controller(web, store.migrations(NS, "web"), store.kubevirt())
    # its own eviction is still answered as KubeVirt would (rule 7: marked, the background text)
    req = EvictionAttempt("CREATE", "pods", "eviction", NS, "virt-launcher-web-abcde", **DESCHEDULER)
    d = decide(req, store, NOW, PolicySettings())
    assert d.reason == "evacuation_pending", d.message
