"""Admission latency with side effects off, writing to a healthy API server, and stuck on a hanging one.

    .venv/bin/python -m bench.effects_latency [N]

The guard runs for real (uvicorn, TLS) in this process; the API server is
tests.fakeapi on 127.0.0.1. Every request is a denial (an Event and the
annotation each time), sent one after another over one keep-alive connection.
Prints p50/p99/max per mode; the point is that the three rows look alike.
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from kubernetes import client as k8s

from app.admission.server import GuardContext
from app.cluster.listing import list_into
from app.cluster.store import ClusterStore
from app.effects import Effects, KubeEffectsApi
from app.metrics import Metrics
from app.policy import PolicySettings
from tests.effects.support import NOW, GuardServer, review_doc
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

NS = "vms"


def seed(api: FakeApiServer, vms: int) -> None:
    api.put(o.node("node-a"))
    for i in range(vms):
        api.put(o.vmi(NS, f"vm-{i}", node="node-a", evacuation_node="node-a", created=NOW - 86400))
        api.put(o.launcher_pod(NS, f"vm-{i}", "node-a", name=f"virt-launcher-vm-{i}-aaaaa"))


def run(mode: str, n: int, tmp: Path) -> list[float]:
    with FakeApiServer() as api:
        seed(api, 50)
        kube = k8s.ApiClient(api.configuration())
        store = ClusterStore()
        list_into(kube, store)
        metrics = Metrics()
        fx = None
        if mode != "off":
            fx = Effects(store, KubeEffectsApi(kube, timeout=(1.0, 2.0)), metrics, event_interval=0).start()
        if mode == "hanging":
            api.set_latency(30)
        ctx = GuardContext(view=store, settings=PolicySettings(), clock=lambda: NOW, metrics=metrics,
                           on_decision=fx.on_decision if fx else None)
        took = []
        with GuardServer(ctx, tmp / mode) as guard, httpx.Client(verify=guard.tls, timeout=10) as http:
            for i in range(n):
                body = orjson.dumps(review_doc(f"virt-launcher-vm-{i % 50}-aaaaa", uid=f"u{i}"))
                t = time.perf_counter()
                r = http.post(guard.url + "/mutate", content=body, headers={"Content-Type": "application/json"})
                took.append(time.perf_counter() - t)
                assert r.status_code == 200 and r.json()["response"]["allowed"] is False
        if fx:
            api.set_latency(0)
            api.down()
            fx.stop(timeout=3)
        return took


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    logging.disable(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as d:
        print(f"{'mode':<10} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for mode in ("off", "healthy", "hanging"):
            took = sorted(run(mode, n, Path(d)))
            p = lambda q: took[min(len(took) - 1, int(q * len(took)))] * 1000  # noqa: E731
            print(f"{mode:<10} {n:>5} {statistics.median(took) * 1000:>8.2f} {p(0.99):>8.2f} {took[-1] * 1000:>8.2f}")


if __name__ == "__main__":
    main()
