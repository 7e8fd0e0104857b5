"""The real Prometheus (Debian's package) scraping the actor's exporter and recording the KubeVirt profile's score.

The profile's score (kubevirt-facts.md): per worker, how far it sits above the average of all workers in CPU use,
memory use, CPU pressure and memory pressure; the Euclidean norm of the positive deviations, times 3, capped at 1.
The input rules carry the operator's names (``descheduler:nodeutilization:cpu:avg1m`` and friends) over the
actor's gauges, which are the load model's samples (they stand for the 1-minute averages, as in the simulator). The
descheduler queries the score by its name; its contract: a vector, one sample per node labelled ``instance`` = the
node's name (hence ``honor_labels``: Prometheus would otherwise rename the exporter's ``instance`` to
``exported_instance``), values in [0, 1].

The same exporter serves what virt-handler and kube-state-metrics serve about the VMs and nodes (``actor/load.py``;
KubeVirt's ServiceMonitor honours labels too), and the rules record what KubeVirt v1.8.3's virt-operator records
from them in its PrometheusRule for the VMs' memory in use: ``vmi:kubevirt_vmi_memory_used_bytes:sum`` (available
minus usable) and its deprecated name ``kubevirt_vmi_memory_used_bytes``, which the guard's steering reads.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx

from tests.e2e.outcome.process import Service

SCORE = "descheduler:node:linear_amplified_ideal_point_positive_distance:k3:avg1m"
EVALUATION = "2s"
PROMETHEUS = shutil.which("prometheus")

_INPUTS = (
    ("descheduler:nodeutilization:cpu:avg1m", "kubevirt_actor_node_cpu_utilisation"),
    ("descheduler:nodeutilization:memory:avg1m", "kubevirt_actor_node_memory_utilisation"),
    ("descheduler:nodepressure:cpu:avg1m", "kubevirt_actor_node_cpu_pressure"),
    ("descheduler:nodepressure:memory:avg1m", "kubevirt_actor_node_memory_pressure"),
)
# virt-operator's recording rules (KubeVirt v1.8.3, pkg/monitoring/rules/recordingrules) for a VM's memory in use
KUBEVIRT_RULES = (
    ("vmi:kubevirt_vmi_memory_used_bytes:sum", "kubevirt_vmi_memory_available_bytes-kubevirt_vmi_memory_usable_bytes"),
    ("kubevirt_vmi_memory_used_bytes", "vmi:kubevirt_vmi_memory_used_bytes:sum"),
)


def _deviation(series: str) -> str:
    return f"clamp_min({series} - scalar(avg({series})), 0) ^ 2"


def rules_yaml() -> str:
    lines = ["groups:", "- name: kubevirt-relieve-and-migrate", f"  interval: {EVALUATION}", "  rules:"]
    for record, source in _INPUTS:
        lines += [f"  - record: {record}", f"    expr: {source}"]
    lines += ["  - record: descheduler:averageworkersutilization:cpu:avg1m",
              "    expr: avg(descheduler:nodeutilization:cpu:avg1m)",
              "  - record: descheduler:averageworkersutilization:memory:avg1m",
              "    expr: avg(descheduler:nodeutilization:memory:avg1m)",
              f"  - record: {SCORE}",
              "    expr: >-",
              "      clamp_max(3 * sqrt(" + " + ".join(_deviation(r) for r, _ in _INPUTS) + "), 1)"]
    lines += ["- name: kubevirt.rules", "  rules:"]
    for record, expr in KUBEVIRT_RULES:
        lines += [f"  - record: {record}", f"    expr: {expr}"]
    return "\n".join(lines) + "\n"


class Prometheus(Service):
    def __init__(self, workdir: Path, port: int, exporter_port: int) -> None:
        if PROMETHEUS is None:
            raise RuntimeError("prometheus is not on PATH: install Debian's package (apt-get install prometheus)")
        self.dir = workdir
        self.url = f"http://127.0.0.1:{port}"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yml").write_text(rules_yaml())
        (workdir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {EVALUATION}\n  evaluation_interval: {EVALUATION}\n"
            "rule_files: [rules.yml]\n"
            "scrape_configs:\n- job_name: kubevirt-actor\n  honor_labels: true\n"
            f"  static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n")
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1d"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for_score(self, nodes: int, timeout: float = 60) -> dict[str, float]:
        """Until the score has a sample for every node (the descheduler refuses a node without one)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                got = self.query(SCORE)
                if len(got) >= nodes:
                    return got
                last = f"{len(got)} of {nodes} nodes"
            except (httpx.HTTPError, ValueError, KeyError) as e:
                last = str(e)
            time.sleep(0.5)
        raise TimeoutError(f"prometheus: no score for every node in {timeout:.0f} s ({last})")

    def query(self, expr: str) -> dict[str, float]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        r.raise_for_status()
        return {s["metric"].get("instance", ""): float(s["value"][1]) for s in r.json()["data"]["result"]}

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[float, dict[str, float]]:
        """``expr`` evaluated every ``step`` seconds from ``start`` to ``end`` (Unix times): time -> node -> value."""
        r = httpx.get(f"{self.url}/api/v1/query_range",
                      params={"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
                      timeout=30)
        r.raise_for_status()
        out: dict[float, dict[str, float]] = {}
        for s in r.json()["data"]["result"]:
            node = s["metric"].get("instance", "")
            for t, v in s["values"]:
                out.setdefault(round(float(t), 3), {})[node] = float(v)
        return out
