"""Hostile clients against a local ``serve``: what each attack costs the guard, and whether others are still served.

    python -m bench.attacks [--before REF] [--out build/reliability/attacks.json] [--doc docs/reliability.md]

Each attack runs against a fresh guard process (snapshot mode, default settings, both ports, 127.0.0.1 only)
while a prober asks it for ``/healthz`` and a real eviction review on new connections every 0.25 s. Measured:
the growth of the process' resident memory at its peak (``VmHWM`` and 10 ms samples of ``VmRSS`` against the
RSS before the attack), what the attacker got (a status, a closed connection), how long the guard held the
attacker's connections, and how many of the prober's requests were answered.

With ``--before REF`` the same attacks also run against REF (a detached ``git worktree`` in a temporary
directory, removed afterwards) with the same Python and packages, so before and after are measured in one run
on one machine. ``--doc`` rewrites the section between the markers in docs/reliability.md from the result.
The same functions back ``tests/test_hostile_clients.py``, which asserts the bounds on the current tree.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import selectors
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson
import yaml

from app.transport.tls import issue_certs, write_certs

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- attacks:begin -->", "<!-- attacks:end -->"
MiB = 1 << 20
REVIEW_POD = "virt-launcher-vm-0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def review(pod: str = REVIEW_POD, uid: str = "probe", username: str = "system:serviceaccount:kube-system:descheduler",
           requested_by: str = "sigs.k8s.io/descheduler", reason: str = "LowNodeUtilization") -> bytes:
    return orjson.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "eviction",
                    "name": pod, "namespace": "vms", "operation": "CREATE", "userInfo": {"username": username},
                    "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                               "metadata": {"name": pod, "namespace": "vms",
                                            "annotations": {"requested-by": requested_by, "reason": reason}}},
                    "dryRun": False}})


def snapshot_doc() -> dict:
    """One worker, one VM with its launcher pod: enough for a real decision."""
    return {"kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-a", "labels": {}}, "spec": {}},
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
         "metadata": {"name": "vm-0", "namespace": "vms", "uid": "uid-vm-0",
                      "creationTimestamp": "2026-01-01T00:00:00Z"},
         "spec": {}, "status": {"phase": "Running", "nodeName": "worker-a"}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": REVIEW_POD, "namespace": "vms", "uid": "uid-pod-0",
                      "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": "uid-vm-0"},
                      "annotations": {"kubevirt.io/domain": "vm-0"},
                      "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                           "name": "vm-0", "uid": "uid-vm-0", "controller": True}]},
         "spec": {"nodeName": "worker-a"}, "status": {"phase": "Running"}},
    ]}


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


class Guard:
    """``python -m app serve`` from a source tree, on free ports, with a self-signed certificate."""

    def __init__(self, tree: Path, workdir: Path, *extra: str, stderr_unread: bool = False,
                 kubeconfig: Path | None = None, snapshot: dict | None = None) -> None:
        """Snapshot mode (``snapshot`` or ``snapshot_doc``), or watching the API server of ``kubeconfig``."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.certs = write_certs(issue_certs("kubevirt-eviction-guard", "test"), workdir / "certs")
        if kubeconfig is None:
            snap = workdir / "snapshot.json"
            snap.write_bytes(orjson.dumps(snapshot or snapshot_doc()))
            source = ["--snapshot", str(snap), "--now", "2026-11-21T12:00:00Z"]
        else:
            source = ["--kubeconfig", str(kubeconfig), "--no-descheduler-check"]
        self.port, self.metrics_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "app", "--log-format", "json", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--metrics-port", str(self.metrics_port), "--shutdown-drain", "0s",
               "--tls-cert", str(self.certs["cert"]), "--tls-key", str(self.certs["key"]), *source, *extra]
        self.log = workdir / f"guard-{self.port}.log"
        self._log = self.log.open("wb")
        env = {**os.environ, "PYTHONPATH": str(tree)}
        # stderr_unread: a pipe nobody reads while the attack runs (a stuck log shipper)
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=self._log,
                                     stderr=subprocess.PIPE if stderr_unread else subprocess.STDOUT)
        self.tls = ssl.create_default_context(cafile=str(self.certs["ca"]))
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"guard exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if request(self, "GET", "/healthz", timeout=2)[0] == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"guard not healthy in {timeout}s")

    def stop(self) -> bytes:
        """Stop it; what it wrote to an unread stderr pipe, if any."""
        rest = b""
        if self.proc.poll() is None:
            self.proc.terminate()
        if self.proc.stderr is not None:
            rest = self.proc.stderr.read()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()
        return rest


def connect(guard: Guard, port: int | None = None, timeout: float = 5.0) -> socket.socket:
    """A connection to the HTTPS port (TLS done), or to ``port`` in plain TCP."""
    raw = socket.create_connection(("127.0.0.1", port or guard.port), timeout=timeout)
    if port is not None:
        return raw
    return guard.tls.wrap_socket(raw, server_hostname="localhost")


