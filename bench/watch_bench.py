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

- the floor, measured in the same run on the same bytes: a fresh process with the
  same imports lists every kind through the same client and page size, decodes
  each page keeping a minimal record per object (namespace and name), nothing
  else, with the fastest decoder at hand (msgspec reading only those fields;
  orjson's full decode of the same pages is timed beside it, not counted); then
  reads the burst's events from the same watch history the same way. Each figure
  is printed beside it as a ratio (guard / floor; for events/s, floor / guard),
  which is what makes runs on a busy machine comparable;
- admission latency during a relist: every kind's watch gets a 410 at once and
  all four relist, while a thread beside them calls ``policy.decide`` on a
  launcher pod every 2 ms (the work of one admission request; the latency runs
  from when the request was due, so waiting for the GIL counts). Measured with
  the collector running as it always does, and with the collector paused for
  the whole process during the relist, the trade-off a pause would make.

Targets: ready <= 20 s, RSS <= 350 MB, >= 30,000 events/s.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

import msgspec

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
        elif cmd == "expire":
            api.compact(expire_watches=True)
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


# ---- the floor (a fresh process) ---------------------------------------------------------------------------------


class _Names(msgspec.Struct):
    name: str = ""
    namespace: str = ""


class _Named(msgspec.Struct):
    metadata: _Names = msgspec.field(default_factory=_Names)


class _ListMeta(msgspec.Struct):
    continue_: str = msgspec.field(default="", name="continue")


class _NamesList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_Named] = []


class _EventNames(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""


class _EventObject(msgspec.Struct):
    metadata: _EventNames = msgspec.field(default_factory=_EventNames)


class _Event(msgspec.Struct):
    type: str = ""
    object: _EventObject = msgspec.field(default_factory=_EventObject)


def _floor(conn, url: str, from_rv: dict[str, str], last_rv: dict[str, int]) -> None:
    import orjson
    from kubernetes import client

    from app.cluster.informer import SPECS, LoopOptions  # the guard side's imports: the same baseline

    lean, lean_event = msgspec.json.Decoder(_NamesList), msgspec.json.Decoder(_Event)
    gc.collect()
    baseline = rss_mb()
    cfg = client.Configuration()
    cfg.host, cfg.retries = url, False
    api = client.ApiClient(cfg)
    opts = LoopOptions()
    kept: list[tuple] = []
    orjson_cpu = msgspec_cpu = compare_s = 0.0
    candidates = {"orjson_records": 0.0, "msgspec_records": 0.0}
    began = time.monotonic()
    for kind in ("vmi", "vmim", "pod", "node"):
        token = ""
        while True:
            kw = {"limit": opts.page_size, "_preload_content": False,
                  "_request_timeout": (opts.connect_timeout, opts.list_timeout)}
            if token:
                kw["_continue"] = token
            resp = SPECS[kind].call(api, kw)
            data = resp.data
            resp.release_conn()
            c0 = time.process_time()
            page = lean.decode(data)
            kept += [(item.metadata.namespace, item.metadata.name) for item in page.items]
            c1 = time.process_time()
            orjson.loads(data)  # for comparison only: not part of the floor
            c2 = time.process_time()
            orjson_cpu += c2 - c1
            msgspec_cpu += c1 - c0
            typed = SPECS[kind].typed
            if typed is not None:  # the two ways to records, on the same page: not part of the floor either
                [SPECS[kind].parse(item) for item in orjson.loads(data)["items"]]
                c3 = time.process_time()
                [typed.build(item) for item in typed.page.decode(data).items]
                c4 = time.process_time()
                candidates["orjson_records"] += c3 - c2
                candidates["msgspec_records"] += c4 - c3
                c2 = c4
            compare_s += c2 - c1
            token = page.metadata.continue_
            if not token:
                break
    list_s = time.monotonic() - began - compare_s
    rss = rss_mb()
    events, burst_s = 0, 0.0
    for kind, rv in from_rv.items():
        if kind not in last_rv:
            continue
        began = time.monotonic()
        resp = SPECS[kind].call(api, {"watch": True, "resource_version": rv, "allow_watch_bookmarks": True,
                                      "timeout_seconds": 120, "_preload_content": False,
                                      "_request_timeout": (opts.connect_timeout, 120)})
        pending, done = b"", False
        for chunk in resp.stream(None, decode_content=True):
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line:
                    continue
                event = lean_event.decode(line)
                meta = event.object.metadata
                kept.append((event.type, meta.namespace, meta.name))
                if event.type != "BOOKMARK":
                    events += 1
                if int(meta.resourceVersion) >= last_rv[kind]:
                    done = True
                    break
            if done:
                break
        resp.release_conn()
        burst_s += time.monotonic() - began
    conn.send({"list_s": list_s, "orjson_cpu_s": orjson_cpu, "msgspec_cpu_s": msgspec_cpu, "rss_mb": rss,
               "rss_baseline_mb": baseline, "objects": len(kept) - events, "burst_events": events,
               "burst_s": burst_s, "candidates": candidates})


def measure_floor(url: str, from_rv: dict[str, str], last_rv: dict[str, int]) -> dict:
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_floor, args=(theirs, url, from_rv, last_rv), daemon=True)
    proc.start()
    deadline = time.monotonic() + 600
    while not ours.poll(0.5):
        if not proc.is_alive() or time.monotonic() > deadline:
            raise SystemExit(f"the floor process ended without a result (exit code {proc.exitcode})")
    result = ours.recv()
    proc.join(10)
    return result


