"""Certificate hot reload: new TLS handshakes use the pair currently on disk.

cert-manager rotates the serving certificate by rewriting the Secret; the
kubelet then updates the mounted volume with an atomic writer (a new
timestamped directory, and a rename of the ``..data`` symlink onto it), and
other tools simply rewrite the files in place. Either way ``os.stat`` of the
mounted paths (which follows the symlinks) changes inode, mtime or size, so a
cheap poll every few seconds notices it without inotify or extra threads per
file.

Swapping is done by *replacing* contexts, never by mutating the one that is
serving: ``SSLContext.load_cert_chain`` releases the GIL between loading the
certificate and the key, so a handshake accepted in that instant would see the
new certificate with no key and fail. Instead each reload builds a complete,
verified ``SSLContext`` on the side, and the listening context's SNI callback
(which OpenSSL calls for every ClientHello, with or without SNI) points each
new connection at the newest one. Connections already open keep the context
they were accepted with, so in-flight requests are never dropped. A broken or
half-written pair is refused and the previous one keeps serving; the refusal
is logged once per distinct on-disk state, not on every poll.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from prometheus_client import CollectorRegistry, Counter, Gauge

from app.metrics import PREFIX
from app.transport.tls import TLSError, server_context

log = logging.getLogger("kubevirt_eviction_guard.tls")

FileState = tuple[int, int, int, int] | None  # (device, inode, mtime_ns, size); None = missing


def file_state(path: str | Path) -> FileState:
    try:
        st = os.stat(path)  # follows symlinks: a swapped ..data shows up as a new inode
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class ServedCertificate:
    subject: str
    serial: int
    not_after: dt.datetime

    @classmethod
    def read(cls, path: str | Path) -> ServedCertificate:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
        return cls(cert.subject.rfc4514_string(), cert.serial_number, cert.not_valid_after_utc)


class ReloadMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.reloads = Counter(
            PREFIX + "tls_reloads_total", "Certificate reload attempts after the files changed", ["result"],
            registry=registry,
        )
        self.not_after = Gauge(
            PREFIX + "tls_certificate_expiry_timestamp_seconds", "notAfter of the serving certificate (Unix time)",
            registry=registry,
        )


class CertReloader:
    """Keeps ``context`` (the listening SSLContext) serving the newest valid pair on disk."""

    def __init__(
        self,
        context: ssl.SSLContext,
        cert_path: str | Path,
        key_path: str | Path,
        client_ca: str | Path | None = None,
        *,
        interval: float = 5.0,
        registry: CollectorRegistry | None = None,
        build: Callable[[str | Path, str | Path, str | Path | None], ssl.SSLContext] = server_context,
    ) -> None:
        self.context = context
        self.paths = tuple(p for p in (cert_path, key_path, client_ca) if p)
        self.cert_path, self.key_path, self.client_ca = cert_path, key_path, client_ca
        self.interval = interval
        self._build = build
        self._metrics = ReloadMetrics(registry)
        self._current = context
        self._loaded = self._states()
        self._refused: tuple[FileState, ...] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.served = ServedCertificate.read(cert_path)
        self._metrics.not_after.set(self.served.not_after.timestamp())
        context.sni_callback = self._select

    def _select(self, sslobj: ssl.SSLObject, server_name: str | None, accepting: ssl.SSLContext) -> None:
        current = self._current
        if current is not accepting:
            sslobj.context = current

    def _states(self) -> tuple[FileState, ...]:
        return tuple(file_state(p) for p in self.paths)

    def check(self) -> bool:
        """One poll: reload if the files changed and the new pair is good. True when a new pair is now served."""
        before = self._states()
        if before == self._loaded or before == self._refused:
            return False
        try:
            fresh = self._build(self.cert_path, self.key_path, self.client_ca)
            served = ServedCertificate.read(self.cert_path)
        except (TLSError, OSError, ValueError) as e:
            if self._states() != before:
                return False  # caught mid-rotation; the next poll sees the finished state
            self._refused = before
            self._metrics.reloads.labels("error").inc()
            log.error("new certificate refused; still serving the previous one",
                      extra={"error": str(e), "serial": f"{self.served.serial:x}"})
            return False
        if self._states() != before:
            return False  # files moved while we read them: a torn pair is possible, take the next poll's
        self._current, self._loaded, self._refused, self.served = fresh, before, None, served
        self._metrics.reloads.labels("success").inc()
        self._metrics.not_after.set(served.not_after.timestamp())
        log.info("serving a new certificate", extra={"subject": served.subject, "serial": f"{served.serial:x}",
                                                    "not_after": served.not_after.isoformat()})
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # never let the watcher die: the old pair keeps serving
                log.exception("certificate reload check failed")

    def start(self) -> CertReloader:
        if self.interval > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tls-reload", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)
