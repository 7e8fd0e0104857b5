"""The outcome run's recorder (tests/e2e/actor/record.py) tells the descheduler's evacuations from a drain's by the
VMI's ``kubevirt.io/eviction-source``: virt-api writes it with the mark, before virt-controller creates the VMIM."""

from __future__ import annotations

from kubernetes import client

from tests.e2e.actor.record import Recorder

STAMP = "2026-11-26T12:00:10Z"


class Cluster:
    """Answers the recorder's two lists; the descheduler's eviction lands right after the first read of a pass
    (virt-api marks the VMI, virt-controller creates the VMIM)."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.evicted = False

    def list_namespaced_custom_object(self, group, version, namespace, plural):
        self.reads.append(plural)
        if len(self.reads) == 1:
            answer = self._answer(plural)
            self.evicted = True  # between the pass's two reads
            return answer
        return self._answer(plural)

    def _answer(self, plural: str) -> dict:
        if plural == "virtualmachineinstances":
            meta = {"name": "app-01", "annotations": {}}
            status: dict = {"nodeName": "worker-00"}
            if self.evicted:
                meta["annotations"]["kubevirt.io/eviction-source"] = "descheduler"
                status["evacuationNodeName"] = "worker-00"
            return {"items": [{"metadata": meta, "status": status}]}
        if not self.evicted:
            return {"items": []}
        return {"items": [{"metadata": {"uid": "u1", "name": "kubevirt-evacuation-1", "creationTimestamp": STAMP},
                           "spec": {"vmiName": "app-01"}, "status": {"phase": "Scheduling"}}]}


def test_a_vmim_created_between_the_two_reads_is_the_descheduler_s():
    rec = Recorder(client.ApiClient(), "vms", wall0=1795780800.0)
    rec.custom = Cluster()
    rec.step()
    rec.step()
    assert [r["cause"] for r in rec.vmims.values()] == ["descheduler"]
    assert rec.max_leaving_per_node == 1
