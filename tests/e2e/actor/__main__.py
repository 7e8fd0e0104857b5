"""``python -m tests.e2e.actor --scenario FILE --kubeconfig FILE --handler-kubeconfig FILE --ca-dir DIR --workdir DIR
--duration SECONDS``

The outcome run's cluster around real KubeVirt (virt-api and virt-controller already running on this control
plane: ``tests/e2e/kubevirt.py``). Creates the scenario's nodes (as kubelet registers them) and its VMs as users
create them (a VMI each, with the VM's vCPUs and memory; virt-controller makes the launcher pods, the actor's
scheduler binds each to the node the simulator's initial placement gives it), waits until every VMI runs, then
plays kubelet, the scheduler's binding and virt-handler with the scenario's hardware (``node.Nodes`` with
``physics.Hardware``) and serves the load to Prometheus (``load.py``: the load model's node figures, and what
virt-handler and kube-state-metrics would serve about the same VMs and nodes) for ``--duration`` seconds of real
time. Before the run, ``--warmup`` seconds at the first sample's load (exporter ready: ``DIR/actor-exporter.json``),
so that Prometheus holds the VMs' counters over a ``rate()`` window when the run starts, as a cluster whose VMs
have been running does. ``--seed`` replaces the scenario's seed (placement, load, copy times and failures: another roll of its dice).
Writes ``DIR/actor-ready.json`` (ports, start time) once the VMs run, and ``DIR/actor-result.json`` at the end
(every migration KubeVirt made, the most VMs leaving one node at once, the load samples). SIGTERM ends the run
early, with the result.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from random import Random
from types import SimpleNamespace

import orjson
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from app.sim.engine import initial_placement, node_load
from app.sim.scenario import ScenarioError, load_scenario
from tests.e2e.actor.load import GIB, ClusterExporters, Exporter
from tests.e2e.actor.node import Nodes
from tests.e2e.actor.physics import Hardware
from tests.e2e.actor.record import Recorder
from tests.e2e.controlplane import CertificateAuthority
from tests.e2e.objects import KubeObjects

log = logging.getLogger("actor")
NAMESPACE = "vms"  # the simulator's namespace for VMs (app.sim.kubevirt.NAMESPACE)


def _api(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg, persist_config=False)
    return client.ApiClient(cfg)


def vmi_body(vm) -> dict:
    """The VM as a user writes its VMI: its vCPUs and memory, live migration on eviction."""
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": vm.name, "namespace": NAMESPACE},
            "spec": {"domain": {"cpu": {"cores": max(1, int(vm.vcpus))}, "devices": {},
                                "resources": {"requests": {"memory": f"{int(vm.memory * 1024)}Mi"}}},
                     "evictionStrategy": "LiveMigrate", "terminationGracePeriodSeconds": 0}}


class _Plane:
    """What ``Nodes`` uses of a control plane, in this process: its URL, CA (to issue the kubelets' and the
    scheduler's client certificates) and an admin client."""

    def __init__(self, kubeconfig: Path, ca_dir: Path) -> None:
        doc = json.loads(kubeconfig.read_text())
        self.url = doc["clusters"][0]["cluster"]["server"]
        self.ca_path = Path(doc["clusters"][0]["cluster"]["certificate-authority"])
        self.ca = CertificateAuthority.from_pem((ca_dir / "ca.crt").read_bytes(), (ca_dir / "ca.key").read_bytes())
        self._kubeconfig = kubeconfig

    def api_client(self) -> client.ApiClient:
        return _api(self._kubeconfig)


def create_cluster(api: client.ApiClient, nodes, vms, placement: list[int], actor: Nodes, timeout: float) -> None:
    objects = KubeObjects(api)
    try:
        objects.namespace(NAMESPACE)
    except ApiException as e:
        if e.status != 409:
            raise
    core = client.CoreV1Api(api)
    for n in nodes:
        objects.node(n.name, cpu=str(int(n.cpu)), memory=f"{int(n.memory)}Gi")
        # the API server's TaintNodesByCondition put node.kubernetes.io/not-ready on the new node; the node
        # lifecycle controller (kube-controller-manager, not run here) takes it away once the node is Ready
        core.patch_node(n.name, {"spec": {"taints": None}})
    custom = client.CustomObjectsApi(api)
    for vm, i in zip(vms, placement):
        actor.placement[(NAMESPACE, vm.name)] = nodes[i].name
        custom.create_namespaced_custom_object("kubevirt.io", "v1", NAMESPACE, "virtualmachineinstances", vmi_body(vm))
    deadline = time.monotonic() + timeout
    while True:
        items = custom.list_namespaced_custom_object("kubevirt.io", "v1", NAMESPACE, "virtualmachineinstances")["items"]
        running = [v for v in items if v.get("status", {}).get("phase") == "Running"]
        if len(running) == len(vms):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(running)} of {len(vms)} VMIs running after {timeout:.0f} s; actor errors: "
                               f"{actor.errors[:3]}")
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.e2e.actor", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", required=True, help="scenario YAML (the simulator's format)")
    p.add_argument("--kubeconfig", required=True, type=Path, help="an admin kubeconfig of the API server")
    p.add_argument("--handler-kubeconfig", required=True, type=Path, help="virt-handler's (its ServiceAccount's)")
    p.add_argument("--ca-dir", required=True, type=Path, help="ca.crt and ca.key of the control plane's CA")
    p.add_argument("--workdir", required=True, type=Path, help="where actor-ready.json and actor-result.json go")
    p.add_argument("--duration", required=True, type=float, help="seconds of real time to run")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between the actor's passes")
    p.add_argument("--seed", type=int, help="the scenario's seed replaced by this one")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="seconds the exporters serve the first sample before the run starts (a rate() over the VMs' "
                        "CPU counters needs their history)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.duration <= 0:
        p.error("--duration: must be positive")
    try:
        sc = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"actor: {e}", file=sys.stderr)
        return 2
    if args.seed is not None:
        sc = dataclasses.replace(sc, seed=args.seed)
    nodes, vms = copy.deepcopy(sc.nodes), copy.deepcopy(sc.vms)
    placement = initial_placement(nodes, vms, Random(f"{sc.seed}:placement"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    plane = _Plane(args.kubeconfig, args.ca_dir)
    api = plane.api_client()
    hardware = Hardware(sc.kubevirt, nodes, vms, sc.seed)
    actor = Nodes(plane, args.handler_kubeconfig, args.workdir / "nodes", interval=args.interval,
                  seed=sc.seed, hardware=hardware).start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        create_cluster(api, nodes, vms, placement, actor, timeout=240)

        def where() -> dict[tuple[str, str], str]:
            with actor.lock:
                return dict(actor.vmi_nodes)

        cluster = ClusterExporters(NAMESPACE, {n.name: (float(n.cpu), n.memory * GIB) for n in nodes}, where)
        exporter = Exporter([n.name for n in nodes], cluster)
        exporter_port = exporter.serve()
        load_rng = Random(f"{sc.seed}:load")
        overhead = sc.kubevirt.migration_cpu_overhead
        by_name = {n.name: n for n in nodes}
        scores_log: list[tuple[int, list[int]]] = []

        def sample(now: int) -> None:
            """The load model's sample (same stream, same order as the simulator's engine) on where the VMs are
            now and which copies run (their extra load on both ends)."""
            for vm in vms:
                vm.cpu_load.tick(load_rng, now)
                vm.memory_load.tick(load_rng, now)
            with actor.lock:
                where = dict(actor.vmi_nodes)
                copies = hardware.copies.active()
            view = SimpleNamespace(
                nodes=nodes,
                vmis=[SimpleNamespace(vm=vm, node=by_name.get(where.get((NAMESPACE, vm.name)), nodes[i]))
                      for vm, i in zip(vms, placement)],
                running=[SimpleNamespace(source=by_name[c.source], target=by_name[c.target], copy_start=c.start,
                                         vmi=SimpleNamespace(vm=c.vm))
                         for c in copies if c.source in by_name and c.target in by_name])
            # each VM's own use (virt-handler's figures): the load model's, without a copy's extra load
            use = {vm.name: (vm.vcpus * vm.cpu_load.value(now), vm.memory * GIB,
                             vm.memory * GIB * vm.memory_load.value(now)) for vm in vms}
            scores_log.append((now, exporter.update(now, node_load(view, now, overhead), use)))

        # the first sample, served through the warm-up: the VMs as they have been running before the run
        sample(0)
        (args.workdir / "actor-exporter.json").write_text(json.dumps({"exporter_port": exporter_port}))
        if args.warmup > 0:
            log.info("warm-up: %.0f s at the first sample's load", args.warmup)
            stopped.wait(args.warmup)
        mono0, wall0 = time.monotonic(), time.time()
        recorder = Recorder(api, NAMESPACE, wall0).start()
        (args.workdir / "actor-ready.json").write_text(json.dumps({
            "wall0": wall0, "exporter_port": exporter_port, "nodes": [n.name for n in nodes], "vms": len(vms)}))
        log.info("running %s for %.0f s: %d nodes, %d VMs", sc.name, args.duration, len(nodes), len(vms))
        at = 0
        while not stopped.is_set():
            at += sc.sample_interval
            if at >= args.duration:
                stopped.wait(max(0.0, mono0 + args.duration - time.monotonic()))
                break
            if stopped.wait(max(0.0, mono0 + at - time.monotonic())):
                break
            sample(at)
        recorder.stop()
        result = {"scenario": sc.name, "duration_s": time.monotonic() - mono0, "wall0": wall0,
                  "runs": recorder.runs(), "max_leaving_per_node": recorder.max_leaving_per_node,
                  "scores": scores_log, "actor_errors": actor.errors[:20], "recorder_errors": recorder.errors[:20],
                  "migrations_seen_by_handler": len(actor.migrations)}
    finally:
        actor.stop()
    (args.workdir / "actor-result.json").write_bytes(orjson.dumps(result))
    log.info("done: %d migrations, %d actor errors", len(result["runs"]), len(actor.errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
