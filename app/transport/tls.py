"""TLS: the serving context (TLS 1.2 minimum) and dev/CA certificate generation."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# TLS 1.2: forward-secret AEAD suites only (no CBC), what Go's crypto/tls, and so kube-apiserver, offers first
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class TLSError(ValueError):
    """A certificate or key the guard refuses to serve with, or cannot write; the text names the file."""


def check_certificate(cert_path: str | Path, now: dt.datetime | None = None) -> x509.Certificate:
    p = Path(cert_path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TLSError(f"--tls-cert {p}: cannot read: {e.strerror or e}") from None
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError:
        raise TLSError(f"--tls-cert {p}: not a PEM certificate") from None
    now = now or dt.datetime.now(dt.timezone.utc)
    if cert.not_valid_after_utc < now:
        raise TLSError(f"--tls-cert {p}: certificate expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S}Z")
    if cert.not_valid_before_utc > now:
        raise TLSError(f"--tls-cert {p}: certificate not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M:%S}Z")
    return cert


def server_context(cert_path: str | Path, key_path: str | Path, client_ca: str | Path | None = None) -> ssl.SSLContext:
    """An SSLContext for serving: TLS 1.2+ (AEAD suites on 1.2), the given pair, optionally requiring client certs."""
    check_certificate(cert_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)  # TLS 1.3's suites are all AEAD and not affected
    try:
        ctx.load_cert_chain(str(cert_path), str(key_path))
    except ssl.SSLError as e:
        raise TLSError(f"--tls-key {key_path}: does not load with --tls-cert {cert_path}: {e.reason or e}") from None
    except OSError as e:  # missing, or unreadable (OpenShift runs the container with a random UID)
        raise TLSError(f"--tls-key {key_path}: cannot read: {e.strerror or e}") from None
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as e:
            raise TLSError(f"--client-ca {client_ca}: cannot load: {e}") from None
        # asked, verified when sent, required by the admission paths (protocol.Listener): kubelet probes send none
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


@dataclass
class IssuedCerts:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_pem).decode()


def service_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", "localhost"]


def issue_certs(service: str, namespace: str, days: int = 365, now: dt.datetime | None = None,
                client_auth: bool = False) -> IssuedCerts:
    """A CA and a serving certificate for the Service (and localhost/127.0.0.1), ECDSA P-256.
    ``client_auth`` also allows the certificate to authenticate a client (tests of ``--client-ca``)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    start = now - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + dt.timedelta(days=days * 10))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in service_names(service, namespace)]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace}.svc")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]
                                             + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return IssuedCerts(
        ca_pem=ca.public_bytes(pem),
        cert_pem=cert.public_bytes(pem),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


CERT_FILES = {"ca": ("ca.crt", 0o644), "cert": ("tls.crt", 0o644), "key": ("tls.key", 0o600)}


def write_certs(issued: IssuedCerts, out: str | Path, force: bool = False) -> dict[str, Path]:
    """ca.crt, tls.crt and tls.key in ``out`` (created). Existing files are refused unless ``force``,
    all three checked before any is written. Each file is written to a new file in the same folder
    and renamed over its name: the key is mode 0600 from its first byte (also when it replaces a
    key of another mode), and a reader never sees a half-written file."""
    d = Path(out)
    paths = {kind: d / name for kind, (name, _) in CERT_FILES.items()}
    if d.exists() and not d.is_dir():
        raise TLSError(f"--out {d}: exists and is not a folder")
    existing = [p.name for p in paths.values() if p.exists() or p.is_symlink()]
    if existing and not force:
        raise TLSError(f"--out {d}: {', '.join(existing)} already there; --force replaces them")
    data = {"ca": issued.ca_pem, "cert": issued.cert_pem, "key": issued.key_pem}
    try:
        d.mkdir(parents=True, exist_ok=True)
        for kind, (_, mode) in CERT_FILES.items():
            replace_file(paths[kind], data[kind], mode)
    except OSError as e:
        raise TLSError(f"--out {d}: cannot write: {e.strerror or e}") from None
    return paths


def replace_file(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file (created with ``mode``) beside ``path``, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp: mode 0600, O_EXCL
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
