"""Start a simulation from a real cluster: ``simulate --snapshot DUMP --scenario F``.

From a ``kubectl get vmi,vmim,pods,nodes -A -o yaml`` dump come the nodes
(allocatable CPU and memory, cordon), the running VMIs (vCPUs and memory from
the VMI spec, else from the launcher pod's requests) and where they run, and
the finished migrations KubeVirt still keeps (so cooldowns already running
carry on). The load pattern comes from the scenario: the VMs, sorted by
namespace and name, take the scenario's VMs' load profiles and dirty rates in
turn. Simulated time 0 is the newest timestamp in the dump.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.cluster.snapshot import SnapshotError, read_objects
from app.sim.kubevirt import PRIORITY_DESCHEDULER, PRIORITY_DRAIN, KubeVirt, Migration
from app.sim.model import VM, Node
from app.sim.scenario import Scenario, ScenarioError
from app.timefmt import parse_timestamp

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40}


def quantity(value: Any) -> float | None:
    """A Kubernetes quantity as a number (``500m`` -> 0.5, ``8Gi`` -> 8 * 2**30); None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        return None
    try:
        return float(m.group(1)) * _SUFFIX[m.group(2)]
    except ValueError:
        return None


def _d(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def _vmi_size(vmi: dict, pod: dict | None) -> tuple[float | None, float | None]:
    domain = _d(_d(vmi.get("spec")).get("domain"))
    cpu = _d(domain.get("cpu"))
    vcpus = None
    if cpu:
        vcpus = float(int(cpu.get("cores") or 1) * int(cpu.get("sockets") or 1) * int(cpu.get("threads") or 1))
    requests = _d(_d(domain.get("resources")).get("requests"))
    if vcpus is None:
        vcpus = quantity(requests.get("cpu"))
    memory = quantity(_d(domain.get("memory")).get("guest")) or quantity(requests.get("memory"))
    if pod is not None and (vcpus is None or memory is None):
        for c in _d(pod.get("spec")).get("containers") or []:
            if _d(c).get("name") == "compute":
                req = _d(_d(_d(c).get("resources")).get("requests"))
                vcpus = vcpus if vcpus is not None else quantity(req.get("cpu"))
                memory = memory if memory is not None else quantity(req.get("memory"))
    return vcpus, None if memory is None else memory / 2**30


def apply_snapshot(scenario: Scenario, path: str | Path) -> Scenario:
    try:
        objects = list(read_objects(path))
    except SnapshotError as e:
        raise ScenarioError(str(e)) from None
    by_kind: dict[str, list[dict]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind")), []).append(obj)
    raw_nodes = sorted(by_kind.get("Node", []), key=lambda o: str(_d(o.get("metadata")).get("name")))
    labelled = [n for n in raw_nodes
                if _d(_d(n.get("metadata")).get("labels")).get("kubevirt.io/schedulable") == "true"]
    nodes: list[Node] = []
    for n in labelled or raw_nodes:
        status = _d(n.get("status"))
        res = _d(status.get("allocatable")) or _d(status.get("capacity"))
        cpu, mem = quantity(res.get("cpu")), quantity(res.get("memory"))
        name = _d(n.get("metadata")).get("name")
        if not isinstance(name, str) or not cpu or not mem:
            continue
        nodes.append(Node(index=len(nodes), name=name, cpu=cpu, memory=mem / 2**30,
                          cordoned=_d(n.get("spec")).get("unschedulable") is True))
    index = {n.name: n.index for n in nodes}
    pods = {}
    for p in by_kind.get("Pod", []):
        meta = _d(p.get("metadata"))
        vmi_name = _d(meta.get("annotations")).get("kubevirt.io/domain")
        if vmi_name and _d(p.get("status")).get("phase") == "Running":
            pods[(meta.get("namespace"), vmi_name)] = p
    templates = scenario.vms
    vms: list[VM] = []
    placement: list[int] = []
    names: dict[tuple, str] = {}
    raw_vmis = sorted(by_kind.get("VirtualMachineInstance", []),
                      key=lambda o: (str(_d(o.get("metadata")).get("namespace")), str(_d(o.get("metadata")).get("name"))))
    counts: dict[str, int] = {}
    for v in raw_vmis:
        n = str(_d(v.get("metadata")).get("name"))
        counts[n] = counts.get(n, 0) + 1
    for v in raw_vmis:
        meta, status = _d(v.get("metadata")), _d(v.get("status"))
        node = status.get("nodeName")
        if status.get("phase") != "Running" or node not in index:
            continue
        key = (meta.get("namespace"), meta.get("name"))
        vcpus, memory = _vmi_size(v, pods.get(key))
        if not vcpus or not memory:
            continue
        t = templates[len(vms) % len(templates)]
        name = str(key[1]) if counts[str(key[1])] == 1 else f"{key[0]}-{key[1]}"
        names[key] = name
        vms.append(replace(copy.deepcopy(t), index=len(vms), name=name, group=t.group, vcpus=vcpus, memory=memory))
        placement.append(index[node])
    if len(nodes) < 2 or not vms:
        raise ScenarioError(f"{path}: need at least two nodes and one running VMI with a known size "
                            f"(found {len(nodes)} nodes, {len(vms)} VMIs)")
    for e in scenario.events:
        if e.kind == "drain" and e.node not in index:
            raise ScenarioError(f"{path}: the scenario drains {e.node!r}, which the snapshot does not have")
    history = _history(by_kind.get("VirtualMachineInstanceMigration", []), names)
    out = copy.copy(scenario)
    out.nodes, out.vms, out.placement = nodes, vms, placement
    out.history_hook = _Seeder(history) if history else None
    return out


def _history(raw: list[dict], names: dict[tuple, str]) -> list[tuple[str, str, float, float, bool, int]]:
    """Finished migrations as (vm, uid, start, end, failed, priority or None) in epoch seconds."""
    out = []
    for m in raw:
        meta, status = _d(m.get("metadata")), _d(m.get("status"))
        key = (meta.get("namespace"), _d(m.get("spec")).get("vmiName"))
        state = _d(status.get("migrationState"))
        start, end = parse_timestamp(state.get("startTimestamp")), parse_timestamp(state.get("endTimestamp"))
        if key not in names or status.get("phase") not in ("Succeeded", "Failed") or start is None or end is None:
            continue
        spec_priority = _d(m.get("spec")).get("priority")  # none: KubeVirt ran without MigrationPriorityQueue
        prio = None if not spec_priority else PRIORITY_DESCHEDULER if spec_priority == "system-maintenance" \
            else PRIORITY_DRAIN
        out.append((names[key], str(meta.get("uid") or meta.get("name")), start, end, status.get("phase") == "Failed",
                    prio))
    return sorted(out, key=lambda h: h[3])


class _Seeder:
    """Puts the dump's finished migrations into the simulated KubeVirt before the run; the
    newest end is simulated time 0. A picklable callable (runs go to worker processes)."""

    def __init__(self, history: list) -> None:
        self.history = history

    def __call__(self, kv: KubeVirt) -> None:
        zero = max(h[3] for h in self.history)
        for seq, (vm, uid, start, end, failed, prio) in enumerate(self.history):
            vmi = kv.vmi_by_name[vm]
            s, e = int(start - zero), int(end - zero)
            m = Migration(seq=-1 - seq, name=f"{vm}-snapshot-{seq:04d}", uid=f"snapshot-{uid}", vmi=vmi, created=s,
                          eligible_at=s, priority=PRIORITY_DRAIN if prio is None else prio, queued=prio is not None,
                          evacuation_node=vmi.node.name,
                          phase="Failed" if failed else "Succeeded", start=s, end=e, source=vmi.node,
                          target=vmi.node, failed=failed, copy_start=s)
            vmi.vmims.append(m)
            vmi.migration = m
            vmi.failures_since_success = vmi.failures_since_success + 1 if failed else 0
            kv.publish_vmim(m)
            kv.retain(vmi, 0)
        for vmi in kv.vmis:
            kv.publish_vmi(vmi)
