"""``python -m tests.e2e.actor --scenario FILE --kubeconfig FILE --workdir DIR --duration SECONDS --cert --key --ca``

With the CRDs installed (``ControlPlane.install_crds``), creates the scenario's nodes, VMIs and launcher pods (placed as the
simulator places them), registers KubeVirt's eviction admitter, serves the load to Prometheus, writes
``DIR/actor-ready.json`` (ports, start time) and runs the scenario for ``--duration`` seconds of real time; then
writes ``DIR/actor-result.json`` (every migration, every call of the admitter, the most VMs marked on one node)
and exits. SIGTERM ends the run early, with the result.
"""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import heapq
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from random import Random

import orjson
from kubernetes import watch
from kubernetes.client import AdmissionregistrationV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from app.cluster.kube import api_client
from app.domain.records import EVICTION_IN_PROGRESS
from app.sim.engine import initial_placement, node_load
from app.sim.scenario import ScenarioError, load_scenario
from tests.e2e.actor import objects as o
from tests.e2e.actor.admitter import Admitter
from tests.e2e.actor.kubevirt import Clock, RealKubeVirt, Writer
from tests.e2e.actor.load import Exporter

log = logging.getLogger("actor")
PRIO_SAMPLE, PRIO_KUBEVIRT = 0, 2


class Driver:
    """The simulator's event queue in real time: ``fn(at, *args)`` runs, under the model's lock, once ``at``
    seconds of the run have passed; events due at the same second run samples first, then first scheduled first."""

    def __init__(self, lock: threading.RLock) -> None:
        self.cv = threading.Condition(lock)
        self.clock = Clock()
        self._heap: list = []
        self._seq = 0
        self.stopped = False

    def schedule(self, at: int, fn, args: tuple = (), prio: int = PRIO_KUBEVIRT) -> None:
        with self.cv:
            self._seq += 1
            heapq.heappush(self._heap, (at, prio, self._seq, fn, args))
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()

    def run(self, until: float) -> None:
        with self.cv:
            while not self.stopped:
                elapsed = self.clock.elapsed()
                if elapsed >= until:
                    return
                if self._heap and self._heap[0][0] <= elapsed:
                    at, _, _, fn, args = heapq.heappop(self._heap)
                    try:
                        fn(at, *args)
                    except Exception:  # one failed event must not end the run; it is in the log
                        log.exception("event %s failed", getattr(fn, "__name__", fn))
                    continue
                wait = until - elapsed if not self._heap else min(until, self._heap[0][0]) - elapsed
                self.cv.wait(max(0.01, min(wait, 1.0)))


def install(api, ca_pem: bytes, admitter_port: int) -> None:
    """The VMs' namespace and KubeVirt's admitter (the CRDs are the control plane's: ``cp.install_crds()``)."""
    try:
        CoreV1Api(api).create_namespace({"metadata": {"name": o.NAMESPACE}})
    except ApiException as e:
        if e.status != 409:
            raise
    hook = o.admitter_webhook(f"https://127.0.0.1:{admitter_port}/validate-eviction",
                              base64.b64encode(ca_pem).decode())
    adm = AdmissionregistrationV1Api(api)
    try:
        adm.create_validating_webhook_configuration(hook)
    except ApiException as e:
        if e.status != 409:
            raise
        adm.replace_validating_webhook_configuration(hook["metadata"]["name"], {
            **hook, "metadata": {**hook["metadata"],
                                 "resourceVersion": adm.read_validating_webhook_configuration(
                                     hook["metadata"]["name"]).metadata.resource_version}})


