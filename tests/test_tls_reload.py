"""Certificate hot reload against a real server process and real TLS handshakes.

The certificate directory is laid out the way the kubelet mounts a Secret
(``tls.crt -> ..data/tls.crt``, ``..data -> ..<timestamp>``) and rotated the
way it rotates one: a new timestamped directory, then an atomic rename of the
``..data`` symlink. Every test certificate comes from its own CA, so which CA
verifies a handshake tells which pair the server presented.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app.transport.tls import issue_certs, server_context
from app.transport.tlsreload import CertReloader

ROOT = Path(__file__).resolve().parents[1]
REVIEW = (ROOT / "examples" / "requests" / "deny-cooldown.json").read_bytes()
DEMO_NOW = "2026-11-21T12:00:00Z"


class MountedSecret:
    """A directory that behaves like a kubelet-mounted Secret volume."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0

    def publish(self, cert_pem: bytes, key_pem: bytes) -> None:
        self.generation += 1
        data = self.root / f"..2026_11_21_{self.generation:04d}"
        data.mkdir()
        (data / "tls.crt").write_bytes(cert_pem)
        (data / "tls.key").write_bytes(key_pem)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(data.name)
        os.replace(tmp, self.root / "..data")  # the atomic swap
        for name in ("tls.crt", "tls.key"):
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key(self) -> Path:
        return self.root / "tls.key"


def serial_of(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


def client_context(*ca_pems: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata="".join(p.decode() for p in ca_pems))
    return ctx


def handshake_serial(port: int, ctx: ssl.SSLContext) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            return serial_of(tls.getpeercert(binary_form=True))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- in-process: the reloader's judgement ------------------------------------------------------------


@pytest.fixture
def mounted(tmp_path):
    secret = MountedSecret(tmp_path)
    first = issue_certs("guard", "ns")
    secret.publish(first.cert_pem, first.key_pem)
    return secret, first


def test_unchanged_files_are_not_reloaded(mounted):
    secret, _ = mounted
    reloader = CertReloader(server_context(secret.cert, secret.key), secret.cert, secret.key,
                            interval=0, registry=CollectorRegistry())
    assert reloader.check() is False


def test_broken_pair_keeps_the_old_one_and_says_why_once(mounted, caplog):
    secret, first = mounted
    registry = CollectorRegistry()
    reloader = CertReloader(server_context(secret.cert, secret.key), secret.cert, secret.key,
                            interval=0, registry=registry)
    other = issue_certs("guard", "ns")
    secret.publish(other.cert_pem, first.key_pem)  # certificate and key do not belong together
    with caplog.at_level("ERROR", logger="kubevirt_eviction_guard.tls"):
        assert reloader.check() is False
        assert reloader.check() is False  # same broken state: no second log line
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "does not load" in refusals[0].error
    assert reloader.served.serial == x509.load_pem_x509_certificate(first.cert_pem).serial_number
    assert registry.get_sample_value("kubevirt_eviction_guard_tls_reloads_total", {"result": "error"}) == 1
    secret.publish(other.cert_pem, other.key_pem)  # the writer finishes the job
    assert reloader.check() is True
    assert reloader.served.serial == x509.load_pem_x509_certificate(other.cert_pem).serial_number
    assert registry.get_sample_value("kubevirt_eviction_guard_tls_reloads_total", {"result": "success"}) == 1


def test_plain_rewrite_in_place_is_noticed(tmp_path):
    first, second = issue_certs("guard", "ns"), issue_certs("guard", "ns")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    reloader = CertReloader(server_context(cert, key), cert, key, interval=0, registry=CollectorRegistry())
    cert.write_bytes(second.cert_pem)
    key.write_bytes(second.key_pem)
    assert reloader.check() is True
    assert reloader.served.serial == x509.load_pem_x509_certificate(second.cert_pem).serial_number


# -- a real server process ---------------------------------------------------------------------------


@pytest.fixture
def guard(mounted, tmp_path_factory):
    secret, first = mounted
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("log") / "guard.log"  # a file, not a pipe: one line per decision
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--log-format", "json", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--tls-cert", str(secret.cert), "--tls-key", str(secret.key), "--tls-reload-interval", "0.2",
         "--metrics-port", str(metrics_port), "--snapshot", str(ROOT / "examples" / "demo-snapshot.yaml"), "--now", DEMO_NOW],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log_path.open("wb"),
    )
    ctx = client_context(first.ca_pem)
    deadline = time.monotonic() + 20
    while True:
        try:
            handshake_serial(port, ctx)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"guard did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
    yield secret, first, port, proc, log_path, metrics_port
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def scrape(port: int, path: str = "/metrics", method: str = "GET") -> str:
    side = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        side.request(method, path, body=REVIEW if method == "POST" else None, headers={"Content-Type": "application/json"})
        resp = side.getresponse()
        return f"{resp.status} {resp.read().decode()}" if path != "/metrics" else resp.read().decode()
    finally:
        side.close()


