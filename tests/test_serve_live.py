"""End to end: the real ``serve`` process, over TLS, watching the fake API server through a kubeconfig."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from app.cli import main
from app.transport.tls import issue_certs, write_certs
from tests.builders import FIXTURES
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[1]
REQUEST = (FIXTURES / "admission/eviction-requested-by-descheduler.validating.json").read_bytes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    return write_certs(issue_certs("kubevirt-eviction-guard", "kubevirt-eviction-guard"), tmp_path_factory.mktemp("certs"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _poll(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except httpx.TransportError:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_serve_watches_the_cluster_flips_readiness_and_decides(tmp_path, certs):
    with FakeApiServer(bookmark_interval=1.0) as api:
        now = time.time()
        api.put(o.node("worker-a"))
        api.put(o.vmi("vms", "desched", node="worker-a", created=now - 86400,
                      migration=o.migration_state(start=now - 20, source_node="worker-a", target_node="worker-b")))
        api.put(o.launcher_pod("vms", "desched", "worker-a", name="virt-launcher-desched"))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.down()  # the guard starts while the API server is unreachable
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "--log-format", "json", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"]), "--kubeconfig", str(kubeconfig),
             "--stale-after", "1m"],
            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=ssl.create_default_context(cafile=str(certs["ca"])), timeout=5) as http:
                not_ready = _poll(lambda: (r := http.get("/readyz")).status_code == 503
                                  and all("cannot reach" in why for why in r.json()["notSynced"].values()) and r,
                                  20, "serve to start and fail to reach the API")
                assert set(not_ready.json()["notSynced"]) == {"vmi", "vmim", "pod", "node"}
                api.up()
                _poll(lambda: http.get("/readyz").status_code == 200, 20, "readiness after the API came up")
                answer = http.post("/validate", content=REQUEST, headers={"Content-Type": "application/json"}).json()
                assert answer["response"]["allowed"] is False
                assert answer["response"]["auditAnnotations"]["reason"] == "migration_in_progress"
                metrics = http.get("/metrics").text
                assert 'kubevirt_eviction_guard_cache_objects{kind="pod"} 1.0' in metrics
                assert _restarts(metrics, "vmi", "connection") >= 1, metrics
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
        # uvicorn re-raises the SIGTERM it handled once shutdown is complete
        assert proc.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]
        assert b"shutdown complete" in err
        logs = [orjson.loads(line) for line in err.splitlines() if line.startswith(b"{")]
        assert any(line["msg"] == "listed" and line.get("kind") == "vmi" for line in logs)


def test_serve_without_a_cluster_source_says_what_to_pass(certs, capsys, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    code = main(["serve", "--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"])])
    assert code == 2
    assert "--kubeconfig FILE" in capsys.readouterr().err


@pytest.mark.parametrize("args,expected", [
    (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig /nonexistent/kubeconfig: no such file"),
    (["--kubeconfig", "/dev/null", "--stale-after", "soon"], "--stale-after: not a duration: 'soon'"),
    (["--kubeconfig", "/dev/null", "--stale-after", "0s"], "--stale-after: must be a positive duration"),
])
def test_serve_refuses_bad_cluster_settings(certs, capsys, args, expected):
    code = main(["serve", "--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"]), *args])
    assert code == 2
    assert expected in capsys.readouterr().err


def test_serve_rejects_an_unusable_kubeconfig(tmp_path, certs, capsys):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n", encoding="utf-8")
    code = main(["serve", "--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"]), "--kubeconfig", str(bad)])
    assert code == 2
    assert f"--kubeconfig {bad}:" in capsys.readouterr().err


def _restarts(metrics_text: str, kind: str, cause: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name.endswith("watch_restarts_total") and s.labels == {"kind": kind, "cause": cause}:
                return s.value
    return 0.0