def watch_annotations(api, kv: RealKubeVirt, lock, foreign: list, stop: threading.Event) -> None:
    """virt-controller's side of ``eviction-in-progress``: anyone's value on a pod whose VMI is not marked (or that
    is not the VM's source pod) is removed again, and recorded."""
    core = CoreV1Api(api)
    while not stop.is_set():
        try:
            for ev in watch.Watch().stream(core.list_namespaced_pod, o.NAMESPACE, timeout_seconds=30):
                pod_obj = ev["object"]
                meta = pod_obj.metadata
                if ev["type"] == "DELETED" or EVICTION_IN_PROGRESS not in (meta.annotations or {}):
                    continue
                with lock:
                    pod = kv.pods.get(meta.name)
                    if pod is None or (pod.vmi.evacuation_node and pod.vmi.pod is pod):
                        continue
                    foreign.append({"t": kv.clock.elapsed(), "pod": meta.name, "vmi": pod.vmi.name,
                                    "marked": bool(pod.vmi.evacuation_node)})
                    kv.remove_annotation(pod)
                if stop.is_set():
                    return
        except Exception as e:  # a cut watch: list and watch again
            if not stop.is_set():
                log.warning("pod watch: %s", e)
                time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.e2e.actor", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", required=True, help="scenario YAML (the simulator's format)")
    p.add_argument("--kubeconfig", required=True, help="an admin kubeconfig of the API server")
    p.add_argument("--workdir", required=True, type=Path, help="where actor-ready.json and actor-result.json go")
    p.add_argument("--duration", required=True, type=float, help="seconds of real time to run")
    p.add_argument("--cert", required=True, type=Path, help="the admitter's serving certificate (PEM)")
    p.add_argument("--key", required=True, type=Path, help="its key (PEM)")
    p.add_argument("--ca", required=True, type=Path, help="the CA that signed it (the webhook's caBundle)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.duration <= 0:
        p.error("--duration: must be positive")
    try:
        sc = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"actor: {e}", file=sys.stderr)
        return 2
    api = api_client(args.kubeconfig, retries=False, pool_size=8)
    lock = threading.RLock()
    driver = Driver(lock)
    writer = Writer(api)
    nodes, vms = copy.deepcopy(sc.nodes), copy.deepcopy(sc.vms)
    placement = initial_placement(nodes, vms, Random(f"{sc.seed}:placement"))
    kv = RealKubeVirt(sc.kubevirt, nodes, vms, placement, Random(f"{sc.seed}:kubevirt"),
                      lambda at, fn, a: driver.schedule(at, fn, a), writer, driver.clock)
    admitter = Admitter(kv, lock)
    admitter_port = admitter.serve(args.cert, args.key)
    install(api, args.ca.read_bytes(), admitter_port)
    if not writer.wait(timeout=120):
        print("actor: creating the cluster's objects took over 120 s", file=sys.stderr)
        return 1
    exporter = Exporter([n.name for n in nodes])
    exporter_port = exporter.serve()
    stop = threading.Event()
    foreign: list[dict] = []
    threading.Thread(target=watch_annotations, args=(api, kv, lock, foreign, stop), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: driver.stop())

    load_rng = Random(f"{sc.seed}:load")
    overhead = sc.kubevirt.migration_cpu_overhead
    scores_log: list[tuple[int, list[int]]] = []

    def sample(now: int) -> None:
        for vm in vms:
            vm.cpu_load.tick(load_rng, now)
            vm.memory_load.tick(load_rng, now)
        scores_log.append((now, exporter.update(now, node_load(kv, now, overhead))))
        kv.try_start(now)
        driver.schedule(now + sc.sample_interval, sample, prio=PRIO_SAMPLE)

    with lock:
        driver.clock = kv.clock = Clock()  # the run starts now that the objects exist
        driver.schedule(0, sample, prio=PRIO_SAMPLE)
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / "actor-ready.json").write_text(json.dumps({
        "wall0": driver.clock.wall0, "admitter_port": admitter_port, "exporter_port": exporter_port,
        "nodes": [n.name for n in nodes], "vms": len(vms)}))
    log.info("running %s for %.0f s: %d nodes, %d VMs", sc.name, args.duration, len(nodes), len(vms))
    driver.run(args.duration)
    with lock:
        end = driver.clock.elapsed()
        runs = list(kv.finished) + kv.running_runs()
        result = {
            "scenario": sc.name, "duration_s": end, "wall0": driver.clock.wall0,
            "runs": [dataclasses.asdict(r) for r in runs],
            "pending_at_end": len(kv.pending),
            "admissions": list(admitter.records),
            "max_leaving_per_node": kv.max_leaving,
            "foreign_annotations": list(foreign),
            "scores": scores_log,
        }
    stop.set()
    admitter.stop()
    writer.wait(timeout=30)
    writer.stop()
    result.update(writes=writer.writes, write_failures=writer.failures)
    (args.workdir / "actor-result.json").write_bytes(orjson.dumps(result))
    log.info("done: %d migrations, %d admissions, %d writes, %d write failures", len(runs), len(admitter.records),
             writer.writes, len(writer.failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
