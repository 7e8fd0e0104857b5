"""What the outcome run counts, read from the API server as an observer (it writes nothing): every VMIM real
virt-controller created (the migrations, with their phases and ``migrationState``), and the VMIs' marks.

Polled (every ``interval``), because virt-controller's garbage collector deletes finished VMIMs beyond the newest
five per VMI: each one is seen while it exists. Times are seconds of the run (``wall0``: its start, epoch seconds);
KubeVirt's timestamps have whole seconds.

- ``runs``: one per VMIM that left ``Pending`` (took one of KubeVirt's slots: the simulator's ``migrations_total``
  counts the same), as the simulator's ``MigrationRun``: VM, cause (``descheduler`` when the VMI carried
  ``kubevirt.io/eviction-source: descheduler`` when its VMIM appeared), created, start (the first phase after
  Pending), end, source, target, failed, failure (the source's ``failureReason``, or ``unschedulable`` when the
  target pod never ran), copy start (``migrationState.startTimestamp``), and ``retry``: the VMI was marked without a
  break since the previous attempt, which failed (KubeVirt's evacuation controller retrying, not a new eviction);
- ``max_leaving_per_node``: the most VMs leaving one node at once because of the descheduler (marked from it with
  the descheduler as the source, or with an unfinished descheduler-caused VMIM while on it: the simulator's
  ``descheduler_leavers``).
"""

from __future__ import annotations

import calendar
import logging
import math
import threading
import time
from collections import Counter

from kubernetes import client

log = logging.getLogger("actor.record")
KUBEVIRT = ("kubevirt.io", "v1")
EVICTION_SOURCE = "kubevirt.io/eviction-source"
FINISHED = ("Succeeded", "Failed")


def _seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return float(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")))


class Recorder:
    def __init__(self, api: client.ApiClient, namespace: str, wall0: float, interval: float = 0.5) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.ns, self.wall0, self.interval = namespace, wall0, interval
        self.vmims: dict[str, dict] = {}  # uid -> what was seen of it
        self.marked: dict[str, str] = {}  # VMI -> evacuationNodeName as last seen
        self.epoch: Counter = Counter()  # VMI -> marks seen (a new one each time it gets marked)
        self.max_leaving_per_node = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.step()  # the last state

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception as e:  # a failed read: the next pass reads again
                self.errors.append(repr(e))
                log.warning("recorder pass failed: %s", e)

    def t(self, stamp: str | None) -> float | None:
        """Whole seconds of the run, as the simulator counts them (KubeVirt's stamps are truncated seconds)."""
        s = _seconds(stamp)
        return None if s is None else s - math.floor(self.wall0)

    def step(self) -> None:
        # the VMIMs first: virt-api marks a VMI (and its eviction source) before virt-controller creates its VMIM, so
        # VMIs read after the VMIMs carry the mark of every VMIM seen; read before, a VMIM created between the two
        # reads would be taken for a drain's
        vmims = self.custom.list_namespaced_custom_object(*KUBEVIRT, self.ns,
                                                          "virtualmachineinstancemigrations")["items"]
        vmis = self.custom.list_namespaced_custom_object(*KUBEVIRT, self.ns, "virtualmachineinstances")["items"]
        by_name = {}
        for v in vmis:
            name = v["metadata"]["name"]
            by_name[name] = v
            mark = v.get("status", {}).get("evacuationNodeName") or ""
            if mark and not self.marked.get(name):
                self.epoch[name] += 1
            self.marked[name] = mark
        unfinished_by_descheduler: set[str] = set()
        for m in vmims:
            uid, vmi = m["metadata"]["uid"], m["spec"]["vmiName"]
            rec = self.vmims.get(uid)
            if rec is None:
                source = ((by_name.get(vmi) or {}).get("metadata", {}).get("annotations") or {}).get(EVICTION_SOURCE)
                rec = self.vmims[uid] = {"name": m["metadata"]["name"], "vm": vmi, "epoch": self.epoch[vmi],
                                         "cause": "descheduler" if source == "descheduler" else "drain",
                                         "created": self.t(m["metadata"]["creationTimestamp"])}
            st = m.get("status") or {}
            rec["phase"] = st.get("phase") or "Pending"
            rec["phases"] = {p["phase"]: self.t(p.get("phaseTransitionTimestamp"))
                             for p in st.get("phaseTransitionTimestamps") or []}
            ms = st.get("migrationState") or {}
            vms = ((by_name.get(vmi) or {}).get("status") or {}).get("migrationState") or {}
            if vms.get("migrationUid") == uid:  # the VMI's copy is fresher than the VMIM's
                ms = {**ms, **vms}
            if ms:
                rec["state"] = {k: ms.get(k) for k in ("sourceNode", "targetNode", "startTimestamp", "endTimestamp",
                                                      "failed", "failureReason", "completed")}
            if rec["phase"] not in FINISHED and rec["cause"] == "descheduler":
                unfinished_by_descheduler.add(vmi)
        leaving: Counter = Counter()
        for name, v in by_name.items():
            node = v.get("status", {}).get("nodeName") or ""
            ann = v.get("metadata", {}).get("annotations") or {}
            if node and ((self.marked.get(name) == node and ann.get(EVICTION_SOURCE) == "descheduler")
                         or name in unfinished_by_descheduler):
                leaving[node] += 1
        self.max_leaving_per_node = max(self.max_leaving_per_node, max(leaving.values(), default=0))

    def runs(self) -> list[dict]:
        out = []
        last: dict[str, dict] = {}
        for rec in sorted(self.vmims.values(), key=lambda r: (r["created"], r["name"])):
            phases = rec.get("phases", {})
            started = [t for p, t in phases.items() if p != "Pending" and t is not None]
            previous = last.get(rec["vm"])
            last[rec["vm"]] = rec
            if not started:
                continue  # never got a slot (held back, or still queued at the end)
            state = rec.get("state") or {}
            end = phases.get(rec["phase"]) if rec["phase"] in FINISHED else None
            failed = rec["phase"] == "Failed"
            failure = ""
            if failed:
                failure = (state.get("failureReason") or "").removeprefix("e2e: ") or (
                    "unschedulable" if not state.get("startTimestamp") else "failed")
            out.append({
                "vm": rec["vm"], "cause": rec["cause"], "created": rec["created"], "start": min(started),
                "end": end, "source": state.get("sourceNode") or "", "target": state.get("targetNode") or "",
                "failed": failed, "failure": failure, "copy_start": self.t(state.get("startTimestamp")),
                "retry": bool(previous and previous.get("phase") == "Failed" and previous["epoch"] == rec["epoch"]),
                "name": rec["name"],
            })
        return out
