"""The real guard process against tests.fakeapi: start it, send it reviews, read its metrics and its /proc.

Shared by the reliability tests (API faults, replicas, forged reviews). Every
guard here is ``python -m app serve --kubeconfig`` pointing at a fake API
server on 127.0.0.1, over real TLS, with ``--shutdown-drain 0s`` so that
stopping it costs no drain time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.effects.support import review_doc
from tests.fakeapi import FakeApiServer
from tests.guard_process import GuardProcess

JSON = {"Content-Type": "application/json"}


def start_guard(workdir: Path, api: FakeApiServer, *extra: str, certs: dict | None = None,
                wait: bool = True) -> GuardProcess:
    """A guard watching ``api``, listening on a free port, waited for (``wait_ready``) unless ``wait=False``."""
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    guard = GuardProcess(workdir, ["--kubeconfig", str(kubeconfig), "--shutdown-drain", "0s", *extra], certs=certs)
    if wait:
        wait_ready(guard)
    return guard


def wait_ready(guard: GuardProcess, timeout: float = 30) -> None:
    """Until the process answers /healthz and has listed every kind (/readyz 200)."""
    guard.wait_healthy(timeout)
    with guard.client() as http:
        eventually(lambda: http.get("/readyz").status_code == 200, timeout=timeout, what="the guard to sync")


def eventually(check: Callable[[], object], timeout: float = 5.0, what: str = "condition",
               every: float | None = None):
    """``check()`` until it returns something true (returned), or fail after ``timeout`` s. ``every``: a fixed pause
    between checks; by default 10 ms, growing by half each time up to 100 ms, so that a condition met at once is seen
    at once and a long wait (checks that call an API server or read a log) does not take the CPU from what it waits
    for."""
    deadline = time.monotonic() + timeout
    pause = 0.01 if every is None else every
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        if every is None:
            pause = min(pause * 1.5, 0.1)


def body(pod: str, namespace: str = "vms", uid: str = "", **kw) -> bytes:
    """An eviction AdmissionReview for ``pod`` (descheduler by default; ``requested_by=""`` for a drain)."""
    return orjson.dumps(review_doc(pod, namespace=namespace, uid=uid or f"uid-{pod}", **kw))


def evict(http: httpx.Client, pod: str, namespace: str = "vms", **kw) -> dict:
    """POST /validate; the AdmissionReview response (asserting a well-formed 200)."""
    r = http.post("/validate", content=body(pod, namespace, **kw), headers=JSON)
    assert r.status_code == 200, r.text
    return r.json()["response"]


def reason(response: dict) -> str:
    return response["auditAnnotations"]["reason"]


def scrape(http: httpx.Client) -> dict[tuple[str, frozenset], float]:
    """/metrics as {(sample name, labels): value}."""
    out = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def restarts_by_cause(samples: dict) -> dict[str, float]:
    """watch_restarts_total summed over kinds, by cause."""
    out: dict[str, float] = {}
    for (name, labels), value in samples.items():
        if name == "kubevirt_eviction_guard_watch_restarts_total":
            cause = dict(labels)["cause"]
            out[cause] = out.get(cause, 0.0) + value
    return out


@dataclass(frozen=True)
class ProcStats:
    rss_mb: float
    threads: int
    fds: int


def proc_stats(pid: int) -> ProcStats:
    """Resident memory, thread count and open file descriptors of a process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return ProcStats(rss_mb=int(fields["VmRSS"].split()[0]) / 1024, threads=int(fields["Threads"]),
                     fds=len(os.listdir(f"/proc/{pid}/fd")))


# ---- well-behaved traffic -----------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    pod: str
    sent: float  # time.monotonic()
    received: float
    status: int  # HTTP status; 0 when the request failed at the transport (timeout, refused, reset)
    allowed: bool | None = None
    reason: str = ""
    error: str = ""


class Traffic:
    """Well-behaved admission requests, one at a time, from a background thread.

    Plays the API server calling the webhook: a steady trickle of evictions
    (``interval`` apart) over one keep-alive TLS connection, each with a 5 s
    timeout (the API server's default webhook timeout is 10 s). Every answer is
    kept with its send and receive times, so a test can check both that it was
    answered and which state it was decided on.
    """

    def __init__(self, guard: GuardProcess, pods: Sequence[str], interval: float = 0.01) -> None:
        self.guard, self.pods, self.interval = guard, list(pods), interval
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self._bodies = {p: body(p, uid=f"traffic-{p}") for p in self.pods}

    def __enter__(self) -> "Traffic":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with self.guard.client() as http:
            http.timeout = httpx.Timeout(5.0)
            i = 0
            while not self._stop.is_set():
                pod = self.pods[i % len(self.pods)]
                i += 1
                self.answers.append(self._one(http, pod))
                self._stop.wait(self.interval)

    def _one(self, http: httpx.Client, pod: str) -> Answer:
        sent = time.monotonic()
        try:
            r = http.post("/validate", content=self._bodies[pod], headers=JSON)
        except httpx.HTTPError as e:
            return Answer(pod, sent, time.monotonic(), 0, error=f"{type(e).__name__}: {e}")
        received = time.monotonic()
        if r.status_code != 200:
            return Answer(pod, sent, received, r.status_code, error=r.text[:200])
        resp = r.json()["response"]
        return Answer(pod, sent, received, 200, resp["allowed"], resp["auditAnnotations"]["reason"])

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

    def latencies(self) -> list[float]:
        return sorted(a.received - a.sent for a in self.answers)
