"""A real Prometheus server for the steering tests: Debian's ``prometheus`` package.

Series are written as OpenMetrics, turned into TSDB blocks by ``promtool tsdb
create-blocks-from openmetrics``, and served by ``prometheus`` on 127.0.0.1 (no
scraping). Every sample lies in the few minutes before ``at``, the evaluation time
the tests query with (the guard's ``--now``), with the last at ``at`` itself, so an
instant query at ``at`` sees them and the data is 0 s old.

The recording-rule names are just series names here: the values are what the
descheduler's rules would have recorded for this cluster (tests/builders.py's
usage: hot worker-a, cool worker-b, coolest worker-c which the snapshot cordons).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.guard_process import free_port

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
GIB = 1 << 30
STEP, POINTS = 15, 12  # a sample every 15 s over the last 165 s: rate(...[2m]) sees 8 of them


def missing() -> str:
    """Why the real-Prometheus tests cannot run here ("" when they can)."""
    absent = [name for name, path in (("prometheus", PROMETHEUS), ("promtool", PROMTOOL)) if path is None]
    return f"{' and '.join(absent)} not on PATH" if absent else ""


# node -> (cpu, memory, cpu pressure, score); 64 cores and 256 GiB each
NODES = {"worker-a": (0.75, 0.55, 0.05, 0.48), "worker-b": (0.45, 0.45, 0.0, 0.0), "worker-c": (0.30, 0.30, 0.0, 0.0)}
# (namespace, name) -> (node, cores used, memory bytes)
VMS = {("vms", "db"): ("worker-a", 2.0, 8 * GIB), ("vms", "web"): ("worker-a", 6.0, 8 * GIB),
       ("vms", "big"): ("worker-a", 12.0, 16 * GIB), ("vms", "calm"): ("worker-b", 1.0, 4 * GIB)}
SCORE = "descheduler:node:linear_amplified_ideal_point_positive_distance:k3:avg1m"


def openmetrics(at: int) -> str:
    times = [at - STEP * i for i in range(POINTS - 1, -1, -1)]
    out: list[str] = []

    def gauge(name: str, series: list[tuple[str, float]]) -> None:
        out.append(f"# TYPE {name} gauge")
        for labels, value in series:
            out.extend(f"{name}{{{labels}}} {value} {t}" for t in times)

    gauge(SCORE, [(f'instance="{n}"', v[3]) for n, v in NODES.items()])
    gauge("descheduler:nodeutilization:cpu:avg1m",
          [(f'instance="{n}"', v[0]) for n, v in NODES.items()] + [('instance="master-0"', 0.1)])
    gauge("descheduler:nodeutilization:memory:avg1m",
          [(f'instance="{n}"', v[1]) for n, v in NODES.items()] + [('instance="master-0"', 0.2)])
    gauge("descheduler:nodepressure:cpu:avg1m", [(f'instance="{n}"', v[2]) for n, v in NODES.items() if v[2]])
    gauge("descheduler:averageworkersutilization:cpu:avg1m", [("", 0.6)])
    gauge("descheduler:averageworkersutilization:memory:avg1m", [("", 0.5)])
    gauge("kube_node_status_capacity",
          [(f'node="{n}",resource="cpu",unit="core"', 64) for n in NODES]
          + [(f'node="{n}",resource="memory",unit="byte"', 256 * GIB) for n in NODES])
    # virt-handler's two gauges; the guard reads their difference
    gauge("kubevirt_vmi_memory_available_bytes", [(f'namespace="{ns}",name="{vm}",node="{v[0]}"', v[2] + 2 * GIB)
                                                  for (ns, vm), v in VMS.items()])
    gauge("kubevirt_vmi_memory_usable_bytes", [(f'namespace="{ns}",name="{vm}",node="{v[0]}"', 2 * GIB)
                                               for (ns, vm), v in VMS.items()])
    out.append("# TYPE kubevirt_vmi_cpu_usage_seconds counter")
    for (ns, vm), (node, cores, _) in VMS.items():
        labels = f'namespace="{ns}",name="{vm}",node="{node}"'
        out.extend(f"kubevirt_vmi_cpu_usage_seconds_total{{{labels}}} {1000 + cores * (t - times[0])} {t}" for t in times)
    out.append("# EOF")
    return "\n".join(out) + "\n"


@dataclass
class PrometheusServer:
    url: str
    at: int  # the evaluation time the series were written for
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_prometheus(workdir: Path, at: int | None = None) -> PrometheusServer:
    at = at if at is not None else int(time.time()) - 5
    workdir.mkdir(parents=True, exist_ok=True)
    source, data = workdir / "series.om.txt", workdir / "tsdb"
    source.write_text(openmetrics(at))
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)], check=True,
                   capture_output=True, timeout=60)
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\n")  # nothing to scrape: the blocks are the data
    port = free_port()
    log = workdir / "prometheus.log"
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = PrometheusServer(f"http://127.0.0.1:{port}", at, proc, log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{server.url}/-/ready", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"prometheus not ready in 20 s: {log.read_text()}")