def request(guard: Guard, method: str, path: str, body: bytes = b"", port: int | None = None,
            timeout: float = 5.0) -> tuple[int, bytes]:
    """One request on a new connection: (status, body)."""
    with contextlib.closing(connect(guard, port, timeout)) as s:
        head = f"{method} {path} HTTP/1.1\r\nHost: guard\r\nConnection: close\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    line, _, rest = data.partition(b"\r\n")
    return int(line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@dataclass
class Prober:
    """New connections asking for /healthz and a real review every ``every`` seconds while an attack runs."""

    guard: Guard
    every: float = 0.25
    asked: int = 0
    answered: int = 0
    worst: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        body = review()
        while not self._stop.is_set():
            for ask in (lambda: request(self.guard, "GET", "/healthz"),
                        lambda: request(self.guard, "POST", "/validate", body)):
                self.asked += 1
                started = time.monotonic()
                try:
                    ok = ask()[0] == 200
                except OSError:
                    ok = False
                self.worst = max(self.worst, time.monotonic() - started)
                self.answered += ok
            self._stop.wait(self.every)

    @contextlib.contextmanager
    def running(self) -> Iterator[Prober]:
        t = threading.Thread(target=self._run, name="prober", daemon=True)
        t.start()
        try:
            yield self
        finally:
            self._stop.set()
            t.join(15)


class Memory:
    """Peak growth of a process' resident memory over a ``with`` block, sampled every 10 ms and by VmHWM."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.growth_mib = 0.0

    def __enter__(self) -> Memory:
        st = status(self.pid)
        self.rss0, self.hwm0, self.peak = st["VmRSS"], st["VmHWM"], st["VmRSS"]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            with contextlib.suppress(OSError, KeyError):
                self.peak = max(self.peak, status(self.pid)["VmRSS"])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        with contextlib.suppress(OSError, KeyError):
            hwm = status(self.pid)["VmHWM"]
            if hwm > self.hwm0:
                self.peak = max(self.peak, hwm)
        self.growth_mib = round(max(0, self.peak - self.rss0) / 1024, 1)


def closed(sock: socket.socket) -> bool:
    """True when the peer closed (or reset) the connection; never blocks."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:
        return True


def wait_closed(socks: list[socket.socket], within: float) -> list[float | None]:
    """Wait until the server closed every socket or ``within`` passed: seconds until each closed (None: open)."""
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    started, when = time.monotonic(), [None] * len(socks)
    left = len(socks)
    while left and time.monotonic() - started < within:
        for key, _ in sel.select(timeout=0.2):
            if closed(key.fileobj):  # type: ignore[arg-type]
                sel.unregister(key.fileobj)
                when[key.data] = round(time.monotonic() - started, 1)
                left -= 1
    sel.close()
    return when


def summary(when: list[float | None], waited: float) -> dict:
    done = [w for w in when if w is not None]
    return {"still_open": len(when) - len(done), "waited_s": waited, "last_closed_s": max(done, default=None)}


def raise_fd_limit(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(want, hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


# ---- the attacks --------------------------------------------------------------------------------------------


def send_then_read(s: socket.socket, chunk: bytes, total: int, end: bytes = b"") -> tuple[int, bool, str]:
    """Send ``chunk`` over ``s`` until ``total`` bytes went, then ``end``, or until the guard stops taking them; then
    read its answer (30 s at most) and close. Returns the bytes of chunks sent, whether sending failed, and the
    answer's first line ("" for none)."""
    sent, refused, answer = 0, False, b""
    try:
        while sent < total:
            s.sendall(chunk)
            sent += len(chunk)
        if end:
            s.sendall(end)
    except OSError:
        refused = True
    s.settimeout(30)
    with contextlib.suppress(OSError):
        answer = s.recv(200)
    s.close()
    return sent, refused, answer.partition(b"\r\n")[0].decode("latin-1")


def flood_headers(guard: Guard, total: int = 16 * MiB, port: int | None = None) -> dict:
    """One connection sending ``total`` bytes of ``a:b`` headers as fast as it can."""
    s = connect(guard, port, timeout=30)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: guard\r\n")
    sent, refused, line = send_then_read(s, b"a:b\r\n" * (65536 // 5), total, end=b"\r\n")
    return {"sent_mib": round(sent / MiB, 1), "answer": line or ("connection closed" if refused else "none"),
            "refused": refused or line.split(" ")[1:2] in (["431"], ["400"])}


def held_connections(guard: Guard, n: int = 2000, within: float = 15.0) -> dict:
    """``n`` TCP connections to the HTTPS port that never start TLS."""
    raise_fd_limit(n + 1024)
    socks = [socket.create_connection(("127.0.0.1", guard.port), timeout=10) for _ in range(n)]
    when = wait_closed(socks, within)
    for s in socks:
        s.close()
    return {"connections": n, **summary(when, within)}


def idle_metrics(guard: Guard, within: float = 35.0) -> dict:
    """An idle connection and a one-byte-per-second one to the plain metrics port."""
    idle = connect(guard, guard.metrics_port)
    slow = connect(guard, guard.metrics_port)
    stop = threading.Event()

    def dribble() -> None:
        for b in b"GET /metrics HTTP/1.1\r\nHost: guard\r\n" + b"X" * 1000:
            if stop.wait(1.0):
                return
            try:
                slow.send(bytes([b]))
            except OSError:
                return

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    idle_s, slow_s = wait_closed([idle, slow], within)
    stop.set()
    t.join()
    idle.close()
    slow.close()
    return {"idle_closed_s": idle_s, "slow_closed_s": slow_s, "waited_s": within}


def body_limit(guard: Guard) -> int:
    """The largest body the guard takes: it answers 413 at once to a Content-Length above its limit."""
    lo, hi = 1, 64 * MiB
    while lo < hi:
        mid = (lo + hi + 1) // 2
        with contextlib.closing(connect(guard)) as s:
            s.sendall(f"POST /validate HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {mid}\r\n\r\n".encode())
            s.settimeout(0.5)
            try:
                over = s.recv(100).startswith(b"HTTP/1.1 413")
            except OSError:
                over = False
        lo, hi = (lo, mid - 1) if over else (mid, hi)
    return lo


def held_bodies(guard: Guard, n: int = 300) -> dict:
    """``n`` TLS connections each sending a body one byte short of the guard's limit, never the last byte."""
    limit = body_limit(guard)
    head = (f"POST /validate HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            f"Content-Length: {limit}\r\n\r\n").encode()
    socks = []
    for _ in range(n):
        try:
            s = connect(guard)
            s.sendall(head + b" " * (limit - 1))
            socks.append(s)
        except OSError:
            pass
    when = wait_closed(socks, 20.0)
    for s in socks:
        s.close()
    return {"connections": n, "body_bytes": limit - 1, **summary(when, 20.0)}


FORGED_USER = 'mallory\n12:00:00 INFO    allowed by the guard user=admin\x1b[2J\x1b[31m'


def log_amplification(guard: Guard, n: int = 150) -> dict:
    """``n`` reviews whose user (with a newline, a forged text log line and ANSI escapes), requester, reason and
    pod name are as long as the body limit allows, while nobody reads the guard's stderr (text-format logs); then
    the longest log line it wrote, and the lines that hold a control character."""
    limit = body_limit(guard)

    def big(size: int) -> bytes:
        return review(pod="virt-launcher-" + "p" * size, username=FORGED_USER + "u" * size,
                      requested_by="\n\x1b[31m" + "r" * size, reason="x" * size)

    size = limit // 5  # the pod's name is in the review twice
    while len(big(size)) > limit:
        size -= 256
    body = big(size)
    answered = 0
    for i in range(n):
        with contextlib.suppress(OSError):
            answered += request(guard, "POST", "/validate", body)[0] == 200
    return {"requests": n, "request_bytes": len(body), "answered": answered}


def forged_events(guard: Guard, api, n: int = 20, wait: float = 35.0) -> dict:
    """``n`` forged descheduler evictions of a real, quiet VM's launcher pod (nothing is evicted, so no migration
    follows), with ``FORGED_USER`` as the user; then the EvictionAllowed Events the guard wrote within ``wait``
    seconds (the guard's look-out for the migration gives up after about 30 s)."""
    for i in range(n):
        request(guard, "POST", "/validate", review(uid=f"forged-{i}", username=FORGED_USER))
    time.sleep(wait)
    allowed = [e for e in api.events() if e.get("reason") == "EvictionAllowed"]
    return {"forged": n, "eviction_allowed_events": len(allowed), "counted": sum(e.get("count", 1) for e in allowed),
            "events_with_control_chars": sum(any(ord(c) < 32 for c in e["message"]) for e in allowed)}


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: guard\r\n\r\n"


def scrape(guard: Guard) -> dict[str, float]:
    """The guard's metrics (from the metrics port) as {sample with labels: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = request(guard, "GET", "/metrics", port=guard.metrics_port)[1].decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def capacity_closes(m: dict[str, float]) -> float:
    return m.get('kubevirt_eviction_guard_connections_closed_total{listener="webhook",reason="capacity"}', 0.0)


def pipeline(guard: Guard, port: int | None = None, seconds: float = 5.0, read: bool = True) -> dict:
    """Tiny ``GET /healthz`` requests pipelined on one keep-alive connection as fast as it can send them for
    ``seconds``; answers read (or, ``read=False``, never read)."""
    s = connect(guard, port, timeout=5)
    sent = got = 0
    stop = threading.Event()
    closed_by_guard = threading.Event()

    def reader() -> None:
        nonlocal got
        while not stop.is_set():
            try:
                chunk = s.recv(1 << 16)
            except (TimeoutError, ssl.SSLWantReadError, socket.timeout):
                continue
            except OSError:
                closed_by_guard.set()
                return
            if not chunk:
                closed_by_guard.set()
                return
            got += chunk.count(b"HTTP/1.1 ")

    t = threading.Thread(target=reader, daemon=True)
    if read:
        t.start()
    burst = HEALTHZ * 256
    started = time.monotonic()
    while time.monotonic() - started < seconds and not closed_by_guard.is_set():
        try:
            s.sendall(burst)
            sent += len(burst)
        except (OSError, TimeoutError):
            closed_by_guard.set()
            break
    held_s = round(time.monotonic() - started, 1)
    if not read:  # the guard may still hold it: see whether it closes within its request timeout
        s.settimeout(None)
        closed_in = wait_closed([s], 20.0)[0]
        if closed_in is not None:
            closed_by_guard.set()
            held_s = round(held_s + closed_in, 1)
    stop.set()
    if read:
        t.join(5)
    s.close()
    return {"sent_mib": round(sent / MiB, 2), "requests_sent": sent // len(HEALTHZ), "answers_read": got,
            "closed_by_guard": closed_by_guard.is_set(), "held_s": held_s}


def abrupt_closes(guard: Guard, n: int = 2000) -> dict:
    """``n`` keep-alive TLS connections, each asking ``/healthz`` once, then dropped without close_notify (an RST);
    then the guard's own count of its open connections 2 s later, and how many it closed for capacity."""
    import struct

    capacity0 = capacity_closes(scrape(guard))
    for _ in range(n):
        s = connect(guard)
        s.sendall(HEALTHZ)
        s.recv(1000)
        raw = socket.socket(fileno=s.detach())  # the TCP socket under the TLS layer: no close_notify
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()
    time.sleep(2.0)
    m = scrape(guard)
    return {"connections": n,
            "open_after_2s": m.get('kubevirt_eviction_guard_open_connections{listener="webhook"}'),
            "capacity_closes": capacity_closes(m) - capacity0}


def endless_trailer(guard: Guard, total: int = 64 * MiB) -> dict:
    """A chunked body whose last chunk is followed by one trailer header that never ends."""
    s = connect(guard, timeout=30)
    s.sendall(b"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: ")
    started = time.monotonic()
    sent, refused, line = send_then_read(s, b"a" * 65536, total)
    return {"sent_mib": round(sent / MiB, 2), "answer": line or ("connection closed" if refused else "none"),
            "refused": refused or bool(line), "held_s": round(time.monotonic() - started, 1)}


def websocket_upgrades(guard: Guard, n: int = 600) -> dict:
    """``n`` WebSocket upgrade requests on new TLS connections, each closed once answered; then the guard's count
    of its open connections and of its closes for capacity."""
    answers: dict[str, int] = {}
    capacity0 = capacity_closes(scrape(guard))
    for i in range(n):
        with contextlib.closing(connect(guard)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: guard\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
            s.settimeout(5)
            try:
                line = s.recv(200).partition(b"\r\n")[0].decode("latin-1")
            except OSError:
                line = "connection closed"
            answers[line] = answers.get(line, 0) + 1
    time.sleep(2.0)
    m = scrape(guard)
    return {"requests": n, "answers": answers,
            "open_after_2s": m.get('kubevirt_eviction_guard_open_connections{listener="webhook"}'),
            "capacity_closes": capacity_closes(m) - capacity0}


def tiny_chunks(guard: Guard, n: int = 200, port: int | None = None) -> dict:
    """``n`` connections each sending a chunked body of 2-byte chunks up to just under the body limit, never its
    last chunk; held 2 s, then closed by the client. Also the guard's memory 2 s after they closed."""
    raise_fd_limit(n + 1024)
    limit = body_limit(guard)
    head = b"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = b"2\r\n  \r\n" * ((limit - 2) // 2)
    socks, refused = [], 0
    for _ in range(n):
        try:
            s = connect(guard, port, timeout=30)
            s.sendall(head + chunks)
            socks.append(s)
        except OSError:
            refused += 1
    time.sleep(2.0)
    held = sum(not closed(s) for s in socks)
    for s in socks:
        s.close()
    time.sleep(2.0)
    return {"connections": n, "body_bytes": (limit - 2) // 2 * 2, "refused": refused, "held_after_2s": held,
            "rss_after_close_mib": round(status(guard.proc.pid)["VmRSS"] / 1024, 1)}


def answers(s: socket.socket, within: float = 10.0) -> list[str]:
    """The status lines of everything the guard sends on ``s`` until it closes it (or ``within`` passes)."""
    s.settimeout(within)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            data += chunk
    return status_lines(data)


def status_lines(data: bytes) -> list[str]:
    """The status lines in what the guard sent (answers follow each other without a separator)."""
    return [m.decode("latin-1") for m in re.findall(rb"HTTP/1\.[01] [0-9]{3}[^\r]*", data)]


def split_head(guard: Guard) -> dict:
    """A request and, in the same read, the start of a second head; the rest of that head (twice the header
    budget in all) in the next read: what the second request gets."""
    half = b"".join(b"x-pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(15))
    s = connect(guard, timeout=10)
    s.sendall(HEALTHZ + b"GET /healthz HTTP/1.1\r\nHost: guard\r\n" + half)
    time.sleep(0.3)
    s.sendall(half.replace(b"x-pad", b"x-more") + b"\r\n")
    got = answers(s)
    s.close()
    return {"head_bytes": 2 * len(half), "answers": got}


def pipelined_pair(guard: Guard) -> dict:
    """Two reviews pipelined in three reads: the first head and half its 40 KiB body; the rest of that body, the
    second head and half its body; the rest."""
    first, second = review(reason="x" * 40_000), review(reason="y" * 2_000)
    post = b"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    one, two = post % len(first) + first, post % len(second) + second
    reads = [one[:len(one) // 2], one[len(one) // 2:] + two[:len(two) // 2], two[len(two) // 2:]]
    s = connect(guard, timeout=10)
    with contextlib.suppress(OSError):
        for data in reads:
            s.sendall(data)
            time.sleep(0.3)
    s.settimeout(10)
    data = b""
    with contextlib.suppress(OSError):
        while data.count(b"HTTP/1.1 ") < 2 and (chunk := s.recv(65536)):
            data += chunk
    s.close()
    return {"answers": status_lines(data)}


def closing_linger(guard: Guard, n: int = 200, within: float = 40.0) -> dict:
    """``n`` TLS connections each asking ``/healthz`` with ``Connection: close``, reading the answer, and never
    sending close_notify back: how long the guard holds them."""
    raise_fd_limit(n + 1024)
    raws = []
    for _ in range(n):
        raw = socket.create_connection(("127.0.0.1", guard.port), timeout=10)
        tls = guard.tls.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=True)
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: guard\r\nConnection: close\r\n\r\n")
        tls.recv(1000)
        raws.append(socket.socket(fileno=tls.detach()))  # the TCP socket: the client's TLS layer stays silent
    when = wait_closed(raws, within)
    for r in raws:
        r.close()
    return {"connections": n, **summary(when, within)}


def tls_client(guard: Guard, port: int | None = None) -> tuple[socket.socket, ssl.SSLObject, ssl.MemoryBIO,
                                                                 ssl.MemoryBIO]:
    """A TLS connection whose records the caller sends itself (to put a request and close_notify in one write)."""
    raw = socket.create_connection(("127.0.0.1", port or guard.port), timeout=10)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = guard.tls.wrap_bio(incoming, outgoing, server_hostname="localhost")
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())
            data = raw.recv(65536)
            if not data:
                raise OSError("closed during the handshake")
            incoming.write(data)
    raw.sendall(outgoing.read())
    return raw, obj, incoming, outgoing


def close_notify_after_request(guard: Guard, n: int = 20) -> dict:
    """``n`` times: a review and the client's close_notify in one write (TLS), and a review then a TCP half-close
    (the metrics port, plain HTTP, ``/healthz``): how many answers arrive."""
    body = review()
    post = (b"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body
    tls_answered = plain_answered = 0
    for _ in range(n):
        raw, obj, incoming, outgoing = tls_client(guard)
        obj.write(post)
        with contextlib.suppress(ssl.SSLWantReadError):
            obj.unwrap()  # writes close_notify; the guard's comes later
        raw.sendall(outgoing.read())
        raw.settimeout(10)
        plain = b""
        with contextlib.suppress(OSError):
            while chunk := raw.recv(65536):
                incoming.write(chunk)
                with contextlib.suppress(ssl.SSLError):
                    while part := obj.read(65536):
                        plain += part
        raw.close()
        tls_answered += plain.startswith(b"HTTP/1.1 200")
        s = connect(guard, guard.metrics_port)
        s.sendall(HEALTHZ)
        s.shutdown(socket.SHUT_WR)
        plain_answered += bool(answers(s)[:1] == ["HTTP/1.1 200 OK"])
        s.close()
    return {"requests": n, "tls_answered": tls_answered, "plain_answered": plain_answered}


def conformance(guard: Guard) -> dict:
    """Requests a server must refuse or answer in a set way (RFC 9112 request targets, RFC 9110 100-continue),
    and a slash-ended admission path with a forged Host: what each gets."""
    out = {}

    def first(raw: bytes, wait: float = 5.0, then: bytes = b"") -> str:
        s = connect(guard, timeout=wait)
        s.sendall(raw)
        s.settimeout(wait)
        try:
            got = s.recv(65536)
        except OSError:
            got = b""
        if then:
            s.sendall(then)
            with contextlib.suppress(OSError):
                got = got or s.recv(65536)
        s.close()
        line = got.partition(b"\r\n")[0].decode("latin-1") or "no answer"
        location = [h for h in got.split(b"\r\n") if h.lower().startswith(b"location:")]
        return line + (f" ({location[0].decode('latin-1')})" if location else "")

    body = review()
    out["http_0_9"] = first(b"GET /healthz HTTP/0.9\r\n\r\n")
    s = connect(guard, timeout=5)
    s.sendall(b"POST /validate HTTP/1.0\r\nHost: guard\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    s.settimeout(1.5)
    try:
        early = s.recv(100).partition(b"\r\n")[0].decode("latin-1")
    except OSError:
        early = "nothing"
    s.close()
    out["http_1_0_expect_continue"] = early
    authority = f"localhost:{guard.port}"
    out["absolute_form_same_host"] = first(f"GET https://{authority}/healthz HTTP/1.1\r\nHost: {authority}\r\n"
                                           "\r\n".encode())
    out["absolute_form_other_host"] = first(b"GET http://example.org/healthz HTTP/1.1\r\nHost: example.org\r\n\r\n")
    out["slash_path_forged_host"] = first(b"POST /mutate/ HTTP/1.1\r\nHost: evil.example\r\n"
                                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                                          + body)
    return out


FLOOD_VMS = 5000


def flood_snapshot(n: int = FLOOD_VMS) -> dict:
    """``n`` VMs on 50 nodes, each marked for evacuation (a background denial: an Event and the annotation)."""
    doc = snapshot_doc()
    items = [i for i in doc["items"] if i["kind"] == "Node"]
    items += [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"worker-{k}", "labels": {}}, "spec": {}}
              for k in range(50)]
    for i in range(n):
        node = f"worker-{i % 50}"
        items.append({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                      "metadata": {"name": f"vm-{i}", "namespace": "vms", "uid": f"uid-vm-{i}",
                                   "creationTimestamp": "2026-01-01T00:00:00Z"},
                      "spec": {}, "status": {"phase": "Running", "nodeName": node, "evacuationNodeName": node}})
        items.append({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": f"virt-launcher-vm-{i}", "namespace": "vms", "uid": f"uid-pod-{i}",
                                   "resourceVersion": str(1000 + i),
                                   "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": f"uid-vm-{i}"},
                                   "annotations": {"kubevirt.io/domain": f"vm-{i}"},
                                   "ownerReferences": [{"apiVersion": "kubevirt.io/v1",
                                                        "kind": "VirtualMachineInstance", "name": f"vm-{i}",
                                                        "uid": f"uid-vm-{i}", "controller": True}]},
                      "spec": {"nodeName": node},
                      "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    return {"kind": "List", "items": items}


def post_review(s: socket.socket, f: BinaryIO, body: bytes) -> bytes:
    """POST one review to ``/validate`` on the keep-alive connection ``s`` (read through ``f``, its file); the
    answer's body."""
    s.sendall(b"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    f.readline()
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return f.read(length)


def event_flood(guard: Guard, n: int = FLOOD_VMS) -> dict:
    """Forged descheduler reviews of ``n`` distinct VMs, each denied (marked for evacuation): one Event series
    and one annotation job each, on keep-alive connections; then what the guard dropped, by kind."""
    wait_ready(guard)
    bodies = [review(pod=f"virt-launcher-vm-{i}", uid=f"flood-{i}") for i in range(n)]
    denied = 0
    with contextlib.closing(connect(guard, timeout=10)) as s:
        f = s.makefile("rb")
        for body in bodies:
            denied += b'"allowed":false' in post_review(s, f, body)
    time.sleep(3.0)
    m = scrape(guard)
    dropped = {k.split('kind="')[1].rstrip('"}'): v for k, v in m.items()
               if k.startswith("kubevirt_eviction_guard_side_effects_dropped_total{")}
    return {"reviews": n, "denied": denied, "dropped": dropped,
            "annotations_done": sum(v for k, v in m.items() if k.startswith('kubevirt_eviction_guard_side_effects_total{kind="annotation"'))}


def wait_ready(guard: Guard, timeout: float = 120.0) -> None:
    """Until ``/readyz`` says the state is synced (live mode; at once in snapshot mode)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if request(guard, "GET", "/readyz")[0] == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"guard not ready in {timeout:.0f}s")


def reread_amplification(guard: Guard, api, n: int = 2000) -> dict:
    """``n`` forged descheduler reviews that the policy would allow (live mode), on keep-alive connections from
    8 threads; then the consistent VMI LISTs the fake API server saw beyond the watch's own."""
    wait_ready(guard)
    before = len(api.requests_for("virtualmachineinstances", watch=False))
    body = review(uid="reread")
    allowed = 0
    lock = threading.Lock()

    def worker(count: int) -> None:
        nonlocal allowed
        with contextlib.closing(connect(guard, timeout=10)) as s:
            f = s.makefile("rb")
            for _ in range(count):
                ok = b'"allowed":true' in post_review(s, f, body)
                with lock:
                    allowed += ok

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(n // 8,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    lists = len(api.requests_for("virtualmachineinstances", watch=False)) - before
    m = scrape(guard)
    return {"reviews": n, "allowed": allowed, "vmi_lists": lists, "lists_per_s": round(lists / took, 1), "took_s": round(took, 1),
            "over_budget": m.get('kubevirt_eviction_guard_leaver_reads_total{result="over_budget"}', 0.0)}


@contextlib.contextmanager
def fake_cluster(workdir: Path, flood: int = 0, latency: float = 0.0) -> Iterator[tuple[object, Path]]:
    """The in-repo fake API server (tests/fakeapi) with the snapshot's node, VM and launcher pod; with ``flood``,
    as many more VMs marked for evacuation (``flood_snapshot``'s, in live mode), and every answer ``latency``
    seconds late (an API server under load)."""
    from tests.fakeapi import FakeApiServer
    from tests.fakeapi import objects as o

    with FakeApiServer(bookmark_interval=1.0) as api:
        api.put(o.node("worker-a"))
        api.put(o.vmi("vms", "vm-0", node="worker-a", uid="uid-vm-0", created=time.time() - 86400))
        api.put(o.launcher_pod("vms", "vm-0", "worker-a", name=REVIEW_POD, vmi_uid="uid-vm-0"))
        if flood:
            for k in range(50):
                api.put(o.node(f"worker-{k}"))
            objects = []
            for i in range(1, flood):
                node = f"worker-{i % 50}"
                objects.append(o.vmi("vms", f"vm-{i}", node=node, uid=f"uid-vm-{i}", evacuation_node=node,
                                     created=time.time() - 86400))
                objects.append(o.launcher_pod("vms", f"vm-{i}", node, name=f"virt-launcher-vm-{i}",
                                              vmi_uid=f"uid-vm-{i}"))
            api.load(objects)
        if latency:
            api.set_latency(latency)
        workdir.mkdir(parents=True, exist_ok=True)
        yield api, api.write_kubeconfig(workdir / "kubeconfig")


@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    run: Callable[..., dict]
    stderr_unread: bool = False
    extra: tuple[str, ...] = ()
    cluster: bool = False  # against the fake API server (live mode), run(guard, api)
    snapshot: Callable[[], dict] | None = None
    flood: int = 0  # cluster: VMs marked for evacuation in the fake API server (fake_cluster)
    latency: float = 0.0  # cluster: seconds every API answer is late


ATTACKS = [
    Attack("headers_tls", "16 MiB of `a:b` headers on one TLS connection", flood_headers),
    Attack("headers_metrics", "16 MiB of `a:b` headers on the plain metrics port",
           lambda g: flood_headers(g, port=g.metrics_port)),
    Attack("idle_metrics", "an idle and a 1-byte-per-second connection to the metrics port", idle_metrics),
    Attack("never_tls", "2,000 TCP connections that never start TLS", held_connections),
    Attack("held_bodies", "300 connections each holding a body one byte short of the limit", held_bodies),
    Attack("log_amplification", "150 reviews with fields as long as the body limit allows (a user name with a "
           "newline, a forged log line and ANSI escapes), text logs, stderr not read",
           log_amplification, stderr_unread=True, extra=("--log-format", "text")),
    Attack("forged_events", "20 forged descheduler reviews of a real launcher pod, user name with a newline and "
           "ANSI escapes", forged_events, cluster=True),
    Attack("pipeline_tls", "`GET /healthz` pipelined on one TLS connection for 5 s, answers read", pipeline),
    Attack("pipeline_metrics", "`GET /healthz` pipelined on one metrics-port connection for 5 s, answers read",
           lambda g: pipeline(g, port=g.metrics_port)),
    Attack("pipeline_unread", "`GET /healthz` pipelined on one TLS connection for 5 s, answers never read",
           lambda g: pipeline(g, read=False)),
    Attack("abrupt_close", "2,000 keep-alive TLS connections dropped without close_notify (RST)", abrupt_closes),
    Attack("endless_trailer", "a chunked body ending in one trailer header that never ends", endless_trailer),
    Attack("websocket_upgrade", "600 WebSocket upgrade requests, each connection closed once answered",
           websocket_upgrades),
    Attack("tiny_chunks_tls", "200 TLS connections each holding a chunked body of 2-byte chunks just under the limit",
           tiny_chunks),
    Attack("tiny_chunks_metrics", "200 metrics-port connections each holding a chunked body of 2-byte chunks",
           lambda g: tiny_chunks(g, port=g.metrics_port)),
    Attack("split_head", "a request and, in the same read, the start of a second head twice the header budget",
           split_head),
    Attack("pipelined_pair", "two reviews pipelined in three reads, each body split between two",
           pipelined_pair),
    Attack("closing_linger", "200 `Connection: close` requests whose clients never send close_notify back",
           closing_linger),
    Attack("close_notify", "20 reviews each followed in the same write by close_notify (TLS), 20 probes each "
           "followed by a half-close (metrics port)", close_notify_after_request),
    Attack("conformance", "HTTP/0.9; `Expect: 100-continue` from HTTP/1.0; absolute-form targets; `/mutate/` with "
           "a forged Host", conformance),
    Attack("event_flood", f"forged reviews of {FLOOD_VMS:,} distinct denied VMs (an Event and an annotation each; "
           "live mode, every API answer 20 ms late)", lambda g, api: event_flood(g), cluster=True, flood=FLOOD_VMS,
           latency=0.02),
    Attack("reread_amplification", "2,000 forged descheduler reviews that policy would allow (live mode), 8 "
           "keep-alive connections", reread_amplification, cluster=True),
]


def run_attack(tree: Path, workdir: Path, attack: Attack) -> dict:
    if attack.cluster:
        with fake_cluster(workdir / attack.name, attack.flood, attack.latency) as (api, kubeconfig):
            return _run_attack(tree, workdir, attack, api, kubeconfig)
    return _run_attack(tree, workdir, attack)


def _run_attack(tree: Path, workdir: Path, attack: Attack, api=None, kubeconfig: Path | None = None) -> dict:
    guard = Guard(tree, workdir / attack.name, *attack.extra, stderr_unread=attack.stderr_unread,
                  kubeconfig=kubeconfig, snapshot=attack.snapshot() if attack.snapshot else None)
    try:
        prober = Prober(guard)
        with Memory(guard.proc.pid) as mem, prober.running():
            started = time.monotonic()
            outcome = attack.run(guard, api) if attack.cluster else attack.run(guard)
            outcome["attack_s"] = round(time.monotonic() - started, 1)
        outcome["rss_growth_mib"] = mem.growth_mib
        outcome["rss_before_mib"] = round(mem.rss0 / 1024, 1)
        outcome["probes_answered"] = f"{prober.answered}/{prober.asked}"
        outcome["probe_worst_s"] = round(prober.worst, 2)
    finally:
        rest = guard.stop()
    if attack.stderr_unread:
        lines = rest.splitlines() or [b""]
        outcome["longest_log_line_bytes"] = max(len(line) for line in lines)
        outcome["log_lines_with_control_chars"] = sum(any(c < 32 for c in line) for line in lines)
        outcome["forged_log_lines"] = sum(line.startswith(b"12:00:00 INFO    allowed by the guard") for line in lines)
    return outcome


def run_all(tree: Path, workdir: Path, only: list[str] | None = None) -> dict:
    return {a.name: run_attack(tree, workdir, a) for a in ATTACKS if not only or a.name in only}


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A detached worktree of ``ref`` in a temporary directory, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="guard-before-"))
    tree = parent / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), ref], cwd=ROOT, check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        subprocess.run(["rm", "-rf", str(parent)], check=False)


# ---- the docs section -----------------------------------------------------------------------------------


_COMMON = {"attack_s", "rss_growth_mib", "rss_before_mib", "probes_answered", "probe_worst_s"}


def _cell(name: str, r: dict) -> str:
    grow = f"+{r['rss_growth_mib']:g} MiB"
    if name.startswith("headers") or name == "endless_trailer":
        what = f"{r['answer']} after {r['sent_mib']:g} MiB sent" if r["refused"] else f"all {r['sent_mib']:g} MiB taken, {r['answer']}"
    elif name == "idle_metrics":
        fmt = lambda s: f"closed after {s:g} s" if s is not None else f"open after {r['waited_s']:g} s"  # noqa: E731
        what = f"idle: {fmt(r['idle_closed_s'])}; 1 B/s: {fmt(r['slow_closed_s'])}"
    elif name in ("never_tls", "held_bodies"):
        what = (f"all closed within {r['last_closed_s']:g} s" if not r["still_open"]
                else f"{r['still_open']:,} of {r['connections']:,} open after {r['waited_s']:g} s")
        if name == "held_bodies":
            what = f"{r['body_bytes'] / 1024:,.0f} KiB each; {what}"
    elif name == "log_amplification":
        what = (f"{r['request_bytes'] / 1024:,.0f} KiB each; longest log line {r['longest_log_line_bytes'] / 1024:,.1f} KiB, "
                f"{r['log_lines_with_control_chars']} lines with control characters, {r['forged_log_lines']} forged lines")
    elif name.startswith("pipeline_"):
        what = (f"{r['requests_sent']:,} requests ({r['sent_mib']:g} MiB) sent, {r.get('answers_read', 0):,} answers; "
                + (f"closed by the guard after {r['held_s']:g} s" if r["closed_by_guard"] else f"still open after {r['held_s']:g} s"))
    elif name in ("abrupt_close", "websocket_upgrade"):
        what = f"open connections counted 2 s later: {r['open_after_2s']:g}; closes for capacity: {r['capacity_closes']:g}"
        if name == "websocket_upgrade":
            what = f"answers {r['answers']}; {what}"
    elif name.startswith("tiny_chunks"):
        what = (f"{r['connections'] - r['refused']:,} bodies of {r['body_bytes'] / 1024:,.0f} KiB taken, "
                f"{r['held_after_2s']:,} still open after 2 s; resident {r['rss_after_close_mib']:g} MiB after they closed")
    elif name in ("split_head", "pipelined_pair"):
        what = "answers: " + (", ".join(r["answers"]) or "none")
    elif name == "closing_linger":
        what = (f"all closed within {r['last_closed_s']:g} s" if not r["still_open"]
                else f"{r['still_open']:,} of {r['connections']:,} open after {r['waited_s']:g} s")
    elif name == "close_notify":
        what = f"answered: {r['tls_answered']}/{r['requests']} over TLS, {r['plain_answered']}/{r['requests']} plain"
    elif name == "conformance":
        what = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in r.items() if k not in _COMMON)
    elif name == "event_flood":
        what = f"{r['denied']:,} denied; dropped by kind: {r['dropped'] or 'none'}"
    elif name == "reread_amplification":
        what = (f"{r['allowed']:,} allowed; {r['vmi_lists']:,} VMI LISTs ({r['lists_per_s']:g}/s), "
                f"{r.get('over_budget', 0):g} fail-open past the bound")
    else:
        what = (f"{r['eviction_allowed_events']} `EvictionAllowed` Events (count {r['counted']}) for {r['forged']} "
                f"forged reviews and the prober's, {r['events_with_control_chars']} with control characters")
    return f"{grow}; {what}; probes {r['probes_answered']} (slowest {r['probe_worst_s']:g} s)"


def _header(meta: dict, what: str) -> str:
    return (f"{what} by `make reliability` ({meta['started'][:16].replace('T', ' ')} UTC, {meta['cpus']} CPUs, "
            f"load average {meta['loadavg'][0]:.1f}; before = `{meta.get('before_ref', '-')}` "
            f"({meta.get('before_commit', '-')[:10]}), after = this tree, default settings)")


def section(result: dict, kept: dict[str, str] | None = None, kept_header: str = "") -> str:
    """The docs section; ``kept``: rows (by attack description) of attacks this run did not measure, kept as they
    were, ``kept_header`` the line that says when those were measured."""
    meta, kept = result["meta"], kept or {}
    rows = []
    for attack in ATTACKS:
        after = result["after"].get(attack.name)
        before = result.get("before", {}).get(attack.name)
        if after is None:
            if attack.what in kept:
                rows.append(kept[attack.what])
            continue
        mark = " (†)" if kept else ""
        rows.append(f"| {attack.what}{mark} | {_cell(attack.name, before) if before else 'not measured'} "
                    f"| {_cell(attack.name, after)} |")
    if kept:
        intro = (f"{kept_header}; the rows marked (†): {_header(meta, 'measured').replace('measured by', 'by')}")
    else:
        intro = _header(meta, "Regenerated")
    return "\n".join([
        BEGIN,
        intro + ". Each cell: the peak growth of the guard's resident memory, what the attacker got, and how many of "
        "the prober's requests (`/healthz` and a real review on new connections every 0.25 s) were answered during "
        "the attack, and the slowest.",
        "",
        "| attack | before | after |",
        "|---|---|---|",
        *rows,
        END,
    ])


def write_doc(doc: Path, result: dict) -> None:
    """Rewrite the section; with only some attacks measured, the other rows stay as they were."""
    text = doc.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    kept, kept_header = {}, ""
    if any(a.name not in result["after"] for a in ATTACKS):
        old = text[start:end].splitlines()
        kept_header = next((line.split(". Each cell")[0] for line in old if line.startswith(("Regenerated", "Rows"))), "")
        kept_header = kept_header.replace("Regenerated by", "Rows without a mark measured by", 1).split("; the rows marked")[0]
        for line in old:
            if line.startswith("| ") and not line.startswith(("| attack |", "|---")):
                what = line[2:].split(" | ")[0]
                if " (†)" not in what:
                    kept[what] = line
    doc.write_text(text[:start] + section(result, kept, kept_header) + text[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", metavar="REF", help="also attack this git ref (e.g. the branch point)")
    p.add_argument("--only", action="append", choices=[a.name for a in ATTACKS], help="run only these attacks")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "reliability" / "attacks.json")
    p.add_argument("--doc", type=Path, help="rewrite the attacks section of this Markdown file")
    args = p.parse_args(argv)
    result: dict = {"meta": {"started": dt.datetime.now(dt.timezone.utc).isoformat(), "cpus": os.cpu_count(),
                             "loadavg": os.getloadavg(), "python": platform.python_version()}}
    with tempfile.TemporaryDirectory(prefix="guard-attacks-") as tmp:
        if args.before:
            commit = subprocess.run(["git", "rev-parse", args.before], cwd=ROOT, check=True, capture_output=True,
                                    text=True).stdout.strip()
            result["meta"].update(before_ref=args.before, before_commit=commit)
            with checkout(commit) as tree:
                result["before"] = run_all(tree, Path(tmp) / "before", args.only)
        result["after"] = run_all(ROOT, Path(tmp) / "after", args.only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if args.doc:
        write_doc(args.doc, result)
        print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
