"""Usage from Prometheus, polled in the background: the descheduler's node scores and
their inputs, node capacities, and each VM's CPU and memory use.

A thread runs the instant queries every ``interval`` and publishes an immutable
``UsageSnapshot`` in one assignment; admission reads ``current()`` and never waits
on Prometheus. A failed round keeps the previous snapshot (with the error), which
ages past ``max_age`` and then fails open in policy (``metrics_unavailable``).

HTTP by httpx: per-phase timeouts, a connection pool kept across rounds, TLS
verification against a given CA. A bearer token is only ever sent over https. (prometheus-api-client would bring pandas and
numpy for a dozen GETs of ``/api/v1/query``.)
"""

from __future__ import annotations

import logging
import math
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

import httpx

from app.domain.usage import NodeUsage, UsageSnapshot, VMUsage, indexed

log = logging.getLogger("kubevirt_eviction_guard.prometheus")
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per query otherwise

SCORE = "descheduler:node:linear_amplified_ideal_point_positive_distance:k3:avg1m"
QUERIES = {
    "score": SCORE,
    "score_time": f"timestamp({SCORE})",
    "cpu": "descheduler:nodeutilization:cpu:avg1m",
    "memory": "descheduler:nodeutilization:memory:avg1m",
    "cpu_pressure": "descheduler:nodepressure:cpu:avg1m",
    "memory_pressure": "descheduler:nodepressure:memory:avg1m",
    "avg_cpu": "descheduler:averageworkersutilization:cpu:avg1m",
    "avg_memory": "descheduler:averageworkersutilization:memory:avg1m",
    "cpu_cores": 'kube_node_status_capacity{resource="cpu"}',
    "memory_bytes": 'kube_node_status_capacity{resource="memory"}',
    # ``and`` keeps a VM's rate only on the node that still exports its counter: after a migration the old node's
    # series stays in the 2m window although Prometheus has marked it stale
    "vm_cpu": "sum by (namespace, name, node) (rate(kubevirt_vmi_cpu_usage_seconds_total[2m])) "
              "and on (namespace, name, node) kubevirt_vmi_cpu_usage_seconds_total",
    # what virt-handler exports (virt-operator's rules record the same difference as vmi:kubevirt_vmi_memory_used_bytes:sum)
    "vm_memory": "max by (namespace, name, node) "
                 "(kubevirt_vmi_memory_available_bytes - kubevirt_vmi_memory_usable_bytes)",
}
REQUIRED = ("score", "cpu", "memory")


UNREACHABLE, NO_DATA = "unreachable", "no_data"


class PrometheusError(Exception):
    """A query round that cannot be used; the text says why (no URL secrets in it). ``kind``: ``unreachable``
    (no answer, or not a usable one) or ``no_data`` (Prometheus answered, without the descheduler's series)."""

    def __init__(self, text: str, kind: str = UNREACHABLE) -> None:
        super().__init__(text)
        self.kind = kind


class SettingsProblem(ValueError):
    """A --prometheus-* flag the guard refuses to start with."""


def node_of(labels: dict) -> str:
    """The node a series is about: its ``node`` label, else ``instance`` without a port
    (node-exporter's instance is the node name on OpenShift, host:port elsewhere)."""
    node = labels.get("node")
    if node:
        return node
    instance = labels.get("instance", "")
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() and "]" not in port else instance


def printable_head(text: str, limit: int = 200) -> str:
    """The start of an answer's body, on one line (it goes into logs and reasons)."""
    return " ".join(text[:limit].split())


def _number(value) -> float | None:
    try:
        x = float(value[1])
    except (TypeError, ValueError, IndexError):
        return None
    return x if math.isfinite(x) else None


