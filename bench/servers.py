"""The serving stacks side by side: the same app (``bench.plain``) behind each, the same load, the same attacks.

    python -m bench.servers [--rounds 3] [--duration 3] [--out bench/results/servers.json]

Candidates (each one process, one worker, TLS from the same pair, access logs off):

- ``guard``: the guard's own protocol (``app.transport.http``: public asyncio APIs and httptools);
- ``uvicorn``: uvicorn with httptools and uvloop (what the guard subclassed before);
- ``granian``: granian's ASGI interface (Rust, hyper and rustls), one worker;
- ``hypercorn``: hypercorn (h11) on uvloop.

Measured per candidate, in interleaved rounds so all see the same machine load: requests/s at saturation (wrk,
16 keep-alive connections, the same AdmissionReview POST), and under each attack the growth of the server's
resident memory (all its processes), what the attacker got, and the worst time a ``GET /healthz`` on a new
connection took meanwhile: pipelined requests on one connection (answers read, and never read), 1,000
connections dropped without TLS close_notify (sockets the server still holds 2 s later), and a chunked body
ending in a trailer that never ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from app.transport.tls import issue_certs, write_certs
from bench.attacks import HEALTHZ, MiB, free_port, wait_closed

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench"
CANDIDATES = ("guard", "uvicorn", "granian", "hypercorn")


def argv(name: str, port: int, certs: dict[str, Path]) -> list[str]:
    py, cert, key = sys.executable, str(certs["cert"]), str(certs["key"])
    if name == "guard":
        return [py, "-m", "bench.servers", "--serve-own", str(port), cert, key]
    if name == "uvicorn":
        return [py, "-m", "uvicorn", "bench.plain:app", "--host", "127.0.0.1", "--port", str(port),
                "--ssl-certfile", cert, "--ssl-keyfile", key, "--no-access-log", "--log-level", "warning"]
    if name == "granian":
        return [str(Path(py).with_name("granian")), "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1", "--ssl-certificate", cert, "--ssl-keyfile", key, "--ssl-protocol-min", "tls1.2",
                "--no-ws", "--log-level", "warning", "bench.plain:app"]
    if name == "hypercorn":
        return [str(Path(py).with_name("hypercorn")), "--bind", f"127.0.0.1:{port}", "--certfile", cert,
                "--keyfile", key, "--workers", "1", "--worker-class", "uvloop", "--log-level", "warning",
                "bench.plain:app"]
    raise ValueError(name)


def serve_own(port: int, cert: str, key: str) -> None:
    """bench.plain's app behind the guard's own protocol, as ``serve`` runs it (defaults)."""
    from app.transport.http import HttpLimits, Listener, event_loop
    from app.transport.tls import server_context
    from bench.plain import app

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    loop = event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(Listener(app, HttpLimits(), server_context(cert, key)).start(sock))
    loop.run_forever()


class Candidate:
    def __init__(self, name: str, certs: dict[str, Path], workdir: Path) -> None:
        self.name, self.certs, self.port = name, certs, free_port()
        self.log = (workdir / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(argv(name, self.port, certs), cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.tls = ssl.create_default_context(cafile=str(certs["ca"]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if self.get() == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not come up: {(workdir / f'{name}.log').read_text()[-1500:]}")

    def connect(self, timeout: float = 5.0) -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.tls.wrap_socket(raw, server_hostname="localhost")

    def get(self, timeout: float = 5.0) -> int:
        with contextlib.closing(self.connect(timeout)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return int(s.recv(100).split()[1])

    def pids(self) -> list[int]:
        out = [self.proc.pid]
        with contextlib.suppress(OSError):
            kids = subprocess.run(["pgrep", "-s", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
            out += [int(k) for k in kids if int(k) != self.proc.pid]
        return out

    def rss_kib(self) -> int:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return total

    def sockets(self) -> int:
        n = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        return n

    def cpu_s(self) -> float:
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(5)
        self.log.close()


def saturation(c: Candidate, duration: float, bodies: Path) -> dict:
    cpu0 = c.cpu_s()
    out = subprocess.run(["wrk", "-t1", "-c16", f"-d{max(1, round(duration))}s", "--timeout", "10s",
                          "-s", str(HERE / "wrk.lua"), f"https://127.0.0.1:{c.port}", "--", str(bodies)],
                         capture_output=True, text=True, timeout=duration + 30, cwd=HERE)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("WRK_RESULT "))
    raw = json.loads(line.removeprefix("WRK_RESULT "))
    rps = raw["requests"] / (raw["duration_us"] / 1e6)
    return {"rps": rps, "p99_ms": raw["latency_us"]["p99"] / 1e3,
            "cpu_us_per_request": (c.cpu_s() - cpu0) / max(1, raw["requests"]) * 1e6}


class Watch:
    """Peak RSS growth of a candidate and the worst /healthz time on new connections, during a ``with`` block."""

    def __init__(self, c: Candidate) -> None:
        self.c = c

    def __enter__(self) -> Watch:
        self.rss0 = self.peak = self.c.rss_kib()
        self.worst, self.failed = 0.0, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._mem, daemon=True), threading.Thread(target=self._probe, daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def _mem(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.c.rss_kib())

    def _probe(self) -> None:
        while not self._stop.wait(0.25):
            t0 = time.monotonic()
            try:
                ok = self.c.get(timeout=10) == 200
            except OSError:
                ok = False
            self.worst = max(self.worst, time.monotonic() - t0)
            self.failed += not ok

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def result(self) -> dict:
        return {"rss_growth_mib": round((self.peak - self.rss0) / 1024, 1), "healthz_worst_s": round(self.worst, 2),
                "healthz_failed": self.failed}


def attack_pipeline(c: Candidate, read: bool, seconds: float = 5.0) -> dict:
    s = c.connect()
    sent, closed = 0, threading.Event()

    def reader() -> None:
        while not closed.is_set():
            try:
                if not s.recv(1 << 16):
                    break
            except (TimeoutError, ssl.SSLWantReadError):
                continue
            except OSError:
                break
        closed.set()

    if read:
        threading.Thread(target=reader, daemon=True).start()
    burst = HEALTHZ * 256
    t0 = time.monotonic()
    s.settimeout(1.0)
    while time.monotonic() - t0 < seconds and not closed.is_set():
        try:
            s.sendall(burst)
            sent += len(burst)
        except TimeoutError:
            continue  # the server stopped reading: that is a bound
        except OSError:
            closed.set()
    held = time.monotonic() - t0
    if not read and not closed.is_set():
        after = wait_closed([s], 15.0)[0]
        if after is not None:
            closed.set()
            held += after
    closed_by_server = closed.is_set()
    closed.set()
    s.close()
    return {"sent_mib": round(sent / MiB, 1), "closed_by_server": closed_by_server, "held_s": round(held, 1)}


def attack_abrupt(c: Candidate, n: int = 1000) -> dict:
    before = c.sockets()
    for _ in range(n):
        s = c.connect()
        s.sendall(HEALTHZ)
        s.recv(1000)
        raw = socket.socket(fileno=s.detach())
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()
    time.sleep(2.0)
    return {"connections": n, "sockets_held_after_2s": c.sockets() - before}


def attack_trailer(c: Candidate, total: int = 64 * MiB) -> dict:
    s = c.connect(timeout=30)
    s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: ")
    sent, refused, answer = 0, False, b""
    s.settimeout(10)
    try:
        while sent < total:
            s.sendall(b"a" * 65536)
            sent += 65536
    except OSError:
        refused = True
    with contextlib.suppress(OSError):
        answer = s.recv(200)
    s.close()
    line = answer.partition(b"\r\n")[0].decode("latin-1")
    return {"sent_mib": round(sent / MiB, 1), "answer": line or ("closed" if refused else "none")}


ATTACKS = {
    "pipeline_read": lambda c: attack_pipeline(c, True),
    "pipeline_unread": lambda c: attack_pipeline(c, False),
    "abrupt_close": attack_abrupt,
    "endless_trailer": attack_trailer,
}


def main(argv_: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv_ is None else argv_
    if args_in[:1] == ["--serve-own"]:
        serve_own(int(args_in[1]), args_in[2], args_in[3])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--only", action="append", choices=CANDIDATES)
    p.add_argument("--no-attacks", action="store_true")
    p.add_argument("--out", type=Path, default=HERE / "results" / "servers.json")
    p.add_argument("--doc", type=Path, action="append", default=[], help="rewrite the servers section of this file")
    p.add_argument("--from-json", type=Path, help="only write --doc from an earlier result")
    args = p.parse_args(args_in)
    if args.from_json:
        for doc in args.doc:
            write_doc(doc, json.loads(args.from_json.read_text()))
        return 0
    if not shutil.which("wrk"):
        p.error("wrk is needed (make bench installs it)")
    names = args.only or list(CANDIDATES)
    result: dict = {"meta": {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                             "loadavg_before": os.getloadavg(), "python": platform.python_version()},
                    "saturation": {n: [] for n in names}, "attacks": {}}
    from bench.run import versions
    result["meta"]["versions"] = versions("uvicorn", "granian", "hypercorn", "httptools", "uvloop", "fastapi")
    with tempfile.TemporaryDirectory(prefix="guard-servers-") as tmp:
        work = Path(tmp)
        certs = write_certs(issue_certs("kubevirt-eviction-guard", "bench"), work / "certs")
        body = (ROOT / "tests" / "fixtures" / "admission" / "eviction-from-descheduler-PodEvictor-c-allow-fake.validating.json")
        if not body.exists():
            body = next(iter(sorted((ROOT / "tests" / "fixtures" / "admission").glob("*.json"))))
        bodies = work / "bodies.tsv"
        bodies.write_bytes(b"/validate\t" + json.dumps(json.loads(body.read_text())).encode() + b"\n")
        running = {n: Candidate(n, certs, work) for n in names}
        try:
            for c in running.values():  # warm up
                saturation(c, 1.0, bodies)
            for rnd in range(args.rounds):
                for n in (names if rnd % 2 == 0 else names[::-1]):
                    r = saturation(running[n], args.duration, bodies)
                    result["saturation"][n].append(r)
                    print(f"round {rnd + 1} {n:10} {r['rps']:8,.0f} req/s  p99 {r['p99_ms']:6.2f} ms  "
                          f"CPU {r['cpu_us_per_request']:6.1f} us/req", flush=True)
        finally:
            for c in running.values():
                c.stop()
        if not args.no_attacks:
            for attack, run in ATTACKS.items():
                for n in names:  # a fresh server per attack: what one attack leaves does not spoil the next
                    c = Candidate(n, certs, work)
                    try:
                        with Watch(c) as w:
                            outcome = run(c)
                        outcome.update(w.result())
                        outcome["alive"] = c.proc.poll() is None
                    finally:
                        c.stop()
                    result["attacks"].setdefault(attack, {})[n] = outcome
                    print(f"{attack:16} {n:10} {outcome}", flush=True)
    result["meta"]["loadavg_after"] = os.getloadavg()
    result["summary"] = {n: {"rps_median": statistics.median(r["rps"] for r in runs),
                             "p99_ms_median": statistics.median(r["p99_ms"] for r in runs),
                             "cpu_us_per_request_median": statistics.median(r["cpu_us_per_request"] for r in runs)}
                         for n, runs in result["saturation"].items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {args.out}")
    for doc in args.doc:
        write_doc(doc, result)
        print(f"wrote {doc}")
    return 0


BEGIN, END = "<!-- servers:begin -->", "<!-- servers:end -->"
LABELS = {"guard": "the guard's own", "uvicorn": "uvicorn", "granian": "granian", "hypercorn": "hypercorn"}
# What each offers for the guard's other needs (read from their --help and documentation at the measured versions).
FEATURES = {
    "certificate hot reload": {
        "guard": "yes: new handshakes use the newest pair (an SNI callback picks the newest context)",
        "uvicorn": "none of its own; the guard's reload worked only because its protocol subclass did TLS itself",
        "granian": "none (the pair is read when a worker starts; new certificates need new workers, and each worker "
                   "is a process that would list the cluster again)",
        "hypercorn": "none (the SSL context is built once from the files at start)"},
    "client certificates (clientCA) with probes that send none": {
        "guard": "yes: asked for, verified when sent, required by /mutate and /validate only",
        "uvicorn": "all or nothing (`--ssl-cert-reqs`)", "granian": "all or nothing (`--ssl-client-verify`)",
        "hypercorn": "all or nothing (`--verify-mode`)"},
    "graceful drain on SIGTERM (not ready, keep serving, then finish in flight, exit 0)": {
        "guard": "yes", "uvicorn": "finishes in flight, but exits killed by the signal and has no not-ready phase "
                                   "(the guard subclassed its server for both)",
        "granian": "finishes in flight; no not-ready phase", "hypercorn": "finishes in flight; no not-ready phase"},
    "connection cap counting every connection, shed the longest-waiting": {
        "guard": "yes", "uvicorn": "`--limit-concurrency` answers 503 past it; connections still accepted",
        "granian": "`--backpressure` limits requests, not connections", "hypercorn": "no"},
    "protocol code of the project's own": {
        "guard": "`app/transport/http.py` (about 600 lines) on public APIs only",
        "uvicorn": "272 lines subclassing its private `HttpToolsProtocol`, plus a subclass of its `Server`",
        "granian": "would delete all of it, and with it the bounds above that granian lacks (no hook on connections "
                   "to put them back)",
        "hypercorn": "would delete all of it, and with it the bounds above that hypercorn lacks (no hook on "
                     "connections to put them back)"},
}


def _attack_cell(name: str, r: dict | None) -> str:
    if r is None:
        return "-"
    tail = f"+{r['rss_growth_mib']:g} MiB, `/healthz` worst {r['healthz_worst_s']:g} s" + (
        f", {r['healthz_failed']} failed" if r["healthz_failed"] else "") + ("" if r.get("alive", True) else ", died")
    if name.startswith("pipeline"):
        how = (f"closed after {r['held_s']:g} s ({r['sent_mib']:g} MiB sent)" if r["closed_by_server"]
               else f"open after {r['held_s']:g} s ({r['sent_mib']:g} MiB sent)")
    elif name == "abrupt_close":
        how = f"{r['sockets_held_after_2s']} sockets held 2 s later"
    else:
        how = f"{r['answer']} after {r['sent_mib']:g} MiB"
    return f"{how}; {tail}"


def section(result: dict) -> str:
    names = list(result["summary"])
    m = result["meta"]
    head = "| | " + " | ".join(LABELS[n] for n in names) + " |"
    rule = "|---|" + "---|" * len(names)
    sm = result["summary"]
    rows = [
        "| requests/s at saturation (median of rounds) | " + " | ".join(f"{sm[n]['rps_median']:,.0f}" for n in names) + " |",
        "| server CPU us per request | " + " | ".join(f"{sm[n]['cpu_us_per_request_median']:.0f}" for n in names) + " |",
        "| p99 ms at saturation | " + " | ".join(f"{sm[n]['p99_ms_median']:.1f}" for n in names) + " |",
    ]
    what = {"pipeline_read": "`GET /healthz` pipelined on one TLS connection, 5 s, answers read",
            "pipeline_unread": "the same, answers never read",
            "abrupt_close": "1,000 keep-alive connections dropped without close_notify",
            "endless_trailer": "a chunked body ending in a trailer that never ends (64 MiB sent)"}
    for attack, label in what.items():
        got = result.get("attacks", {}).get(attack)
        if got:
            rows.append(f"| {label} | " + " | ".join(_attack_cell(attack, got.get(n)) for n in names) + " |")
    for feature, by in FEATURES.items():
        rows.append(f"| {feature} | " + " | ".join(by[n] for n in names) + " |")
    v = m.get("versions", {})
    return "\n".join([
        BEGIN,
        f"Regenerated by `make bench-servers` ({m['started'][:16].replace('T', ' ')} UTC, {m['cpus']} CPUs, load average "
        f"{m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after; the rounds interleaved). The same "
        f"app (`bench/plain.py`) behind each, one process, TLS from the same pair, access logs off; saturation by wrk, "
        f"16 keep-alive connections, one AdmissionReview POST. Versions: uvicorn {v.get('uvicorn')}, granian "
        f"{v.get('granian')}, hypercorn {v.get('hypercorn')}, httptools {v.get('httptools')}, uvloop {v.get('uvloop')}.",
        "", head, rule, *rows, END])


def write_doc(doc: Path, result: dict) -> None:
    text = doc.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    doc.write_text(text[:start] + section(result) + text[end:])


if __name__ == "__main__":
    sys.exit(main())
