"""Starting a simulation from a cluster dump: nodes, VMI sizes and placement, kept migrations."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.sim.engine import Simulation
from app.sim.scenario import ScenarioError, parse_scenario
from app.sim.snapshot import apply_snapshot, quantity

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "objects"
SCENARIO = {
    "name": "from-dump", "hours": 1,
    "nodes": [{"name": "x", "count": 2}],
    "vms": [{"name": "busy", "dirtyRateMiBps": 10, "cpuLoad": 0.9}, {"name": "idle", "cpuLoad": 0.1}],
    "descheduler": {"interval": "60s"},
}


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _dump(tmp_path: Path) -> Path:
    node = _fixture("node-cordoned.json")
    nodes = []
    for name, cordoned in (("worker-a", False), ("worker-b", False), ("worker-c", True)):
        n = copy.deepcopy(node)
        n["metadata"]["name"] = name
        n["metadata"].setdefault("labels", {})["kubevirt.io/schedulable"] = "true"
        n["spec"] = {"unschedulable": True} if cordoned else {}
        nodes.append(n)
    vmi = _fixture("vmi-running-after-migration.json")  # rhel9-db-01, 4 cores, 16Gi, on worker-b
    other = copy.deepcopy(vmi)
    other["metadata"]["name"] = "web-1"
    other["status"]["nodeName"] = "worker-a"
    del other["spec"]["domain"]["cpu"]
    other["spec"]["domain"]["memory"] = {}
    other["spec"]["domain"].pop("resources", None)
    pod = {"kind": "Pod", "metadata": {"name": "virt-launcher-web-1-abcde", "namespace": "vms",
                                       "annotations": {"kubevirt.io/domain": "web-1"}},
           "spec": {"containers": [{"name": "compute", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]},
           "status": {"phase": "Running"}}
    vmim = _fixture("vmim-succeeded.json")  # rhel9-db-01, ended 2026-11-21T09:14:50Z after 12m19s
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes + [vmi, other, pod, vmim]}))
    return path


def test_quantities():
    assert quantity("500m") == 0.5 and quantity("8Gi") == 8 * 2**30 and quantity(4) == 4.0
    assert quantity("527966004Ki") == 527966004 * 1024 and quantity("lots") is None


def test_snapshot_gives_nodes_sizes_placement_and_the_kept_migration(tmp_path):
    sc = apply_snapshot(parse_scenario(SCENARIO, "s"), _dump(tmp_path))
    assert [(n.name, n.cpu, n.cordoned) for n in sc.nodes] == [
        ("worker-a", 64, False), ("worker-b", 64, False), ("worker-c", 64, True)]
    assert [(v.name, v.vcpus, v.memory, v.cpu_load.value(0)) for v in sc.vms] == [
        ("rhel9-db-01", 4, 16, 0.9), ("web-1", 2, 4, 0.1)]  # spec, then the pod's requests; loads in turn
    assert sc.placement == [1, 0]
    sim = Simulation(sc, "profile+guard")
    vmi = sim.kv.vmi_by_name["rhel9-db-01"]
    (kept,) = vmi.vmims
    assert (kept.end, kept.end - kept.copy_start, kept.phase) == (0, 739, "Succeeded")
    # the guard and the plugin both see the cooldown that is running: 15 min from the end
    assert sim.mode.plugin.check(vmi.pod, 60) == "plugin_cooldown"
    assert sim.mode.admit(vmi.pod, 60).reason == "cooldown"
    assert sim.mode.plugin.check(vmi.pod, 900) is None


def test_cli_runs_from_a_snapshot_and_names_a_bad_one(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(SCENARIO))
    assert main(["simulate", "--scenario", str(scenario), "--snapshot", str(_dump(tmp_path)), "--jobs", "1"]) == 0
    assert "(2 VMs on 3 nodes" in capsys.readouterr().out
    empty = tmp_path / "empty.yaml"
    empty.write_text("kind: List\nitems: []\n")
    assert main(["simulate", "--scenario", str(scenario), "--snapshot", str(empty)]) == 2
    assert "need at least two nodes" in capsys.readouterr().err
    with pytest.raises(ScenarioError, match="cannot read"):
        apply_snapshot(parse_scenario(SCENARIO, "s"), tmp_path / "missing.yaml")