def build_snapshot(results: dict[str, list], taken_at: float, max_age: float) -> UsageSnapshot:
    """A snapshot from the vectors of one round (``results[name]`` is a query's ``data.result``).

    Nodes are those with a score (the descheduler considers no other); the pressure
    averages are the mean over them, the use averages the workers' recording rules
    when present, else the same mean.
    """
    per: dict[str, dict[str, float]] = {}
    for name in ("score", "score_time", "cpu", "memory", "cpu_pressure", "memory_pressure", "cpu_cores", "memory_bytes"):
        values: dict[str, float] = {}
        for sample in results.get(name, []):
            x = _number(sample.get("value"))
            if x is not None:
                values[node_of(sample.get("metric") or {})] = x
        per[name] = values
    nodes = {}
    for node, sc in per["score"].items():
        cpu, mem = per["cpu"].get(node), per["memory"].get(node)
        if cpu is None or mem is None:
            continue
        nodes[node] = NodeUsage(cpu=cpu, memory=mem, cpu_pressure=per["cpu_pressure"].get(node, 0.0),
                                memory_pressure=per["memory_pressure"].get(node, 0.0), score=sc,
                                cpu_cores=per["cpu_cores"].get(node), memory_bytes=per["memory_bytes"].get(node))
    vms: dict[tuple[str, str], list] = {}
    for name, idx in (("vm_cpu", 0), ("vm_memory", 1)):
        for sample in results.get(name, []):
            labels = sample.get("metric") or {}
            x = _number(sample.get("value"))
            ns, vmi, node = labels.get("namespace"), labels.get("name"), labels.get("node")
            if x is None or not ns or not vmi or not node:
                continue
            vms.setdefault((ns, vmi), [node, None, None])[idx + 1] = x
    vm_usage = {k: VMUsage(node, cpu, mem) for k, (node, cpu, mem) in vms.items() if cpu is not None and mem is not None}
    averages = None
    if nodes:
        n = len(nodes)
        mean = [sum(u.dims[i] for u in nodes.values()) / n for i in range(4)]
        for i, name in ((0, "avg_cpu"), (1, "avg_memory")):
            rows = [_number(s.get("value")) for s in results.get(name, [])]
            rows = [r for r in rows if r is not None]
            if rows:
                mean[i] = rows[0]
        averages = tuple(mean)
    times = [per["score_time"][n] for n in nodes if n in per["score_time"]]
    return indexed(UsageSnapshot(taken_at=min(times) if times else taken_at, max_age=max_age,
                                 nodes=MappingProxyType(nodes), vms=MappingProxyType(vm_usage),
                                 averages=averages))  # type: ignore[arg-type]


