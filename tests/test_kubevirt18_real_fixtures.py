"""Objects as real KubeVirt v1.8.3 left them (tests/fixtures/kubevirt-1.8.3), as the guard reads them.

They were written by KubeVirt's own virt-api and virt-controller in the end-to-end run against real KubeVirt
(``tests/e2e/test_real_kubevirt.py`` keeps them in build/e2e/kubevirt-objects); kubelet's and virt-handler's parts
came from the actor. So these are the shapes the guard meets in a cluster on KubeVirt's defaults: no VMIM
``spec.priority`` (the MigrationPriorityQueue gate is Beta and off in v1.8), the eviction-source annotation kept on
the VMI after ``evacuate/cancel``, launcher pods rendered by virt-controller.
"""

from __future__ import annotations

import json

from app.cluster.snapshot import load_snapshot
from app.domain.records import migration_from_object, pod_from_object, vmi_from_object
from app.policy import EvictionAttempt, PolicySettings, decide
from app.policy.decide import evacuation_episode, is_descheduler_caused
from app.timefmt import parse_timestamp
from tests.builders import FIXTURES, node

K18 = FIXTURES / "kubevirt-1.8.3"
DESCHEDULER = "sigs.k8s.io/descheduler"


def load(name: str) -> dict:
    return json.loads((K18 / f"{name}.json").read_text())


def test_the_vmi_virt_apis_admitter_marked():
    raw = load("vmi-marked-by-descheduler-eviction")
    rec = vmi_from_object(raw)
    assert rec.evacuation_node == rec.node == raw["status"]["nodeName"] != ""
    assert rec.eviction_source == "descheduler"
    assert (rec.eviction_strategy, rec.migratable) == ("LiveMigrate", "True")


def test_the_launcher_pod_virt_controller_rendered_and_annotated():
    raw = load("pod-virt-launcher-evacuating-source")
    p = pod_from_object(raw)
    assert p.is_launcher and p.eviction_in_progress and p.ready and p.phase == "Running"
    assert raw["metadata"]["annotations"]["descheduler.alpha.kubernetes.io/eviction-in-progress"] == "true"
    assert "descheduler.alpha.kubernetes.io/request-evict-only" in raw["metadata"]["annotations"]
    assert p.vmi_name == load("vmi-marked-by-descheduler-eviction")["metadata"]["name"]
    assert p.pinned_to == ""  # its nodeSelector is kubevirt.io/schedulable, not a host


def test_evacuation_vmims_carry_no_priority_on_kubevirt_defaults():
    ok, failed = migration_from_object(load("vmim-evacuation-succeeded")), migration_from_object(
        load("vmim-evacuation-failed"))
    assert (ok.phase, failed.phase) == ("Succeeded", "Failed")
    for m in (ok, failed):
        assert m.name.startswith("kubevirt-evacuation-") and m.evacuation_node and m.priority == ""
        assert m.end is not None and m.finished
    assert ok.start is not None and ok.source_node == ok.evacuation_node and ok.target_node
    phases = [p["phase"] for p in load("vmim-evacuation-succeeded")["status"]["phaseTransitionTimestamps"]]
    assert phases == ["Pending", "Scheduling", "Scheduled", "PreparingTarget", "TargetReady", "Running", "Succeeded"]


def test_after_evacuate_cancel_the_mark_is_gone_and_the_source_annotation_stays():
    rec = vmi_from_object(load("vmi-after-evacuate-cancel"))
    assert rec.evacuation_node == "" and rec.eviction_source == "descheduler"


def test_the_guard_on_the_states_real_kubevirt_left(tmp_path):
    """The marked VM after a failed attempt: descheduler-caused (by the annotation alone, there is no priority),
    and a descheduler eviction of it gets KubeVirt's background text from the guard, never reaching virt-api."""
    vmi = load("vmi-marked-after-failed-attempt")
    pod = load("pod-virt-launcher-source-after-failed-attempt")
    failed, retry = load("vmim-evacuation-failed"), load("vmim-evacuation-retry")
    ns, name, source = vmi["metadata"]["namespace"], vmi["metadata"]["name"], vmi["status"]["nodeName"]
    snap = tmp_path / "s.json"
    snap.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        node(source), node(vmi["status"]["migrationState"]["targetNode"]), vmi, pod, failed, retry]}))
    store, _ = load_snapshot(snap)
    rec = store.vmi(ns, name)
    episode = evacuation_episode(rec, store.migrations(ns, name), source)
    assert [m.phase for m in episode][:1] == ["Failed"] and is_descheduler_caused(rec, episode)
    now = parse_timestamp(failed["status"]["phaseTransitionTimestamps"][-1]["phaseTransitionTimestamp"]) + 5
    d = decide(EvictionAttempt("CREATE", "pods", "eviction", ns, pod["metadata"]["name"], requested_by=DESCHEDULER),
               store, now, PolicySettings())
    assert not d.allowed and d.message.startswith(
        f'Evacuation in progress: Eviction triggered evacuation of VMI "{ns}/{name}"'), d.message
