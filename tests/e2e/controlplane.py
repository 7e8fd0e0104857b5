"""A real control plane for the end-to-end tests: etcd and kube-apiserver on loopback, like envtest.

Built from the pinned sources in ``e2e/go.mod`` by ``e2e/build.sh`` (``make e2e``). Everything is private to one
temporary folder: random ports, a CA that signs the API server's serving certificate and an admin client
certificate (``O=system:masters``), a service-account signing key (so TokenRequest works and the guard can run with
its chart ServiceAccount's own token), ``--authorization-mode=RBAC``. No kubelet, scheduler or controller-manager:
whatever they would do, a test does itself.

Departures from a production API server, each because nothing here would do that work: the ``ServiceAccount``
admission plugin is off (no controller creates a namespace's ``default`` ServiceAccount, so pods could not be
created); the API server does not compact etcd on its own (``--etcd-compaction-interval=0``): a test compacts it
when it wants a watch to fall behind (``compact_etcd``). On SIGTERM the API server ends open watches cleanly
within 2 s (``--shutdown-watch-termination-grace-period``), as API servers set up for graceful rollouts do; by
default it would hold them open until killed, which makes a stop take 30 s here.

An audit log (``audit.log``, level Metadata for every request, JSON lines) records who did what and what the
authorizer and the admission webhooks said about it (``audit_events``): the RBAC check reads the guard's own calls
from it, the eviction checks the webhook's audit annotations. ``install_crds`` registers KubeVirt's CRDs as
KubeVirt's own generators print them and the KubeDescheduler CRD of ``tests/e2e/crds`` (envtest's
``CRDDirectoryPaths``).

The aggregation layer is set up as kubeadm sets it up: a front-proxy CA, the proxy client certificate the API server
presents to aggregated API servers (``--proxy-client-cert-file``) and the request-header flags they read back from
the ``kube-system/extension-apiserver-authentication`` ConfigMap. ``--enable-aggregator-routing`` makes the API server
call an APIService's (and a webhook Service's) endpoints, from their EndpointSlices, instead of a ClusterIP no
kube-proxy serves here. Endpoint validation refuses loopback addresses, so a server a test registers behind a Service
listens on this machine's own address (``host_address``).

``webhook_client_hosts``: the API server presents a client certificate (``webhook_client_cert``, signed by
``webhook_client_ca``) to the webhooks at these hosts, configured as docs/install.md ("Client certificates") tells
users: ``--admission-control-config-file`` naming a kubeconfig whose user entries are the webhooks' hosts.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("E2E_BIN") or ROOT / "build" / "e2e" / "bin")
BINARIES = ("kube-apiserver", "kubectl", "etcd", "descheduler", "helm", "helm3", "kubevirt-manifests")
CRDS = Path(__file__).resolve().parent / "crds"
FRONT_PROXY_CLIENT = "front-proxy-client"  # the CN of the API server's proxy client certificate (kubeadm's)
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata"}]}


def missing_binaries(bin_dir: Path = BIN) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def legacy_endpoints(namespace: str, service: str, address: str, port: int, port_name: str = "") -> dict:
    """The core/v1 Endpoints the endpoints controller writes beside a Service's EndpointSlice, for one ready address.
    kube-apiserver 1.30 resolves an APIService's or a webhook Service's endpoints from them
    (k8s.io/apiserver v0.30.14 pkg/util/proxy/proxy.go ``ResolveEndpoint(services, endpoints, ...)``); 1.37 reads
    EndpointSlices (v0.37.2, same file: ``ResolveEndpoint(services, endpointSlices, ...)``). Tests write both, as a
    cluster's two controllers do."""
    return {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": service, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": address}],
                         "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_address() -> str:
    """This machine's own (non-loopback) IPv4 address: the source address of its default route, else the first
    global address of an interface. ``E2E_HOST_IP`` overrides. The API server accepts it as an endpoint address
    (loopback and link-local ones are refused by EndpointSlice validation), and it is local, so nothing leaves the
    machine."""
    if os.environ.get("E2E_HOST_IP"):
        return os.environ["E2E_HOST_IP"]
    candidates = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3; a UDP connect sends nothing, it only picks the route
            candidates.append(s.getsockname()[0])
        except OSError:
            pass
    candidates += _interface_addresses()
    for addr in candidates:
        ip = ipaddress.ip_address(addr)
        if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast):
            return addr
    raise RuntimeError("no non-loopback IPv4 address on this machine for endpoints the API server accepts; "
                       "set E2E_HOST_IP to one (or add one to a dummy interface)")