class PrometheusSource:
    """Polls Prometheus (or OpenShift's thanos-querier) and holds the latest snapshot."""

    def __init__(self, url: str, *, token_file: str | None = None, ca_file: str | None = None, interval: float = 30.0,
                 timeout: float = 5.0, max_age: float | None = None, clock: Callable[[], float] = time.time,
                 metrics=None, token: Callable[[], str] | None = None,
                 on_round: Callable[[], None] | None = None) -> None:
        """``token``: read before each round instead of ``token_file`` (raises OSError when it cannot be had);
        ``on_round``: called after each round."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SettingsProblem(f"--prometheus-url: must be an http(s) URL, got {url!r}")
        if interval <= 0:
            raise SettingsProblem(f"--prometheus-interval: must be positive, got {interval}")
        if (token_file is not None or token is not None) and parts.scheme != "https":
            raise SettingsProblem(f"--prometheus-url: must be https:// when --prometheus-token-file is given (the "
                                  f"bearer token would cross the network in clear text), got {url!r}")
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.token_reader = token
        self.on_round = on_round
        self.rounds_ok = 0
        self.problem_kind = ""  # the kind of the last round's PrometheusError, "" after a good round
        if token_file is not None:
            self._token()  # unreadable at start-up: refuse to start, naming the flag
        verify: ssl.SSLContext | bool = True
        if ca_file:
            try:
                verify = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as e:
                raise SettingsProblem(f"--prometheus-ca {ca_file}: not a readable PEM CA bundle: {e}") from None
        self.interval = interval
        self.max_age = max_age if max_age is not None else 3 * interval
        self.clock = clock
        self._client = httpx.Client(verify=verify, timeout=httpx.Timeout(timeout), follow_redirects=False)
        self._snapshot = UsageSnapshot(max_age=self.max_age)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_problem = ""
        self._metrics = metrics
        if metrics is not None:
            metrics.prometheus_data_age.set_function(self.data_age)

    def _token(self) -> str:
        assert self.token_file is not None
        try:
            return Path(self.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise SettingsProblem(f"--prometheus-token-file {self.token_file}: cannot read: {e}") from None

    def current(self) -> UsageSnapshot:
        return self._snapshot

    def data_age(self) -> float:
        age = self._snapshot.age(self.clock())
        return math.inf if age is None else age

    def query(self, promql: str, at: float, headers: dict) -> list:
        try:
            r = self._client.get(f"{self.url}/api/v1/query", params={"query": promql, "time": f"{at:.3f}"},
                                 headers=headers)
        except httpx.HTTPError as e:
            raise PrometheusError(f"cannot reach Prometheus: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            hint = ("; no token was sent (a reader's token: --prometheus-token-file, or the chart's prometheus.token)"
                    if r.status_code in (401, 403) and "Authorization" not in headers else "")
            raise PrometheusError(f"Prometheus answered {r.status_code} to {promql!r}: {printable_head(r.text)}{hint}")
        try:
            body = r.json()
        except ValueError:
            raise PrometheusError(f"Prometheus sent a body that is not JSON for {promql!r}") from None
        data = body.get("data") if isinstance(body, dict) else None
        if body.get("status") != "success" or not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PrometheusError(f"unexpected answer to {promql!r}: {str(body)[:200]}")
        result = data.get("result")
        return result if isinstance(result, list) else []

    def fetch(self) -> UsageSnapshot:
        """One round of queries, evaluated at the clock's time."""
        headers = {}
        if self.token_file is not None:
            try:
                headers["Authorization"] = f"Bearer {self._token()}"  # re-read: projected tokens rotate
            except SettingsProblem as e:
                raise PrometheusError(str(e)) from None
        elif self.token_reader is not None:
            try:
                headers["Authorization"] = f"Bearer {self.token_reader()}"
            except OSError as e:
                raise PrometheusError(f"no token for Prometheus: {e}") from None
        at = self.clock()
        results = {name: self.query(q, at, headers) for name, q in QUERIES.items()}
        missing = [QUERIES[n] for n in REQUIRED if not results[n]]
        if missing:
            raise PrometheusError(f"no series for {', '.join(missing)} (is the descheduler's profile installed?)",
                                  NO_DATA)
        return build_snapshot(results, at, self.max_age)

    def poll_once(self) -> None:
        try:
            self._poll_once()
        finally:
            if self.on_round is not None:
                self.on_round()

    def state(self) -> tuple[str, str]:
        """``(state, why)``: ``pending`` before the first round ends, ``on`` while the data is usable,
        else ``unreachable`` or ``no_data`` with the problem."""
        if self.problem_kind:
            return self.problem_kind, self._snapshot.error or self._last_problem
        if not self.rounds_ok:
            return "pending", "first query round not finished"
        if self._last_problem:
            return NO_DATA, self._last_problem
        return "on", ""

    def _poll_once(self) -> None:
        try:
            snap = self.fetch()
        except PrometheusError as e:
            problem = str(e)
            self.problem_kind = e.kind
            self._snapshot = replace(self._snapshot, error=problem)
            if self._metrics is not None:
                self._metrics.prometheus_queries.labels("error").inc()
            if problem != self._last_problem:
                log.warning("prometheus query failed; steering fails open once the data is older than %.0fs",
                            self.max_age, extra={"error": problem})
            self._last_problem = problem
            return
        self._snapshot = snap
        self.rounds_ok += 1
        self.problem_kind = ""
        if self._metrics is not None:
            self._metrics.prometheus_queries.labels("ok").inc()
        age = snap.age(self.clock()) or 0.0
        problem = f"stale: the oldest node score sample is {age:.0f}s old" if age > self.max_age else ""
        if problem and problem.split(":")[0] != self._last_problem.split(":")[0]:
            log.warning("prometheus data is older than %.0fs; steering fails open", self.max_age,
                        extra={"error": problem})
        elif not problem and self._last_problem:
            log.info("prometheus queries recovered", extra={"nodes": len(snap.nodes), "vms": len(snap.vms)})
        self._last_problem = problem

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def start(self) -> PrometheusSource:
        self._thread = threading.Thread(target=self._run, name="prometheus-poller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._client.close()
