"""Probes that see the webhook port: when its event loop stalls, liveness and readiness fail while the process
lives, on the metrics port (its own loop reads the webhook loop's heartbeat) and on the webhook port itself (a
kubelet HTTPS probe, no client certificate even with --client-ca, simply gets no answer)."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import httpx

from app.admission.server import ADMISSION_PATHS, GuardContext, create_app
from app.policy import PolicySettings
from app.transport.http import HttpLimits
from app.transport.listeners import GuardServer, listener
from app.transport.metrics_port import MetricsServer
from app.transport.tls import issue_certs, server_context, write_certs
from tests.builders import NOW, node, store_of
from tests.live_support import eventually


def bound() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


def test_a_stalled_webhook_loop_fails_both_ports_probes_and_they_recover(tmp_path) -> None:
    server_certs = write_certs(issue_certs("g", "n"), tmp_path / "server")
    client_ca = write_certs(issue_certs("kube-apiserver", "kube-system", client_auth=True), tmp_path / "client")
    ctx = GuardContext(view=store_of(node("worker-a")), settings=PolicySettings(), clock=lambda: NOW,
                       stalled_after=1.0)
    tls = server_context(server_certs["cert"], server_certs["key"], client_ca["ca"])
    webhook_sock, metrics_sock = bound(), bound()
    webhook = listener(create_app(ctx), HttpLimits(), ctx.metrics, "webhook", tls=tls,
                       peer_cert_required=ADMISSION_PATHS)
    server = GuardServer(webhook, webhook_sock, ctx, drain_seconds=0, graceful_seconds=1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert server.started.wait(10)
    side = MetricsServer(create_app(ctx), ctx.metrics, metrics_sock).start()
    https = f"https://127.0.0.1:{webhook_sock.getsockname()[1]}"
    plain = f"http://127.0.0.1:{metrics_sock.getsockname()[1]}"
    kubelet = ssl.create_default_context()  # a kubelet HTTPS probe: no verification, no client certificate
    kubelet.check_hostname, kubelet.verify_mode = False, ssl.CERT_NONE
    try:
        with httpx.Client(verify=kubelet, timeout=2) as probe:
            eventually(lambda: probe.get(f"{https}/healthz").status_code == 200)
            assert probe.get(f"{https}/readyz").status_code == 200
            assert probe.get(f"{plain}/healthz").status_code == 200
            # block the webhook port's loop (a handler that never yields) for 12 s
            server.loop.call_soon_threadsafe(time.sleep, 12.0)  # type: ignore[union-attr]
            eventually(lambda: probe.get(f"{plain}/healthz").status_code == 503, timeout=8)
            stalled = probe.get(f"{plain}/readyz")
            assert stalled.status_code == 503 and "webhook port stalled" in stalled.json()["reason"]
            try:
                answered = probe.get(f"{https}/healthz", timeout=1.0).status_code
            except httpx.TimeoutException:
                answered = None
            assert answered is None  # the kubelet's own probe of the webhook port times out: a failure too
            assert thread.is_alive()  # the process lives
            eventually(lambda: probe.get(f"{plain}/healthz").status_code == 200, timeout=30)
            assert probe.get(f"{https}/healthz").status_code == 200
    finally:
        side.stop()
        server.stop()
        thread.join(10)