def _interface_addresses() -> list[str]:
    import fcntl
    import struct

    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
            out.append(socket.inet_ntoa(raw[20:24]))
    return out


def binary_version(name: str, bin_dir: Path = BIN) -> str:
    """What the binary says of itself (``--version`` / ``version``), first line."""
    args = {"kube-apiserver": ["--version"], "kubectl": ["version", "--client"], "etcd": ["--version"],
            "descheduler": ["version"], "helm": ["version", "--short"], "helm3": ["version", "--short"]}[name]
    out = subprocess.run([str(bin_dir / name), *args], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).strip().splitlines()[0]


# ---- certificates ------------------------------------------------------------


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CertificateAuthority:
    """The control plane's CA: signs the API server's serving certificate and client certificates."""

    def __init__(self, cn: str = "e2e-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _pem_key(self.key)

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        """The same CA in another process (the outcome run's actor issues its kubelets' certificates with it)."""
        ca = cls.__new__(cls)
        ca.cert = x509.load_pem_x509_certificate(cert_pem)
        ca.key = serialization.load_pem_private_key(key_pem, password=None)
        return ca

    def issue(self, cn: str, org: str | None = None, server: bool = False, dns_names: tuple[str, ...] = (),
              ips: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM): a serving certificate for loopback (and ``dns_names``, ``ips``), or a client
        certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        b = (x509.CertificateBuilder().subject_name(_name(cn, org)).issuer_name(self.cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if server:
            sans = [x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                              "kubernetes.default.svc", *dns_names)]
            sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", *ips)]
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def write_kubeconfig(path: Path, server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None,
                     token: str | None = None, user: str = "user") -> Path:
    """A kubeconfig with one cluster, one user (client certificate or bearer token) and one context."""
    u: dict = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": u}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
    }
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
    path.chmod(0o600)
    return path


# ---- processes ---------------------------------------------------------------


class _Process:
    def __init__(self, name: str, cmd: list[str], log: Path) -> None:
        self.name, self.cmd, self.log = name, cmd, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ControlPlane:
    """etcd + kube-apiserver in ``workdir``. ``start()`` returns when ``/readyz`` answers 200 to the admin."""

    def __init__(self, workdir: Path, bin_dir: Path = BIN, extra_args: tuple[str, ...] = (),
                 webhook_client_hosts: tuple[str, ...] = (), address: str = "127.0.0.1",
                 prefix: list[str] | None = None, for_node: bool = False) -> None:
        """``address``: where etcd and the API server listen (and what the API server advertises); ``prefix``: a
        command both run under (tests/e2e/node.py: ``nsenter`` into the node's namespaces). ``for_node``: the API
        server a kubelet and the controllers join: Node and RBAC authorization, the ServiceAccount and
        NodeRestriction admission plugins on."""
        if address != "127.0.0.1":
            extra_args = ("--bind-address", address, "--advertise-address", address, *extra_args)
        self.dir = workdir
        self.bin = bin_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.etcd_port, self.etcd_peer_port, self.port = free_port(), free_port(), free_port()
        self.url = f"https://{address}:{self.port}"
        self.etcd_url = f"http://{address}:{self.etcd_port}"
        self.ca = CertificateAuthority()
        self.ca_path = self._write("ca.crt", self.ca.pem)
        # 10.96.0.1: the `kubernetes` Service's ClusterIP, the address in-cluster clients use
        serving, serving_key = self.ca.issue("kube-apiserver", server=True,
                                             ips=tuple(a for a in (address, "10.96.0.1") if a != "127.0.0.1"))
        self._write("apiserver.crt", serving)
        self._write("apiserver.key", serving_key)
        admin, admin_key = self.ca.issue("e2e-admin", org="system:masters")
        self.admin_kubeconfig = write_kubeconfig(self.dir / "admin.kubeconfig", self.url, self.ca_path,
                                                 cert=self._write("admin.crt", admin),
                                                 key=self._write("admin.key", admin_key), user="e2e-admin")
        self.audit_log = self.dir / "audit.log"
        self._audit_offset, self._audit_by_id, self._audit_lock = 0, {}, threading.Lock()
        self._write("audit-policy.yaml", json.dumps(AUDIT_POLICY).encode())
        # the aggregation layer (kubeadm's front-proxy): the API server's identity towards aggregated API servers
        self.front_proxy_ca = CertificateAuthority("e2e-front-proxy-ca")
        self.front_proxy_ca_path = self._write("front-proxy-ca.crt", self.front_proxy_ca.pem)
        proxy, proxy_key = self.front_proxy_ca.issue(FRONT_PROXY_CLIENT)
        self._write("front-proxy-client.crt", proxy)
        self._write("front-proxy-client.key", proxy_key)
        admission = self._webhook_client_config(webhook_client_hosts) if webhook_client_hosts else []
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._write("sa.key", _pem_key(sa_key))
        self._write("sa.pub", sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                               serialization.PublicFormat.SubjectPublicKeyInfo))
        self.etcd = _Process("etcd", [
            str(bin_dir / "etcd"), "--name", "e2e", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://{address}:{self.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://{address}:{self.etcd_peer_port}",
            "--initial-cluster", f"e2e=http://{address}:{self.etcd_peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ], self.dir / "etcd.log")
        self.apiserver = _Process("kube-apiserver", [
            str(bin_dir / "kube-apiserver"),
            "--etcd-servers", self.etcd_url, "--etcd-compaction-interval", "0",
            "--bind-address", "127.0.0.1", "--secure-port", str(self.port),
            *([] if any(a.startswith("--advertise-address") for a in extra_args) else ["--advertise-address", "127.0.0.1"]),
            "--cert-dir", str(self.dir / "apiserver-certs"),
            "--tls-cert-file", str(self.dir / "apiserver.crt"), "--tls-private-key-file", str(self.dir / "apiserver.key"),
            "--client-ca-file", str(self.ca_path),
            *(("--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction") if for_node
              else ("--authorization-mode", "RBAC", "--disable-admission-plugins", "ServiceAccount")),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(self.dir / "sa.pub"),
            "--service-account-signing-key-file", str(self.dir / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--allow-privileged=true",
            "--audit-policy-file", str(self.dir / "audit-policy.yaml"), "--audit-log-path", str(self.audit_log),
            "--audit-log-format", "json", "--audit-log-mode", "blocking",
            # never rotated (the default rotates at 100 MB, which a session's floods reach): the checks read it all
            "--audit-log-maxsize", "1000000",
            "--shutdown-watch-termination-grace-period", "2s",
            "--proxy-client-cert-file", str(self.dir / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(self.dir / "front-proxy-client.key"),
            "--requestheader-client-ca-file", str(self.front_proxy_ca_path),
            "--requestheader-allowed-names", FRONT_PROXY_CLIENT,
            "--requestheader-username-headers", "X-Remote-User", "--requestheader-group-headers", "X-Remote-Group",
            "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
            "--enable-aggregator-routing=true",
            *admission,
            # 1.37 refuses to start when the endpoint reconciler would publish a loopback address as the `kubernetes`
            # Service's endpoint (pkg/controlplane/instance.go: ValidateIP); Kubernetes' own test server turns the
            # reconciler off for a loopback advertise address, as here, unless the caller sets either flag
            *([] if any(a.startswith(("--advertise-address", "--endpoint-reconciler-type")) for a in extra_args)
              else ["--endpoint-reconciler-type", "none"]),
            *extra_args,
        ], self.dir / "kube-apiserver.log")
        for p in (self.etcd, self.apiserver):
            p.cmd = [*(prefix or ()), *p.cmd]

    def _webhook_client_config(self, hosts: tuple[str, ...]) -> list[str]:
        """docs/install.md's AdmissionConfiguration and webhook kubeconfig: a client certificate (from its own CA,
        the one a guard's ``clientCA`` names) for each of ``hosts``; the API server's flag that reads them."""
        self.webhook_client_ca = CertificateAuthority("e2e-webhook-client-ca")
        self.webhook_client_ca_path = self._write("webhook-client-ca.crt", self.webhook_client_ca.pem)
        cert, key = self.webhook_client_ca.issue("kube-apiserver-webhook-client")
        self.webhook_client_cert = (self._write("webhook-client.crt", cert), self._write("webhook-client.key", key))
        self.webhook_kubeconfig = self.dir / "webhook-kubeconfig.yaml"
        self.webhook_kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "users": [{"name": host, "user": {"client-certificate": str(self.webhook_client_cert[0]),
                                              "client-key": str(self.webhook_client_cert[1])}} for host in hosts],
        }, indent=1))
        plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
                  "kubeConfigFile": str(self.webhook_kubeconfig)}
        self.admission_config = self._write("admission.yaml", json.dumps({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
            "plugins": [{"name": name, "configuration": plugin}
                        for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")],
        }, indent=1).encode())
        return ["--admission-control-config-file", str(self.admission_config)]

    def _write(self, name: str, data: bytes) -> Path:
        p = self.dir / name
        p.write_bytes(data)
        if name.endswith(".key"):
            p.chmod(0o600)
        return p

    # -- lifecycle --

    def start(self, timeout: float = 120) -> "ControlPlane":
        self.etcd.start()
        self._wait(lambda: httpx.get(f"{self.etcd_url}/health", timeout=2).json().get("health") == "true",
                   self.etcd, timeout)
        self.start_apiserver(timeout)
        return self

    def start_apiserver(self, timeout: float = 120) -> None:
        self.apiserver.start()
        self._wait(self.ready, self.apiserver, timeout)

    def stop_apiserver(self, sig: int = signal.SIGTERM) -> None:
        self.apiserver.stop(sig)

    def stop(self) -> None:
        self.apiserver.stop()
        self.etcd.stop()

    def ready(self) -> bool:
        with self.admin_http(timeout=3) as c:
            return c.get("/readyz").status_code == 200

    def _wait(self, check, proc: _Process, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited ({proc.proc.returncode if proc.proc else '?'}):\n{proc.tail()}")
            try:
                if check():
                    return
            except (httpx.HTTPError, ValueError) as e:
                last = e
            time.sleep(0.2)
        raise TimeoutError(f"{proc.name} not ready in {timeout:.0f} s ({last}):\n{proc.tail()}")

    # -- clients --

    def admin_http(self, **kw) -> httpx.Client:
        """An httpx client authenticated as the admin (system:masters)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_path))
        ctx.load_cert_chain(str(self.dir / "admin.crt"), str(self.dir / "admin.key"))
        return httpx.Client(base_url=self.url, verify=ctx, **kw)

    def api_client(self):
        """A ``kubernetes`` ApiClient authenticated as the admin (what the guard itself uses, from a kubeconfig)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.admin_kubeconfig), client_configuration=cfg, persist_config=False)
        return client.ApiClient(cfg)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
        """The built kubectl, as the admin (or ``kubeconfig``); raises with its output when it fails and ``check``."""
        cmd = [str(self.bin / "kubectl"), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig), *args]
        out = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[3:])} exited {out.returncode}:\n{out.stdout}{out.stderr}")
        return out

    def install_crds(self, directory: Path = CRDS, timeout: float = 60, kubevirt: bool = True) -> list[str]:
        """``kubectl apply`` every CRD in ``directory`` and (``kubevirt``) KubeVirt's own CRDs, as KubeVirt's
        generators print them (``kubevirt-manifests``, built by ``e2e/kubevirt/build.sh``), and wait until each is
        Established and served."""
        files = sorted(directory.glob("*.yaml"))
        docs = [yaml.safe_load(f.read_text()) for f in files]
        if kubevirt:
            from tests.e2e.kubevirt import manifests  # here, not at import: that module builds on this one

            docs += [o for o in manifests(self.bin) if o["kind"] == "CustomResourceDefinition"]
        names = [d["metadata"]["name"] for d in docs]
        # one List: kubectl 1.30 reads a stream that starts with "{" as a single JSON document
        self.kubectl("apply", "--server-side", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                           "items": docs}), timeout=timeout + 60)
        self.kubectl("wait", "--for=condition=Established", "--timeout", f"{int(timeout)}s",
                     *[f"crd/{n}" for n in names], timeout=timeout + 10)
        return names

    def audit_events(self, user: str | None = None) -> list[dict]:
        """One audit event per request so far, in order (of ``user`` only, if given): its ResponseComplete event,
        or ResponseStarted for a request still running (a watch)."""
        # The log only grows: each call parses the lines added since the last one (whole lines; the one being written
        # waits for the next call), so that polling it stays cheap however long the session has run.
        with self._audit_lock:
            try:
                with self.audit_log.open("rb") as f:
                    if f.seek(0, os.SEEK_END) < self._audit_offset:
                        raise AssertionError(f"{self.audit_log} shrank: rotated, and the events in between are lost")
                    f.seek(self._audit_offset)
                    data = f.read()
            except FileNotFoundError:
                return []
            whole = data[:data.rfind(b"\n") + 1]
            self._audit_offset += len(whole)
            for line in whole.splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("stage") in ("ResponseStarted", "ResponseComplete"):
                    self._audit_by_id[ev["auditID"]] = ev  # dicts keep the first insertion's place: the request's order
            events = list(self._audit_by_id.values())
        if user is not None:
            events = [ev for ev in events if ev.get("user", {}).get("username") == user]
        return events

    def token_kubeconfig(self, token: str, name: str) -> Path:
        return write_kubeconfig(self.dir / f"{name}.kubeconfig", self.url, self.ca_path, token=token, user=name)

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A TokenRequest token of ServiceAccount ``namespace/name`` (what a pod's projected token is)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds}}
        with self.admin_http(timeout=10) as c:
            r = c.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", json=body)
            r.raise_for_status()
            return r.json()["status"]["token"]

    # -- etcd --

    def etcd_revision(self) -> int:
        r = httpx.post(f"{self.etcd_url}/v3/kv/range", json={"key": base64.b64encode(b"/").decode()}, timeout=5)
        r.raise_for_status()
        return int(r.json()["header"]["revision"])

    def bump_etcd_revision(self) -> int:
        """One write straight to etcd (a key outside the API server's prefix): the revision moves on without any
        object changing, so a restarted API server's watch cache starts past every resourceVersion a client has."""
        r = httpx.post(f"{self.etcd_url}/v3/kv/put", json={"key": base64.b64encode(b"/e2e/revision-bump").decode(),
                                                           "value": base64.b64encode(b"1").decode()}, timeout=5)
        r.raise_for_status()
        return int(r.json()["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now (what the API server does every 5 minutes): watches that resume from an
        older resourceVersion than the API server's watch cache still holds get 410 Gone."""
        rev = self.etcd_revision()
        r = httpx.post(f"{self.etcd_url}/v3/kv/compaction", json={"revision": str(rev), "physical": True}, timeout=30)
        r.raise_for_status()
        return rev


Process = _Process  # a local process with its log file (also what tests/e2e/kubevirt.py runs KubeVirt's binaries as)