# ---- admission latency during a relist -----------------------------------------------------------------------


class Probe:
    """Calls ``decide`` every ``period`` in a thread; records how late each answer was against when it was due."""

    def __init__(self, watch, pod: tuple[str, str], period: float = 0.002) -> None:
        from app.policy import decide
        from app.policy.model import EvictionAttempt, PolicySettings

        self.watch, self.period, self.decide = watch, period, decide
        self.req = EvictionAttempt("CREATE", "pods", "eviction", *pod)
        self.settings = PolicySettings()
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set():
            due += self.period
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            self.decide(self.req, self.watch.store, time.time(), self.settings, self.watch.health())
            late = time.perf_counter() - due
            self.samples.append(late)
            if late > self.period:
                due = time.perf_counter()  # requests arrive at their own pace, not to catch up

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def summary(self) -> dict:
        xs = sorted(self.samples)

        def q(p: float) -> float:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 2) if xs else float("nan")

        return {"requests": len(xs), "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": q(1.0)}


def _list_counter(watch, kinds: list[str]) -> dict[str, int]:
    """How many lists each kind has completed, counted from now on (installed once per watch)."""
    counts = getattr(watch, "bench_lists", None)
    if counts is None:
        counts = watch.bench_lists = {k: 0 for k in kinds}
        for inf in watch.informers:
            if inf.spec.kind in counts:
                def listed(original=inf.status.listed, kind=inf.spec.kind) -> None:
                    original()
                    counts[kind] += 1

                inf.status.listed = listed
    return counts


