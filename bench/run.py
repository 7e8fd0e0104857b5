"""``make bench``: the guard next to a plain uvicorn + FastAPI endpoint, under the same load, for each request mix.

Steps (each bounded in time):
  1. build a synthetic cluster (``bench.state``) and write it as a ``--snapshot``
     file, and for each mix (``bench.mixes``: what clusters send, each named) the
     eviction bodies aimed at it (``bench.bodies``), in a temp dir;
  2. time ``policy.decide`` alone on that state per mix, and write the policy's
     answer to every body, for the baseline (``bench.decide``, own process);
  3. start the real guard (``python -m app serve``, TLS with certificates from
     ``app.transport.tls.issue_certs``, the snapshot, production defaults: info logs, side
     effects on), the baseline (``bench.plain``: what a user would compare
     against, a plain FastAPI route served by plain ``uvicorn --ssl-*`` with its
     defaults, answering each review as the guard does: the same bytes out), and two references on the guard's own ``serve`` (``bench.baseline``:
     "stack", a bare FastAPI route answering a constant; ``bench.floor``: the
     guard's bare ASGI endpoint answering it), each with its output read
     through a pipe into a file, as a container runtime would;
  4. per mix, per round, for each load phase (saturation, then each fixed rate),
     run the guard and the baseline one after the other (alternating who goes
     first; the two references at saturation and in the first mix only: they
     answer a constant whatever the mix):
     saturation with wrk (C, closed loop) when it is installed, else the Python
     generator in closed loop; fixed rates with the Python open-loop generator
     (``bench.loadgen``: latency from the intended send time);
  5. read the guard's decisions per mix from its /metrics, the servers' RSS, and
     the CPU each process used (server CPU per request is the figure least
     disturbed by other work on the machine; the generator's CPU share shows
     whether it, rather than the server, was the limit);
  6. print the table and write everything to ``bench/results/bench-<time>.json``
     (and ``latest.json``).

    python -m bench.run [--vmis 100000] [--mixes fixtures,descheduler,outcome] [--rounds 6] [--duration 3]
                        [--rates 500,1000] [--profile] [--guard-arg=--no-side-effects]
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import os
import platform
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from app.transport.tls import issue_certs, write_certs
from bench.bodies import build_bodies, write_bodies
from bench.loadgen import percentiles
from bench.mixes import DEFAULT as DEFAULT_MIXES
from bench.mixes import MIXES
from bench.state import NOW_TEXT, build_state, write_snapshot

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HOST = "127.0.0.1"
TARGETS = ("guard", "baseline", "stack", "floor")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GOALS = {
    "throughput_ratio_min": 1.0,  # guard/baseline (plain uvicorn + FastAPI) requests per second at saturation
    "p99_ratio_max": 1.2,  # guard/baseline p99 at 1,000 requests/s offered
    "decide_median_us_max": 20.0,
    "rss_mb_max": 400.0,
}


class BenchError(RuntimeError):
    pass


# ---- servers -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    argv: list[str]
    log_path: Path
    port: int
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = None
    started_s: float = 0.0
    _drain: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env={**os.environ, **(self.env or {})})
        self._drain = threading.Thread(target=self._copy_output, daemon=True)
        self._drain.start()
        self._t0 = t0

    def _copy_output(self) -> None:
        """Read the server's output as a container runtime would: through a pipe, into a file."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with self.log_path.open("wb") as out:
            while chunk := os.read(fd, 1 << 16):
                out.write(chunk)

    def wait_ready(self, ctx: ssl.SSLContext, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}:\n{self.tail()}")
            try:
                status, _ = request(ctx, self.port, "GET", "/healthz")
                if status == 200:
                    self.started_s = time.perf_counter() - self._t0
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise BenchError(f"{self.name} not serving after {timeout:.0f}s; see {self.log_path}:\n{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_s(self) -> float:
        """User + system CPU seconds so far (/proc/PID/stat, fields 14 and 15)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()  # type: ignore[union-attr]
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def memory_mb(self) -> dict[str, float]:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()  # type: ignore[union-attr]
        out = {}
        for key in ("VmRSS", "VmHWM"):
            m = re.search(rf"^{key}:\s+(\d+) kB", status, re.M)
            out[key] = int(m.group(1)) / 1024 if m else float("nan")
        return {"rss_mb": out["VmRSS"], "peak_rss_mb": out["VmHWM"]}

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=25)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        if self._drain is not None:
            self._drain.join(timeout=5)


def request(ctx: ssl.SSLContext, port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection(HOST, port, context=ctx, timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# ---- load --------------------------------------------------------------------


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_wrk(port: int, bodies: Path, duration: float, connections: int) -> dict:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "10s",
            "-s", str(HERE / "wrk.lua"), f"https://{HOST}:{port}", "--", str(bodies)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30, cwd=HERE)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRK_RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise BenchError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    raw = orjson.loads(line.removeprefix("WRK_RESULT "))
    seconds = raw["duration_us"] / 1e6
    errors = {k: v for k, v in raw["errors"].items() if v}
    return {
        "mode": "closed", "tool": "wrk", "connections": connections, "duration_s": seconds,
        "completed": raw["requests"], "achieved_rps": raw["requests"] / seconds, "errors": errors,
        "latency_ms": {k: v / 1e3 for k, v in raw["latency_us"].items()},
    }


def run_loadgen(port: int, cafile: Path, bodies: Path, duration: float, connections: int,
                rate: float | None, samples: Path | None = None) -> dict:
    argv = [sys.executable, "-m", "bench.loadgen", "--host", HOST, "--port", str(port), "--cafile", str(cafile),
            "--bodies", str(bodies), "--duration", str(duration), "--connections", str(connections)]
    argv += ["--rate", str(rate)] if rate else ["--closed"]
    argv += ["--samples", str(samples)] if samples else []
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60, cwd=ROOT)
    if out.returncode != 0:
        raise BenchError(f"load generator failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    result = orjson.loads(out.stdout.strip().splitlines()[-1])
    if samples:
        latencies = array("d")
        with samples.open("rb") as f:
            latencies.frombytes(f.read())
        result["_latencies"] = latencies.tolist()
    return result


def load_phase(server: Server, phase: str, args: argparse.Namespace, files: dict[str, Path]) -> dict:
    cpu0, client0, wall0 = server.cpu_s(), children_cpu_s(), time.perf_counter()
    if phase == "saturation":
        if args.saturation_tool == "wrk":
            result = run_wrk(server.port, files["bodies"], args.duration, args.connections)
        else:
            result = run_loadgen(server.port, files["ca"], files["bodies"], args.duration, args.connections, None)
    else:
        samples = files["tmp"] / f"latencies-{server.name}-{phase}.bin"
        result = run_loadgen(server.port, files["ca"], files["bodies"], args.duration, args.connections, float(phase),
                             samples)
    wall = time.perf_counter() - wall0
    server_cpu = server.cpu_s() - cpu0
    result.update(
        target=server.name, phase=phase, wall_s=wall,
        server_cpu_s=server_cpu, server_cpu_share=server_cpu / wall,
        server_cpu_us_per_request=server_cpu / result["completed"] * 1e6 if result["completed"] else None,
        client_cpu_s_total=children_cpu_s() - client0,
        **server.memory_mb(),
    )
    result["client_cpu_share_total"] = result["client_cpu_s_total"] / wall
    return result


# ---- the run -----------------------------------------------------------------


def prepare(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Path], dict]:
    t0 = time.perf_counter()
    issued = issue_certs("kubevirt-eviction-guard", "bench")
    paths = write_certs(issued, tmp / "certs")
    state = build_state(args.vmis, seed=args.seed)
    snapshot = tmp / "snapshot.json"
    size = write_snapshot(state, snapshot)
    files = {"ca": paths["ca"], "cert": paths["cert"], "key": paths["key"], "snapshot": snapshot, "tmp": tmp,
             "answers": tmp / "answers.json"}
    info: dict = {"objects": state.counts, "snapshot_mb": size / 1e6, "bodies": {}}
    for i, name in enumerate(args.mixes):
        bodies = build_bodies(state.targets, args.bodies, seed=args.seed + i, mix=MIXES[name])
        files[f"bodies:{name}"] = tmp / f"bodies-{name}.tsv"
        write_bodies(bodies, files[f"bodies:{name}"])
        info["bodies"][name] = len(bodies)
    info["build_s"] = time.perf_counter() - t0
    del state
    return files, info


def measure_decide(files: dict[str, Path], mixes: list[str], timeout: float) -> dict[str, dict]:
    """Per mix: ``policy.decide`` alone; and every body's answer written to ``files["answers"]`` for the baseline."""
    argv = [sys.executable, "-m", "bench.decide", "--snapshot", str(files["snapshot"]), "--now", NOW_TEXT,
            "--answers", str(files["answers"]), "--bodies", *(str(files[f"bodies:{m}"]) for m in mixes)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if out.returncode != 0:
        raise BenchError(f"bench.decide failed: {out.stderr.strip()[-2000:]}")
    return dict(zip(mixes, orjson.loads(out.stdout.strip().splitlines()[-1]), strict=True))


def serve_argv(module: str, files: dict[str, Path], port: int, quiet: bool = False,
               extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", module, "--log-format", "json", "--log-level", "warning" if quiet else "info", "serve",
            "--host", HOST, "--port", str(port), "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
            "--snapshot", str(files["snapshot"]), "--now", NOW_TEXT, *extra]


def plain_argv(files: dict[str, Path], port: int, quiet: bool = False) -> list[str]:
    """The baseline: plain uvicorn, its default settings (``quiet``: without its access log), TLS from the same
    pair."""
    return [sys.executable, "-m", "uvicorn", "bench.plain:app", "--host", HOST, "--port", str(port),
            "--ssl-keyfile", str(files["key"]), "--ssl-certfile", str(files["cert"]),
            *(["--no-access-log"] if quiet else [])]


def check_answers(ctx: ssl.SSLContext, guard: Server, baseline: Server, constant: list[Server], bodies: Path,
                  sample: int = 20) -> None:
    """The guard and the baseline answer the same reviews the same way (uid, allowed, status; checked on the
    mix's first ``sample`` bodies), and the references really answer their constant."""
    lines = bodies.read_bytes().splitlines()
    for line in lines[:sample]:
        path, _, body = line.partition(b"\t")
        uid = orjson.loads(body)["request"]["uid"]
        answers = []
        for server in (guard, baseline):
            status, answer = request(ctx, server.port, "POST", path.decode(), body)
            response = orjson.loads(answer).get("response", {}) if status == 200 else {}
            answers.append((status, response.get("uid"), response.get("allowed"),
                            (response.get("status") or {}).get("code")))
        if answers[0] != answers[1] or answers[0][1] != uid:
            raise BenchError(f"guard and baseline answered review {uid} differently (status, uid, allowed, code): "
                             f"{answers[0]} and {answers[1]}")
    path, _, body = lines[0].partition(b"\t")
    for server in constant:
        status, answer = request(ctx, server.port, "POST", path.decode(), body)
        got = orjson.loads(answer).get("response", {}).get("uid") if status == 200 else None
        if got != "baseline":
            raise BenchError(f"{server.name} answered {status} with uid {got!r}, expected 'baseline': {answer[:300]!r}")


def decision_counts(ctx: ssl.SSLContext, guard: Server) -> dict[str, float]:
    """The guard's decisions so far, by ``decision:reason`` (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = request(ctx, guard.port, "GET", "/metrics")
    if status != 200:
        raise BenchError(f"guard /metrics answered {status}")
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name == "kubevirt_eviction_guard_decisions":
            for s in family.samples:
                if s.name.endswith("_total"):
                    key = f"{s.labels['decision']}:{s.labels['reason']}"
                    counts[key] = counts.get(key, 0) + s.value
    return counts


def shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The decisions between two readings of ``decision_counts``, as shares, largest first."""
    counts = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    total = sum(counts.values()) or 1.0
    return {k: round(v / total, 4) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


def check_generator(baseline: Server, runs: list[dict], args: argparse.Namespace, files: dict[str, Path]) -> dict:
    """Is the load generator the limit? Its CPU share during the saturation runs (a
    generator short of CPU would show near 1.0 while the server idles), and, when wrk
    drives saturation, what the Python generator reaches against the same baseline."""
    sat = [r for r in runs if r["phase"] == "saturation" and r["target"] == "baseline"]
    out = {
        "saturation_tool": args.saturation_tool,
        "baseline_rps": statistics.median(r["achieved_rps"] for r in sat),
        "generator_cpu_share": statistics.median(r["client_cpu_share_total"] for r in sat),
        "server_cpu_share": statistics.median(r["server_cpu_share"] for r in sat),
    }
    if args.saturation_tool == "wrk":
        py = load_phase(baseline, "saturation", argparse.Namespace(**{**vars(args), "saturation_tool": "python"}), files)
        out.update(python_closed_loop_rps=py["achieved_rps"], python_generator_cpu_share=py["client_cpu_share_total"],
                   python_server_cpu_share=py["server_cpu_share"])
    return out


def profile_guard(guard: Server, args: argparse.Namespace, files: dict[str, Path], out: Path) -> dict:
    """py-spy on the guard during one extra saturation run: collapsed stacks, and the top frames."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        return {"error": "py-spy not installed"}
    spy = subprocess.Popen([pyspy, "record", "--pid", str(guard.proc.pid), "--rate", "250", "--format", "raw",  # type: ignore[union-attr]
                            "--duration", str(max(1, round(args.duration))), "--output", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    load_phase(guard, "saturation", args, files)
    try:
        _, err = spy.communicate(timeout=args.duration + 30)
    except subprocess.TimeoutExpired:
        spy.kill()
        return {"error": "py-spy did not finish"}
    if spy.returncode != 0 or not out.exists():
        return {"error": f"py-spy failed: {err.strip()[-500:]}"}
    return summarise_profile(out)


def summarise_profile(path: Path, top: int = 15) -> dict:
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        if re.search(r"(Condition|Event)\.wait \(threading\.py:\d+\)$", stack):
            continue  # the log writer thread sleeping between batches
        total += count
        frames = [re.sub(r" \(.*?(site-packages/|issue\d+/|/lib/python3\.\d+/)?([^/]*/?[^/]+:\d+)\)$", r" (\2)", f)
                  for f in stack.split(";")]
        frames = [re.sub(r":\d+\)$", ")", f) for f in frames]
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + count
    pick = lambda d: [(k, round(v / total, 4)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]  # noqa: E731
    return {"samples": total, "own": pick(own), "inclusive": pick(inclusive), "file": str(path)}


def summarise(runs: list[dict], decide: dict, memory: dict, rates: list[str]) -> dict:
    def med(target: str, phase: str, get) -> float | None:
        values = [get(r) for r in runs if r["target"] == target and r["phase"] == phase]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    out: dict = {}
    for target in TARGETS:
        t: dict = {"saturation_rps": med(target, "saturation", lambda r: r["achieved_rps"]),
                   "cpu_us_per_request": med(target, "saturation", lambda r: r["server_cpu_us_per_request"]),
                   "rss_mb": memory[target]["rss_mb"], "peak_rss_mb": memory[target]["peak_rss_mb"]}
        for rate in rates if target in ("guard", "baseline") else ():  # latency: every request of every round, pooled
            pooled = [x for r in runs if r["target"] == target and r["phase"] == rate for x in r.get("_latencies", ())]
            t[f"at_{rate}"] = {q: v for q, v in percentiles(pooled).items() if q != "mean"}
            t[f"at_{rate}"]["requests"] = len(pooled)
            t[f"at_{rate}"]["achieved_rps"] = med(target, rate, lambda r: r["achieved_rps"])
            t[f"at_{rate}"]["service_p99_median_of_rounds"] = med(
                target, rate, lambda r: (r.get("service_ms") or {}).get("p99"))
        out[target] = t
    g, b = out["guard"], out["baseline"]
    ratio = lambda x, y: (x / y) if x is not None and y else None  # noqa: E731
    top_rate = "1000" if "1000" in rates else rates[-1]
    out["ratios"] = {
        "throughput": ratio(g["saturation_rps"], b["saturation_rps"]),
        "cpu_per_request": ratio(g["cpu_us_per_request"], b["cpu_us_per_request"]),
        "throughput_guard_vs_stack": ratio(g["saturation_rps"], out["stack"]["saturation_rps"]),
        "cpu_per_request_guard_vs_stack": ratio(g["cpu_us_per_request"], out["stack"]["cpu_us_per_request"]),
        "throughput_guard_vs_floor": ratio(g["saturation_rps"], out["floor"]["saturation_rps"]),
        # the same ratios, median of the per-round ones (each round's guard and baseline ran back to back)
        "throughput_median_of_rounds": paired(runs, "achieved_rps"),
        "cpu_per_request_median_of_rounds": paired(runs, "server_cpu_us_per_request"),
        **{f"p99_at_{r}": ratio(g[f"at_{r}"]["p99"], b[f"at_{r}"]["p99"]) for r in rates},
        **{f"p99_at_{r}_median_of_rounds": paired(runs, "p99", r) for r in rates},
    }
    out["decide_median_us"] = decide["median_us"]
    out["targets"] = {
        "throughput_ratio": _goal(out["ratios"]["throughput"], GOALS["throughput_ratio_min"], ">="),
        f"p99_ratio_at_{top_rate}": _goal(out["ratios"][f"p99_at_{top_rate}"], GOALS["p99_ratio_max"], "<="),
        f"p99_ratio_at_{top_rate}_median_of_rounds": _goal(out["ratios"][f"p99_at_{top_rate}_median_of_rounds"],
                                                           GOALS["p99_ratio_max"], "<="),
        "decide_median_us": _goal(decide["median_us"], GOALS["decide_median_us_max"], "<"),
        "guard_rss_mb": _goal(g["rss_mb"], GOALS["rss_mb_max"], "<"),
    }
    return out


def paired(runs: list[dict], key: str, phase: str = "saturation") -> float | None:
    """Median over the rounds of guard/baseline in ``phase``, each round's pair measured back to back: a
    stall from outside (another process taking the CPU for tens of ms) spoils one round's pair, not the figure.
    ``key`` is a field of the run, or "p99" for its latency p99."""
    def get(r: dict) -> float | None:
        return r["latency_ms"]["p99"] if key == "p99" else r.get(key)

    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        if r["phase"] == phase and r["target"] in ("guard", "baseline") and get(r):
            by_round.setdefault(r.get("round", 0), {})[r["target"]] = get(r)
    ratios = [p["guard"] / p["baseline"] for p in by_round.values() if len(p) == 2]
    return statistics.median(ratios) if ratios else None


def _goal(value: float | None, goal: float, op: str) -> dict:
    if value is None:
        return {"value": None, "goal": f"{op} {goal}", "met": False}
    met = value >= goal if op == ">=" else value <= goal if op == "<=" else value < goal
    return {"value": round(value, 3), "goal": f"{op} {goal}", "met": met}


def fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def table(s: dict, decide: dict, rates: list[str]) -> str:
    """The results as a Markdown table (printed, and written into docs/performance.md by bench.doc)."""
    g, b, st, f, r = s["guard"], s["baseline"], s["stack"], s["floor"], s["ratios"]
    rows = [("requests/s at saturation", fmt(g["saturation_rps"], 0), fmt(b["saturation_rps"], 0),
             fmt(r["throughput"]), fmt(st["saturation_rps"], 0), fmt(f["saturation_rps"], 0)),
            ("  guard/baseline, median of the rounds' pairs", "", "", fmt(r["throughput_median_of_rounds"]), "", ""),
            ("server CPU us per request at saturation", fmt(g["cpu_us_per_request"], 1),
             fmt(b["cpu_us_per_request"], 1), fmt(r["cpu_per_request"]), fmt(st["cpu_us_per_request"], 1),
             fmt(f["cpu_us_per_request"], 1))]
    for rate in rates:
        for q in ("p50", "p90", "p99", "max"):
            rows.append((f"{q} ms at {rate} req/s offered", fmt(g[f"at_{rate}"][q]), fmt(b[f"at_{rate}"][q]),
                         fmt(r[f"p99_at_{rate}"]) if q == "p99" else "", "", ""))
            if q == "p99":
                rows.append(("  guard/baseline p99, median of the rounds' pairs", "", "",
                             fmt(r[f"p99_at_{rate}_median_of_rounds"]), "", ""))
    rows += [("RSS MB after the run", fmt(g["rss_mb"], 0), fmt(b["rss_mb"], 0), "", fmt(st["rss_mb"], 0),
              fmt(f["rss_mb"], 0)),
             ("peak RSS MB (snapshot load)", fmt(g["peak_rss_mb"], 0), fmt(b["peak_rss_mb"], 0), "", "", ""),
             ("policy.decide alone, median / mean us", f"{fmt(decide['median_us'])} / {fmt(decide['mean_us'])}",
              "", "", "", "")]
    head = ("", "guard", "baseline (plain uvicorn + FastAPI)", "guard/baseline", "stack (serve + FastAPI)",
            "floor (serve + bare ASGI)")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                          for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"
    out = [line(head), "|" + "|".join(("-" * (w + 1) + ":") if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|"]
    return "\n".join([*out, *(line(row) for row in rows)])


def print_table(mix: str, s: dict, decide: dict, rates: list[str], meta: dict, decisions: dict[str, float]) -> None:
    w = sys.stdout.write
    w(f"\nmix {mix}: {MIXES[mix].about}\n")
    w(f"kubevirt-eviction-guard bench: {meta['vmis']:,} VMIs, {meta['rounds']} round(s) x {meta['duration_s']}s "
      f"per phase, saturation by {meta['saturation_tool']}, latencies pooled over the rounds, "
      f"load average {meta['loadavg_before']} -> {meta['loadavg_after']}\n\n")
    w(table(s, decide, rates) + "\n\n")
    for name, t in s["targets"].items():
        w(f"  target {name:24} {fmt(t['value'], 3):>10}  goal {t['goal']:<10} {'met' if t['met'] else 'MISSED'}\n")
    w(f"  decisions at the guard: {', '.join(f'{k} {v:.1%}' for k, v in decisions.items())}\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--vmis", type=int, default=100_000)
    p.add_argument("--mixes", default=",".join(DEFAULT_MIXES),
                   help=f"request mixes to run, in order (bench/mixes.py: {', '.join(MIXES)})")
    p.add_argument("--bodies", type=int, default=None,
                   help="distinct AdmissionReview bodies per mix to cycle through (default: each mix's own)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--duration", type=float, default=3.0, help="seconds of load per phase and target")
    p.add_argument("--rates", default="500,1000", help="fixed offered rates, requests/s")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--saturation-tool", choices=("auto", "wrk", "python"), default="auto")
    p.add_argument("--profile", action="store_true", help="also run py-spy on the guard during a saturation run per mix")
    p.add_argument("--quiet", action="store_true",
                   help="the guard at --log-level warning, the baseline without its access log (no line per request)")
    p.add_argument("--guard-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for the guard's serve (e.g. --guard-arg=--no-side-effects), repeatable")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--seed", type=int, default=6)
    p.add_argument("--timeout", type=float, default=1800, help="give up after this many seconds in all")
    args = p.parse_args(argv)
    if args.saturation_tool == "auto":
        args.saturation_tool = "wrk" if shutil.which("wrk") else "python"
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    for r in rates:
        if not r.isdigit() or int(r) <= 0:
            p.error(f"--rates: not a positive whole number of requests/s: {r!r}")
    args.mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    for m in args.mixes:
        if m not in MIXES:
            p.error(f"--mixes: no mix named {m!r} (known: {', '.join(MIXES)})")
    if not args.mixes:
        p.error("--mixes: name at least one mix")

    def too_long(signum, frame):
        raise BenchError(f"gave up after --timeout {args.timeout:.0f}s")

    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(int(args.timeout))
    started = dt.datetime.now(dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    loadavg_before = os.getloadavg()
    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="guard-bench-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            print(f"building {args.vmis:,} VMIs and the bodies of {len(args.mixes)} mix(es) ...", flush=True)
            files, state_info = prepare(args, tmp)
            print(f"  {state_info['objects']}, snapshot {state_info['snapshot_mb']:.0f} MB, bodies {state_info['bodies']}, "
                  f"{state_info['build_s']:.1f}s", flush=True)
            ctx = ssl.create_default_context(cafile=str(files["ca"]))
            print("timing policy.decide alone, and the policy's answer to every body ...", flush=True)
            decide = measure_decide(files, args.mixes, timeout=600)
            for m, d in decide.items():
                print(f"  {m}: median {d['median_us']:.2f} us, mean {d['mean_us']:.2f} us over {d['calls']:,} calls",
                      flush=True)
            port = free_port()
            guard = Server("guard", serve_argv("app", files, port, args.quiet, args.guard_arg), tmp / "guard.log", port)
            port = free_port()
            baseline = Server("baseline", plain_argv(files, port, args.quiet), tmp / "baseline.log", port,
                              env={"BENCH_ANSWERS": str(files["answers"])})
            port = free_port()
            stack = Server("stack", serve_argv("bench.baseline", files, port, args.quiet), tmp / "stack.log", port)
            port = free_port()
            floor = Server("floor", serve_argv("bench.floor", files, port, args.quiet), tmp / "floor.log", port)
            servers = [guard, baseline, stack, floor]
            print("starting the guard, the baseline and the two references ...", flush=True)
            for s in servers:
                s.start()
            for s in servers:
                s.wait_ready(ctx, timeout=300)
            print(f"  guard ready in {guard.started_s:.1f}s (snapshot load), baseline in {baseline.started_s:.1f}s",
                  flush=True)
            idle = {s.name: s.memory_mb() for s in servers}
            runs: list[dict] = []
            decisions: dict[str, dict[str, float]] = {}
            profiles: dict[str, dict] = {}
            generator: dict = {}
            args.out.mkdir(parents=True, exist_ok=True)
            for k, mix in enumerate(args.mixes):
                files["bodies"] = files[f"bodies:{mix}"]
                print(f"mix {mix}: {MIXES[mix].about} ({state_info['bodies'][mix]:,} bodies)", flush=True)
                check_answers(ctx, guard, baseline, [stack, floor] if k == 0 else [], files["bodies"])
                counts0 = decision_counts(ctx, guard)
                mixed = [guard, baseline] if k else servers
                for s in mixed:  # warm up: connections, caches, lazy imports
                    run_loadgen(s.port, files["ca"], files["bodies"], min(2.0, args.duration), 8, None)
                for rnd in range(args.rounds):
                    order = mixed if rnd % 2 == 0 else mixed[::-1]
                    for phase in ["saturation", *rates]:
                        for s in order:
                            if s in (stack, floor) and phase != "saturation":  # throughput references only
                                continue
                            res = load_phase(s, phase, args, files)
                            res.update(round=rnd + 1, mix=mix)
                            runs.append(res)
                            print(f"  {mix} round {rnd + 1} {phase:>10} {s.name:8}: {res['achieved_rps']:8,.0f} req/s  "
                                  f"p99 {res['latency_ms']['p99']:7.2f} ms  server CPU {res['server_cpu_share']:.2f}  "
                                  f"generator CPU {res['client_cpu_share_total']:.2f}"
                                  + (f"  errors {res['errors']}" if res["errors"] else ""), flush=True)
                decisions[mix] = shares(counts0, decision_counts(ctx, guard))
                if k == 0:
                    generator = check_generator(baseline, [r for r in runs if r["mix"] == mix], args, files)
                if args.profile:
                    print(f"profiling the guard under saturation in mix {mix} (py-spy) ...", flush=True)
                    profiles[mix] = profile_guard(guard, args, files, args.out / f"profile-{stamp}-{mix}.txt")
            memory = {s.name: {**s.memory_mb(), "idle_rss_mb": idle[s.name]["rss_mb"]} for s in servers}
        finally:
            for s in servers:
                s.stop()
            signal.alarm(0)
        meta = {
            "started": started.isoformat(), "vmis": args.vmis, "rounds": args.rounds, "duration_s": args.duration,
            "rates": rates, "connections": args.connections, "saturation_tool": args.saturation_tool,
            "quiet": args.quiet, "mixes": args.mixes, "guard_args": args.guard_arg,
            "loadavg_before": [round(x, 2) for x in loadavg_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(), "python": platform.python_version(), "commit": git_commit(),
            "versions": versions("uvicorn", "fastapi", "starlette", "uvloop", "httptools", "orjson", "prometheus-client"),
            "guard_startup_s": guard.started_s, "baseline_startup_s": baseline.started_s,
            "baseline_argv": baseline.argv[1:],
        }
        mixes: dict[str, dict] = {}
        for mix in args.mixes:
            summary = summarise([r for r in runs if r["mix"] == mix], decide[mix], memory, rates)
            mixes[mix] = {"about": MIXES[mix].about, "bodies": state_info["bodies"][mix], "summary": summary,
                          "table_markdown": table(summary, decide[mix], rates), "decision_mix": decisions[mix],
                          "expected_denied": MIXES[mix].expected_denied, "decide": decide[mix],
                          "profile": profiles.get(mix)}
        for r in runs:
            r.pop("_latencies", None)
        result = {"meta": meta, "state": state_info, "memory": memory, "generator": generator, "mixes": mixes,
                  "runs": runs}
    for mix, m in mixes.items():
        print_table(mix, m["summary"], m["decide"], rates, meta, m["decision_mix"])
        if m["expected_denied"] is not None:
            denied = sum(v for k, v in m["decision_mix"].items() if k.startswith("denied:"))
            print(f"  refused {denied:.1%} (the mix stands for {m['expected_denied']:.1%})")
    path = args.out / f"bench-{stamp}.json"
    data = orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    path.write_bytes(data)
    (args.out / "latest.json").write_bytes(data)
    print("\nguard/baseline per mix: " + "; ".join(
        f"{mix} throughput {fmt(m['summary']['ratios']['throughput'])} "
        f"({fmt(m['summary']['ratios']['throughput_median_of_rounds'])}), CPU per request "
        f"{fmt(m['summary']['ratios']['cpu_per_request'])}" for mix, m in mixes.items()))
    g = generator
    line = (f"load generator at saturation ({g['saturation_tool']}): {g['generator_cpu_share']:.2f} of a core, "
            f"the baseline server {g['server_cpu_share']:.2f}")
    if "python_closed_loop_rps" in g:
        line += (f"; the Python generator in closed loop reaches {g['python_closed_loop_rps']:,.0f} req/s on the baseline "
                 f"(wrk {g['baseline_rps']:,.0f}) using {g['python_generator_cpu_share']:.2f} of a core")
    print(line)
    for mix, profile in profiles.items():
        if profile and "own" in profile:
            print(f"\nguard profile under saturation, mix {mix}, own time (py-spy):")
            for frame, share in profile["own"][:12]:
                print(f"  {share:6.1%}  {frame}")
            print(f"guard profile, mix {mix}, inclusive:")
            for frame, share in profile["inclusive"][:15]:
                print(f"  {share:6.1%}  {frame}")
    print(f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


def versions(*names: str) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