def test_metrics_port_serves_only_metrics_and_probes(guard):
    metrics_port = guard[5]
    assert "kubevirt_eviction_guard_decisions_total" in scrape(metrics_port)
    assert scrape(metrics_port, "/healthz").startswith("200 ")
    assert scrape(metrics_port, "/readyz").startswith("200 ")
    for path in ("/mutate", "/validate"):
        answer = scrape(metrics_port, path, method="POST")
        assert answer.startswith("404 ") and "metrics port" in answer, answer  # admission never without TLS


def test_with_a_metrics_port_the_https_port_serves_no_metrics(guard):
    """The chart's NetworkPolicy admits anyone to the webhook port and only monitoring to the metrics port."""
    _, first, port, *_ = guard
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_context(first.ca_pem), timeout=5)
    try:
        for path, status in (("/metrics", 404), ("/healthz", 200)):
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == status, (path, resp.status, body[:200])
            assert b"kubevirt_eviction_guard_" not in body
    finally:
        conn.close()


def admit(conn: http.client.HTTPSConnection) -> int:
    conn.request("POST", "/mutate", body=REVIEW, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200 and b'"uid"' in body, (resp.status, body[:200])
    return resp.status


def test_rotation_under_load_serves_the_new_pair_without_errors(guard):
    secret, first, port, proc, log_path, metrics_port = guard
    second = issue_certs("guard", "ns")
    either = client_context(first.ca_pem, second.ca_pem)
    old_serial = x509.load_pem_x509_certificate(first.cert_pem).serial_number
    new_serial = x509.load_pem_x509_certificate(second.cert_pem).serial_number

    # A keep-alive connection opened before the rotation: its requests are in flight across the swap.
    kept = http.client.HTTPSConnection("127.0.0.1", port, context=either, timeout=5)
    kept.connect()  # the handshake happens now, with the old certificate
    admit(kept)

    served: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set() and len(served) < 5000:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=either, timeout=5)
            try:
                conn.connect()  # a fresh handshake for every request
                served.append(serial_of(conn.sock.getpeercert(binary_form=True)))
                admit(conn)
            except BaseException as e:  # noqa: BLE001 - every failure is a finding
                errors.append(e)
            finally:
                conn.close()

    worker = threading.Thread(target=stream, daemon=True)
    worker.start()
    time.sleep(0.5)
    secret.publish(second.cert_pem, second.key_pem)
    deadline = time.monotonic() + 15
    while new_serial not in served[-3:] and time.monotonic() < deadline:
        time.sleep(0.05)
        admit(kept)  # the old connection keeps working while the new pair arrives
    time.sleep(0.3)
    stop.set()
    worker.join(timeout=10)

    assert errors == []
    assert served and served[0] == old_serial
    assert new_serial in served, "no handshake presented the rotated certificate"
    switch = served.index(new_serial)
    assert set(served[switch:]) == {new_serial}, "after the switch, every new handshake uses the new pair"
    assert handshake_serial(port, client_context(second.ca_pem)) == new_serial
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake_serial(port, client_context(first.ca_pem))  # the old pair is really gone
    admit(kept)
    assert serial_of(kept.sock.getpeercert(binary_form=True)) == old_serial  # same connection throughout
    kept.close()
    assert proc.poll() is None
    samples = {(m.name, tuple(sorted(m.labels.items()))): m.value for f in text_string_to_metric_families(scrape(metrics_port))
               for m in f.samples}
    assert samples[("kubevirt_eviction_guard_tls_reloads_total", (("result", "success"),))] == 1
    not_after = x509.load_pem_x509_certificate(second.cert_pem).not_valid_after_utc.timestamp()
    assert samples[("kubevirt_eviction_guard_tls_certificate_expiry_timestamp_seconds", ())] == not_after
    messages = [json.loads(line)["msg"] for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert "serving a new certificate" in messages


def test_metrics_port_in_use_is_a_startup_error_naming_it(mounted, tmp_path):
    secret, _ = mounted
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(free_port()),
             "--metrics-port", str(busy), "--tls-cert", str(secret.cert), "--tls-key", str(secret.key),
             "--snapshot", str(ROOT / "examples" / "demo-snapshot.yaml")],
            cwd=ROOT, capture_output=True, text=True, timeout=30,
        )
    assert done.returncode == 2
    assert f"--metrics-port {busy}: cannot listen" in done.stderr


def test_with_a_metrics_port_the_webhook_port_does_not_serve_metrics(guard):
    _, _, port, _, _, metrics_port = guard
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 404
    finally:
        conn.close()
    assert "kubevirt_eviction_guard_decisions_total" in scrape(metrics_port)
