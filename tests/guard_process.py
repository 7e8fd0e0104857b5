"""Start the real guard (`python -m app serve`) over TLS in a subprocess, for HTTP tests."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.transport.tls import issue_certs, write_certs

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GuardProcess:
    def __init__(self, workdir: Path, args: list[str], certs: dict[str, Path] | None = None) -> None:
        self.certs = certs or write_certs(issue_certs("kubevirt-eviction-guard", "test"), workdir / "certs")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.log = workdir / f"guard-{self.port}.log"
        cmd = [sys.executable, "-m", "app", "--log-format", "json", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--tls-cert", str(self.certs["cert"]), "--tls-key", str(self.certs["key"]), *args]
        self._log_file = self.log.open("wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log_file, stderr=subprocess.STDOUT, env={**os.environ})

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=str(self.certs["ca"])), timeout=10, **kw)

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"guard exited {self.proc.returncode}: {self.log.read_text()}")
                try:
                    if c.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    time.sleep(0.1)
        raise TimeoutError(f"guard not healthy in {timeout}s: {self.log.read_text()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log_file.close()
        return self.proc.returncode
