"""What steering's refusals cost: refusals per eviction let through, and the guard's API writes per refusal.

    .venv/bin/python -m bench.refusal_cost [CYCLES] [CYCLE_SECONDS] [EVENT_INTERVAL]

The real guard (``serve``, TLS, side effects on) watches tests.fakeapi and steers with a real Prometheus
(tests/prometheus_support.py: worker-a hot with VMs db, web, big; big is the move that helps most), found from a
descheduler policy ConfigMap as in a cluster. Each cycle plays the descheduler's LowNodeUtilization pass over
worker-a: its three launcher pods in a seeded random order, one eviction request each until one is allowed (an
ordinary 429 makes the descheduler try its next pod). Nothing migrates, so every cycle starts over. Counted from the
fake API server's request log over the cycles: the guard's Event writes (POST and PATCH of core/v1 events) and its
other non-watch requests. Event writes per refusal depend on the cycle against ``--event-interval`` (one write per
series and interval), so both are arguments; counts, not timings, are the result.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from tests.builders import node, pod, vmi
from tests.fakeapi import FakeApiServer
from tests.guard_process import GuardProcess
from tests.live_support import eventually, evict, reason, scrape
from tests.prometheus_support import start_prometheus

VMS = ("db", "web", "big")
OBJECTS = [node("worker-a"), node("worker-b"), node("worker-c", cordoned=True),
           *(o for name in VMS for o in (vmi(name, "worker-a"), pod(name, "worker-a"))),
           vmi("calm", "worker-b"), pod("calm", "worker-b")]
POLICY = ('{"apiVersion": "descheduler/v1alpha2", "kind": "DeschedulerPolicy", '
          '"metricsProviders": [{"source": "Prometheus", "prometheus": {"url": "%s"}}]}')


def measure(cycles: int, cycle_seconds: float, event_interval: str, seed: int = 1) -> dict:
    work = Path(tempfile.mkdtemp(prefix="refusal-cost-"))
    prometheus = start_prometheus(work / "prometheus")
    try:
        with FakeApiServer() as api:
            api.load(OBJECTS)
            api.put({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"namespace": "kube-system", "name": "descheduler"},
                     "data": {"policy.yaml": POLICY % prometheus.url}})
            g = GuardProcess(work, ["--kubeconfig", str(api.write_kubeconfig(work / "kubeconfig")),
                                    "--shutdown-drain", "0s", "--no-descheduler-check", "--no-history-annotation",
                                    "--no-cancel-stuck-evacuations", "--event-interval", event_interval,
                                    "--prometheus-interval", "1s", "--prometheus-max-age", "10m"])
            try:
                g.wait_healthy()
                with g.client() as http:
                    eventually(lambda: scrape(http).get(("kubevirt_eviction_guard_steering_state",
                                                         frozenset({("state", "on")}))) == 1.0,
                               timeout=30, what="steering on")
                    start = len(api.requests)
                    rng = random.Random(seed)
                    refused = allowed = 0
                    reasons: dict[str, int] = {}
                    for _ in range(cycles):
                        began = time.monotonic()
                        order = list(VMS)
                        rng.shuffle(order)
                        for vm in order:
                            r = evict(http, f"virt-launcher-{vm}-abcde")
                            reasons[reason(r)] = reasons.get(reason(r), 0) + 1
                            if r["allowed"]:
                                allowed += 1
                                break
                            refused += 1
                        time.sleep(max(0.0, cycle_seconds - (time.monotonic() - began)))
                    time.sleep(2.0)  # let the last queued writes leave
                    done = list(api.requests)[start:]
            finally:
                g.stop()
    finally:
        prometheus.stop()
    writes = [q for q in done if "/events" in q.path and q.method in ("POST", "PATCH")]
    other = [q for q in done if not q.watch and q not in writes]
    return {"cycles": cycles, "cycleSeconds": cycle_seconds, "eventInterval": event_interval, "refused": refused,
            "allowed": allowed, "reasons": reasons, "eventWrites": len(writes),
            "otherRequests": sorted({f"{q.method} {q.path}" for q in other}), "otherRequestCount": len(other)}


def main(argv: list[str]) -> int:
    cycles = int(argv[0]) if argv else 20
    cycle_seconds = float(argv[1]) if len(argv) > 1 else 1.0
    event_interval = argv[2] if len(argv) > 2 else "1s"
    m = measure(cycles, cycle_seconds, event_interval)
    per = m["refused"] / m["allowed"] if m["allowed"] else float("inf")
    print(f"cycles {m['cycles']} every {m['cycleSeconds']}s, --event-interval {m['eventInterval']}: "
          f"{m['refused']} refused, {m['allowed']} let through ({per:.2f} refusals per eviction let through); "
          f"decisions {m['reasons']}")
    print(f"guard API writes: {m['eventWrites']} Event writes ({m['eventWrites'] / max(1, m['refused']):.2f} per "
          f"refusal); other non-watch requests {m['otherRequestCount']}: {m['otherRequests']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
