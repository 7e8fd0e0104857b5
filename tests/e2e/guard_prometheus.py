"""A real Prometheus (Debian's package) scraping a live guard's metrics port, with the chart's own alerting rules.

The scrape carries the labels a ServiceMonitor gives the guard's series (``job`` = the release's full name,
``namespace`` = its namespace, ``pod``), the ones the chart's rules and dashboard select on: the chart is rendered
with ``helm template`` (tests/test_chart.py's release names), so its PrometheusRule groups are loaded as they are.
Scrape and evaluation every second: the alerts' ``for`` comes from the values given to ``render``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from tests.guard_process import free_port

PROMETHEUS = shutil.which("prometheus")
INTERVAL = "1s"


class GuardPrometheus:
    def __init__(self, workdir: Path, target: str, job: str, namespace: str, rule_groups: list[dict]) -> None:
        if PROMETHEUS is None:
            raise RuntimeError("prometheus is not on PATH: install Debian's package (apt-get install prometheus)")
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        (workdir / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups}))
        (workdir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": job, "static_configs": [
                {"targets": [target], "labels": {"namespace": namespace, "pod": "guard-e2e"}}]}]}))
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1d"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def _get(self, path: str, **params) -> dict:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        r = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        r.raise_for_status()
        return r.json()["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """The instant vector (or scalar as one sample) of ``expr``: [{"metric": ..., "value": [t, v]}]."""
        data = self._get("/api/v1/query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))
        return data["result"] if data["resultType"] in ("vector", "matrix") else [{"metric": {}, "value": data["result"]}]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                         step=f"{step:g}")["result"]

    def alerts(self) -> list[dict]:
        return self._get("/api/v1/alerts")["alerts"]

    def wait_until_scraping(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.query('up == 1'):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"prometheus did not scrape the guard in {timeout:.0f} s: {self.log.read_text()[-2000:]}")
