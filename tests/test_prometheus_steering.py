"""Steering (rule 10) end to end against a real Prometheus server (tests/prometheus_support.py),
and failing open without one.

The guard is the real ``serve --snapshot`` over TLS, with ``--now`` at the time the
series were written for: its poller evaluates the queries at that time, in the
background, every second.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from app.cli import main as cli_main
from app.metricsource.prometheus import PrometheusSource
from app.transport.tls import issue_certs, write_certs
from tests.builders import node, pod, vmi
from tests.guard_process import GuardProcess, free_port
from tests.live_support import eventually, evict, reason, scrape
from tests.prometheus_support import GIB, start_prometheus

OBJECTS = [node("worker-a"), node("worker-b"), node("worker-c", cordoned=True),
           *(o for name in ("db", "web", "big") for o in (vmi(name, "worker-a"), pod(name, "worker-a"))),
           vmi("calm", "worker-b"), pod("calm", "worker-b")]
AGE = "kubevirt_eviction_guard_prometheus_data_age_seconds"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def snapshot_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("steer") / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": OBJECTS}))
    return path


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    server = start_prometheus(tmp_path_factory.mktemp("prometheus"))
    yield server
    server.stop()


def guard(tmp_path: Path, snapshot: Path, now: float, url: str, *extra: str) -> GuardProcess:
    g = GuardProcess(tmp_path, ["--snapshot", str(snapshot), "--now", rfc3339(now), "--shutdown-drain", "0s",
                                "--no-side-effects", "--prometheus-url", url, "--prometheus-interval", "1s", *extra])
    g.wait_healthy()
    return g


@pytest.mark.prometheus
def test_the_poller_reads_scores_inputs_and_vm_usage(prometheus) -> None:
    source = PrometheusSource(prometheus.url, clock=lambda: float(prometheus.at))
    try:
        source.poll_once()
        snap = source.current()
    finally:
        source.stop()
    assert snap.error == ""
    assert sorted(snap.nodes) == ["worker-a", "worker-b", "worker-c"]  # master-0 has no score
    a = snap.nodes["worker-a"]
    assert (a.cpu, a.memory, a.cpu_pressure, a.score, a.cpu_cores, a.memory_bytes) == (0.75, 0.55, 0.05, 0.48, 64, 256 * GIB)
    assert snap.vms[("vms", "db")].cpu_cores == pytest.approx(2.0, rel=0.01)  # rate() of the counter
    assert snap.vms[("vms", "big")].memory_bytes == 16 * GIB and snap.vms[("vms", "calm")].node == "worker-b"
    assert snap.averages == pytest.approx((0.6, 0.5, 0.05 / 3, 0.0))
    assert snap.taken_at == prometheus.at and snap.usable(prometheus.at)


@pytest.mark.prometheus
def test_steering_end_to_end(prometheus, snapshot_file, tmp_path) -> None:
    g = guard(tmp_path, snapshot_file, prometheus.at, prometheus.url)
    try:
        with g.client() as http:
            first = eventually(lambda: (r := evict(http, "virt-launcher-db-abcde")) and reason(r) != "metrics_unavailable"
                               and r, timeout=10, what="the first Prometheus round")
            assert (first["allowed"], reason(first)) == (False, "better_candidate")
            assert first["status"]["code"] == 429 and "retryAfterSeconds" not in first["status"].get("details", {})
            msg = first["status"]["message"]
            assert "moving vms/big" in msg and "target worker-b" in msg  # cordoned worker-c is never the target
            assert "Eviction triggered evacuation" not in msg  # an ordinary 429: the descheduler tries its next pod
            best = evict(http, "virt-launcher-big-abcde")
            assert (best["allowed"], reason(best)) == (True, "allowed")
            drain = evict(http, "virt-launcher-db-abcde", requested_by="", username="kubernetes-admin")
            assert reason(drain) == "allowed"  # not the descheduler: steering does not apply
            samples = scrape(http)
            assert samples[(AGE, frozenset())] == 0.0
            assert samples[("kubevirt_eviction_guard_prometheus_queries_total", frozenset({("outcome", "ok")}))] >= 1
            assert samples[("kubevirt_eviction_guard_decisions_total",
                            frozenset({("decision", "denied"), ("reason", "better_candidate")}))] >= 1
        eventually(lambda: '"best":"vms/big"' in g.log.read_text(), timeout=5, what="the ranking in the decision log")
    finally:
        g.stop()


@pytest.mark.prometheus
def test_no_gain_refuses_every_vm(prometheus, snapshot_file, tmp_path) -> None:
    g = guard(tmp_path, snapshot_file, prometheus.at, prometheus.url, "--steering-min-gain", "60")
    try:
        with g.client() as http:
            eventually(lambda: reason(evict(http, "virt-launcher-big-abcde")) != "metrics_unavailable", timeout=10)
            for vm in ("db", "web", "big"):
                r = evict(http, f"virt-launcher-{vm}-abcde")
                assert (r["allowed"], reason(r)) == (False, "no_gain"), r["status"]["message"]
    finally:
        g.stop()


@pytest.mark.prometheus
def test_data_older_than_the_limit_fails_open(prometheus, snapshot_file, tmp_path) -> None:
    # 200 s after the last sample: still inside Prometheus' 5-minute lookback, older than 3 x 1 s
    g = guard(tmp_path, snapshot_file, prometheus.at + 200, prometheus.url)
    try:
        with g.client() as http:
            eventually(lambda: scrape(http).get((AGE, frozenset()), math.inf) < math.inf, timeout=10,
                       what="a Prometheus round")
            assert scrape(http)[(AGE, frozenset())] == 200.0
            r = evict(http, "virt-launcher-db-abcde")
            assert (r["allowed"], reason(r)) == (True, "metrics_unavailable")
        eventually(lambda: "is 3m20s old (limit 3s)" in g.log.read_text(), timeout=5, what="the decision log line")
        assert g.log.read_text().count("prometheus data is older than 3s") == 1  # logged once, not every round
    finally:
        g.stop()


@pytest.mark.prometheus
def test_explain_shows_the_ranking(prometheus, snapshot_file, capsys) -> None:
    code = cli_main(["explain", "-n", "vms", "--pod", "virt-launcher-db-abcde", "--snapshot", str(snapshot_file),
                     "--now", rfc3339(prometheus.at), "--prometheus-url", prometheus.url])
    out = capsys.readouterr().out
    assert code == 1  # denied
    assert "reason: better_candidate" in out
    ranks = [line.split()[1] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert ranks == ["vms/big", "vms/web", "vms/db"]
    assert "likely target worker-b" in out and "<- this eviction" in out


def test_fails_open_when_prometheus_is_absent(snapshot_file, tmp_path) -> None:
    """No real Prometheus needed: nothing listens on the URL."""
    g = guard(tmp_path, snapshot_file, 1_800_000_000, f"http://127.0.0.1:{free_port()}")
    try:
        with g.client() as http:
            eventually(lambda: scrape(http).get(("kubevirt_eviction_guard_prometheus_queries_total",
                                                 frozenset({("outcome", "error")})), 0) >= 1, timeout=10)
            r = evict(http, "virt-launcher-db-abcde")
            assert (r["allowed"], reason(r)) == (True, "metrics_unavailable")
            assert scrape(http)[(AGE, frozenset())] == math.inf
        eventually(lambda: "prometheus query failed" in g.log.read_text(), timeout=5, what="the log line")
    finally:
        g.stop()


def test_bad_prometheus_flags_stop_start_up(snapshot_file, tmp_path, capsys) -> None:
    base = ["serve", "--tls-cert", "x", "--tls-key", "y", "--snapshot", str(snapshot_file)]
    certs = write_certs(issue_certs("guard", "test"), tmp_path / "certs")  # real files: TLS loads, flags are reached
    base[2], base[4] = str(certs["cert"]), str(certs["key"])
    for extra, text in ((["--prometheus-url", "thanos:9091"], "--prometheus-url: must be an http(s) URL"),
                        (["--prometheus-url", "http://p:9090", "--prometheus-interval", "0s"], "--prometheus-interval"),
                        (["--prometheus-url", "https://p:9090", "--prometheus-token-file", str(tmp_path / "none")],
                         "--prometheus-token-file"),
                        (["--prometheus-url", "http://p:9090", "--prometheus-token-file", str(certs["ca"])],
                         "--prometheus-url: must be https:// when --prometheus-token-file is given"),
                        (["--prometheus-url", "http://p:9090", "--prometheus-ca", str(snapshot_file)], "--prometheus-ca"),
                        (["--steering-min-gain", "120"], "steeringMinGain")):
        assert cli_main([*base, *extra]) == 2
        assert text in capsys.readouterr().err
