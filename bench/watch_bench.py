"""Benchmark: list a large synthetic cluster through the real client, then apply a stream of watch events.

    make bench-watch                       # 100,000 VMIs, 100,000 pods, 500,000 VMIMs, 200,000 events
    python bench/watch_bench.py --vmis 10000 --vmims 50000 --events 50000   # smaller, quicker

The fake API server (tests.fakeapi) runs in a child process, so its CPU and
memory are not counted against the guard's. The parent is the guard's side:
the four list+watch loops (``ClusterWatch``) with their default options, the
real ``kubernetes`` client, over HTTP on 127.0.0.1.

Printed:
- time to ready: from starting the loops until every kind has been listed;
- RSS after sync: resident memory of this process (the guard's side only), and
  how much of it the cluster state added over the baseline after imports;
- events applied per second, two ways:
  * burst: the server holds the watch streams while it makes N changes, then
    releases them; the clock runs from the release until the store has applied
    the last one. This is the consumer's own speed (what a watch resuming after
    a disconnect sees), not limited by how fast the fake can produce changes.
  * live: the fake makes N changes while the loops consume them; bounded by the
    producer on a 2-core machine, shown for context.

Targets: ready < 30 s, RSS < 400 MB, >= 20,000 events/s.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODES = 200
NAMESPACES = 50
T0 = 1_790_000_000.0  # a fixed epoch for synthetic timestamps


# ---- the fake API server's side (child process) ---------------------------------------------------------


def _uid(kind: str, i: int) -> str:
    return f"{kind:0>8.8}-0000-4000-8000-{i:012d}"


def _cluster(vmis: int, vmims: int):
    from tests.fakeapi import objects as o

    for n in range(NODES):
        yield o.node(f"worker-{n:03d}", uid=_uid("node", n))
    per_vmi = max(1, vmims // max(vmis, 1))
    for i in range(vmis):
        ns, name, node = f"ns-{i % NAMESPACES:02d}", f"vm-{i:06d}", f"worker-{i % NODES:03d}"
        vmi_uid = _uid("vmi", i)
        yield o.vmi(ns, name, node=node, uid=vmi_uid, created=T0,
                    migration=o.migration_state(T0 + 100, T0 + 160, f"worker-{(i + 1) % NODES:03d}", node,
                                                _uid("vmim", i * per_vmi)))
        yield o.launcher_pod(ns, name, node, name=f"virt-launcher-{name}-abcde", vmi_uid=vmi_uid, uid=_uid("pod", i))
    for j in range(vmims):
        i = j % max(vmis, 1)
        ns, vmi_name = f"ns-{i % NAMESPACES:02d}", f"vm-{i:06d}"
        yield o.vmim(ns, f"{vmi_name}-mig-{j // max(vmis, 1)}", vmi_name, phase="Succeeded", start=T0 + j,
                     end=T0 + j + 60, source_node=f"worker-{(i + 1) % NODES:03d}", target_node=f"worker-{i % NODES:03d}",
                     uid=_uid("vmim", j), created=T0 + j - 5)


def _churn(api, n: int, seq: int, vmis: int, vmims: int) -> dict[str, int]:
    """n changes spread over VMIMs (new and finished migrations), VMIs and pods. Returns the last rv per kind."""
    from tests.fakeapi import objects as o

    last: dict[str, int] = {}
    for k in range(n):
        i = (seq * n + k) % vmis
        ns, name, node = f"ns-{i % NAMESPACES:02d}", f"vm-{i:06d}", f"worker-{i % NODES:03d}"
        pick = k % 4
        if pick in (0, 1):
            obj = o.vmim(ns, f"{name}-live-{seq}-{k}", name, phase="Running" if pick == 0 else "Succeeded",
                         start=T0 + k, end=None if pick == 0 else T0 + k + 30, source_node=node,
                         uid=_uid("live", seq * n + k), created=T0 + k)
            kind = "vmim"
        elif pick == 2:
            obj = o.vmi(ns, name, node=node, uid=_uid("vmi", i), created=T0,
                        migration=o.migration_state(T0 + k, None, node, "worker-x", _uid("live", k)))
            kind = "vmi"
        else:
            obj = o.launcher_pod(ns, name, node, name=f"virt-launcher-{name}-abcde", vmi_uid=_uid("vmi", i),
                                 uid=_uid("pod", i), extra_annotations={"bench/seq": str(seq * n + k)})
            kind = "pod"
        stored = api.put(obj)
        last[kind] = int(stored["metadata"]["resourceVersion"])
    return last


def _server(conn, vmis: int, vmims: int) -> None:
    from tests.fakeapi import FakeApiServer

    api = FakeApiServer(record_requests=False, bookmark_interval=60).start()
    began = time.monotonic()
    n = api.load(_cluster(vmis, vmims), copy_objects=False)
    sizes = {}
    for kind in ("vmi", "pod", "vmim"):
        objs = api._state.objects[__import__("tests.fakeapi.resources", fromlist=["x"]).resolve(kind)]
        sample = list(objs.values())[:1000]
        sizes[kind] = int(sum(len(x.raw) for x in sample) / max(len(sample), 1))
    gc.collect()
    conn.send({"url": api.url, "objects": n, "generate_s": round(time.monotonic() - began, 1), "json_bytes": sizes})
    seq = 0
    while True:
        cmd, arg = conn.recv()
        if cmd == "stop":
            api.stop()
            return
        if cmd == "hold":
            api.hold_streams()
            conn.send(True)
        elif cmd == "release":
            api.release_streams()
            conn.send(True)
        elif cmd == "churn":
            seq += 1
            began = time.monotonic()
            last = _churn(api, arg, seq, vmis, vmims)
            conn.send({"last": last, "seconds": time.monotonic() - began})


# ---- the guard's side (this process) ------------------------------------------------------------------------


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _applied(watch, last: dict[str, int]) -> bool:
    for kind, rv in last.items():
        cur = watch.informer(kind).resource_version
        if cur is None or int(cur) < rv:
            return False
    return True


def _wait_applied(watch, last: dict[str, int], timeout: float) -> float:
    began = time.monotonic()
    while not _applied(watch, last):
        if time.monotonic() - began > timeout:
            raise SystemExit(f"events not applied within {timeout}s")
        time.sleep(0.002)
    return time.monotonic()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vmis", type=int, default=100_000, help="VMIs (and as many virt-launcher pods)")
    p.add_argument("--vmims", type=int, default=500_000)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--json", metavar="FILE", help="also write the numbers as JSON here")
    args = p.parse_args()

    load_before = os.getloadavg()[0]
    ctx = mp.get_context("fork")  # fork before the client and its threads exist
    parent_conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_server, args=(child_conn, args.vmis, args.vmims), daemon=True)
    child.start()
    print(f"generating {args.vmis:,} VMIs, {args.vmis:,} pods, {args.vmims:,} VMIMs in the fake API server...",
          flush=True)
    info = parent_conn.recv()
    print(f"  {info['objects']:,} objects in {info['generate_s']}s; mean JSON size per object: {info['json_bytes']}")

    import logging

    from kubernetes import client

    from app.cluster.informer import ClusterWatch
    from app.metrics import Metrics

    logging.basicConfig(level=logging.WARNING)
    cfg = client.Configuration()
    cfg.host = info["url"]
    cfg.retries = False
    gc.collect()
    baseline = rss_mb()
    watch = ClusterWatch(client.ApiClient(cfg), metrics=Metrics())
    began, cpu0 = time.monotonic(), time.process_time()
    watch.start()
    if not watch.wait_synced(300):
        raise SystemExit("not synced within 300 s")
    ready_s = time.monotonic() - began
    ready_cpu = time.process_time() - cpu0
    counts = watch.store.counts()
    rss_synced = rss_mb()
    gc.collect()
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss_after_gc = rss_mb()
    state_mb = rss_after_gc - baseline
    print(f"ready in {ready_s:.1f} s, {ready_cpu:.1f} s of CPU on the guard's side ({counts})")
    print(f"RSS after sync: {rss_synced:.0f} MB (after gc {rss_after_gc:.0f} MB; baseline after imports "
          f"{baseline:.0f} MB; cluster state ~{state_mb:.0f} MB = {state_mb * 1024 * 1024 / sum(counts.values()):.0f} "
          f"bytes/object)")

    # burst: events queued at the server, then released
    parent_conn.send(("hold", None))
    parent_conn.recv()
    parent_conn.send(("churn", args.events))
    made = parent_conn.recv()
    parent_conn.send(("release", None))
    parent_conn.recv()
    released = time.monotonic()
    done = _wait_applied(watch, made["last"], timeout=600)
    burst_rate = args.events / (done - released)
    print(f"burst: {args.events:,} events applied in {done - released:.2f} s = {burst_rate:,.0f} events/s")

    # live: produced and consumed at the same time
    live_n = max(1, args.events // 4)
    began = time.monotonic()
    parent_conn.send(("churn", live_n))
    made = parent_conn.recv()
    done = _wait_applied(watch, made["last"], timeout=600)
    live_rate = live_n / (done - began)
    print(f"live:  {live_n:,} events in {done - began:.2f} s = {live_rate:,.0f} events/s "
          f"(the fake produced them at {live_n / made['seconds']:,.0f}/s)")
    rss_end = rss_mb()
    print(f"RSS at the end: {rss_end:.0f} MB")

    watch.stop()
    parent_conn.send(("stop", None))
    child.join(10)
    results = {
        "vmis": args.vmis, "pods": args.vmis, "vmims": args.vmims, "objects": counts,
        "json_bytes_per_object": info["json_bytes"], "ready_seconds": round(ready_s, 2), "ready_cpu_seconds": round(ready_cpu, 2),
        "rss_after_sync_mb": round(rss_synced), "rss_baseline_mb": round(baseline),
        "rss_after_gc_mb": round(rss_after_gc),
        "state_bytes_per_object": round(state_mb * 1024 * 1024 / sum(counts.values())),
        "burst_events_per_second": round(burst_rate), "live_events_per_second": round(live_rate),
        "rss_end_mb": round(rss_end), "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "cpus": os.cpu_count(),
        "targets_met": {"ready_lt_30s": ready_s < 30, "rss_lt_400mb": rss_synced < 400,
                        "events_ge_20000_per_s": burst_rate >= 20000},
    }
    out = Path(args.json) if args.json else ROOT / "bench/results/watch.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"targets: {results['targets_met']}  (written to {out})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