def relist_latency(watch, parent_conn, pause_collector: bool) -> dict:
    kinds = [s.kind for s in watch.board.statuses.values()]
    counts = _list_counter(watch, kinds)
    before = dict(counts)
    pod = next(iter(sorted(p.key for p in watch.store.pods()[:1])))
    with Probe(watch, pod) as idle:
        time.sleep(3)
    if pause_collector:
        gc.disable()
    began = time.monotonic()
    with Probe(watch, pod) as busy:
        parent_conn.send(("expire", None))
        parent_conn.recv()
        while any(counts[k] == before[k] for k in kinds):
            if time.monotonic() - began > 600:
                raise SystemExit("relist not done within 600 s")
            time.sleep(0.01)
        relist_s = time.monotonic() - began
    if pause_collector:
        gc.enable()
    return {"collector": "paused" if pause_collector else "running", "relist_s": round(relist_s, 2),
            "idle": idle.summary(), "during": busy.summary(), "rss_mb": round(rss_mb())}


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

    logging.basicConfig(level=os.environ.get("WATCH_BENCH_LOG", "WARNING"))
    cfg = client.Configuration()
    cfg.host = info["url"]
    cfg.retries = False
    gc.collect()
    baseline = rss_mb()
    watch = ClusterWatch(client.ApiClient(cfg), metrics=Metrics())
    collections = [0, 0, 0]
    collector_s = [0.0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1
            collector_s[0] -= time.perf_counter()
        else:
            collector_s[0] += time.perf_counter()

    gc.callbacks.append(count)
    began, cpu0 = time.monotonic(), time.process_time()
    watch.start()
    if not watch.wait_synced(300):
        raise SystemExit("not synced within 300 s")
    ready_s = time.monotonic() - began
    ready_cpu = time.process_time() - cpu0
    gc.callbacks.remove(count)
    counts = watch.store.counts()
    rss_synced = rss_mb()
    gc.collect()
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss_after_gc = rss_mb()
    state_mb = rss_after_gc - baseline
    print(f"ready in {ready_s:.1f} s, {ready_cpu:.1f} s of CPU on the guard's side ({counts}); the cyclic "
          f"collector ran {collections} times by generation, {collector_s[0]:.2f} s in all")
    print(f"RSS after sync: {rss_synced:.0f} MB (after gc {rss_after_gc:.0f} MB; baseline after imports "
          f"{baseline:.0f} MB; cluster state ~{state_mb:.0f} MB = {state_mb * 1024 * 1024 / sum(counts.values()):.0f} "
          f"bytes/object)")

    # burst: events queued at the server, then released
    from_rv = {inf.spec.kind: inf.resource_version for inf in watch.informers if inf.resource_version}
    parent_conn.send(("hold", None))
    parent_conn.recv()
    parent_conn.send(("churn", args.events))
    made = parent_conn.recv()
    parent_conn.send(("release", None))
    parent_conn.recv()
    released = time.monotonic()
    done = _wait_applied(watch, made["last"], timeout=600)
    burst_rate = args.events / (done - released)
    burst_last = made["last"]
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

    floor = measure_floor(info["url"], from_rv, burst_last)
    floor_rate = floor["burst_events"] / floor["burst_s"]
    ratios = {"ready": round(ready_s / floor["list_s"], 2), "rss": round(rss_synced / floor["rss_mb"], 2),
              "burst": round(floor_rate / burst_rate, 2)}
    print(f"floor (same bytes, decoded for a minimal record, nothing else): list {floor['list_s']:.1f} s "
          f"(decode {floor['msgspec_cpu_s']:.1f} s of CPU with msgspec reading only the names; orjson would take "
          f"{floor['orjson_cpu_s']:.1f} s), {floor['rss_mb']:.0f} MB RSS, burst {floor_rate:,.0f} events/s")
    print(f"guard / floor: ready {ratios['ready']}x, RSS {ratios['rss']}x, burst {ratios['burst']}x slower")
    cand = floor["candidates"]
    print(f"records of VMIs, VMIMs and pods from the same pages: orjson + *_from_object {cand['orjson_records']:.1f} s "
          f"of CPU, msgspec Structs + *_from_wire {cand['msgspec_records']:.1f} s")

    relists = [relist_latency(watch, parent_conn, pause) for pause in (False, True)]
    for r in relists:
        print(f"relist of every kind, collector {r['collector']}: {r['relist_s']} s; decide() answered "
              f"p50 {r['during']['p50_ms']} ms, p99 {r['during']['p99_ms']} ms, max {r['during']['max_ms']} ms "
              f"(idle before: p99 {r['idle']['p99_ms']} ms, max {r['idle']['max_ms']} ms); RSS after {r['rss_mb']} MB")

    watch.stop()
    parent_conn.send(("stop", None))
    child.join(10)
    results = {
        "vmis": args.vmis, "pods": args.vmis, "vmims": args.vmims, "objects": counts,
        "json_bytes_per_object": info["json_bytes"], "ready_seconds": round(ready_s, 2), "ready_cpu_seconds": round(ready_cpu, 2),
        "list_collections": collections, "list_collector_seconds": round(collector_s[0], 2),
        "rss_after_sync_mb": round(rss_synced), "rss_baseline_mb": round(baseline),
        "rss_after_gc_mb": round(rss_after_gc),
        "state_bytes_per_object": round(state_mb * 1024 * 1024 / sum(counts.values())),
        "burst_events_per_second": round(burst_rate), "live_events_per_second": round(live_rate),
        "rss_end_mb": round(rss_end), "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "cpus": os.cpu_count(),
        "floor": {"list_seconds": round(floor["list_s"], 2), "orjson_decode_cpu_seconds": round(floor["orjson_cpu_s"], 2),
                  "msgspec_names_cpu_seconds": round(floor["msgspec_cpu_s"], 2), "rss_mb": round(floor["rss_mb"]),
                  "rss_baseline_mb": round(floor["rss_baseline_mb"]), "burst_events_per_second": round(floor_rate)},
        "records_cpu_seconds": {k: round(v, 2) for k, v in floor["candidates"].items()},
        "vs_floor": ratios,
        "relist": relists,
        "targets_met": {"ready_le_20s": ready_s <= 20, "rss_le_350mb": rss_synced <= 350,
                        "events_ge_30000_per_s": burst_rate >= 30000},
    }
    out = Path(args.json) if args.json else ROOT / "bench/results/watch.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"targets: {results['targets_met']}  (written to {out})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
