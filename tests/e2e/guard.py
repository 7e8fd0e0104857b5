"""The chart installed as a user installs it, and the guard run beside the control plane with the chart's identity.

``install_chart`` does what docs/install.md tells a user who runs the guard outside the cluster to do, with the
real CLIs against the real API server (admin kubeconfig): ``kubevirt-eviction-guard certs`` makes a CA and a serving
certificate (valid for 127.0.0.1), ``kubectl create secret tls`` stores it ("own Secret" mode), and
``helm install`` installs the chart with ``webhook.url`` pointing at the local guard and ``certificates.mode:
secret`` with the CA as ``caBundle``. Nothing is rendered or applied by hand.

``GuardProcess`` then runs ``python -m app serve`` as the chart's Deployment would run it: the container's args and
the ConfigMap's ``config.yaml`` are read back from the API server, only the pod-local paths and ports are replaced
(TLS files, config file, listen address), and ``--kubeconfig`` carries a TokenRequest token of the chart's
ServiceAccount. Every call the guard makes therefore passes the real RBAC authorizer with exactly the chart's rules.

The Deployment the chart creates never gets a pod: there is no scheduler and no kubelet. That is expected; the
local process stands in for its pod.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.controlplane import ROOT, ControlPlane, free_port, legacy_endpoints
from tests.values import merge

CHART = ROOT / "charts" / "kubevirt-eviction-guard"
CHART_NAME = "kubevirt-eviction-guard"
NAMESPACE = "kubevirt-eviction-guard"
RELEASE = "guard"
TLS_SECRET = "guard-serving-cert"
# where the chart mounts things in the pod (templates/_helpers.tpl): replaced by local files
POD_TLS_DIR = "/etc/kubevirt-eviction-guard/tls"
POD_CONFIG = "/etc/kubevirt-eviction-guard/config/config.yaml"
POD_SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def fullname(release: str, values: dict) -> str:
    """The chart's ``guard.fullname`` (templates/_helpers.tpl)."""
    if values.get("fullnameOverride"):
        return values["fullnameOverride"][:63].rstrip("-")
    name = values.get("nameOverride") or CHART_NAME
    return (release if name in release else f"{release}-{name}")[:63].rstrip("-")


@dataclass
class Installation:
    """A release of the chart on the control plane, and what the local guard needs to stand in for its pod."""

    cp: ControlPlane
    release: str
    namespace: str
    values: dict
    port: int  # where the webhook's clientConfig.url points: the local guard's HTTPS port
    certs: dict[str, Path]  # ca, cert, key: what `kubevirt-eviction-guard certs` wrote
    workdir: Path
    helm_output: str = ""
    manifests: list[dict] = field(default_factory=list)

    @property
    def fullname(self) -> str:
        return fullname(self.release, self.values)

    def one(self, kind: str) -> dict:
        found = [m for m in self.manifests if m.get("kind") == kind]
        assert len(found) == 1, f"expected one {kind} in the release, got {len(found)}"
        return found[0]

    @property
    def service_account(self) -> str:
        return self.one("ServiceAccount")["metadata"]["name"]

    @property
    def username(self) -> str:
        """The guard's user name as the API server sees it."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def webhook_configuration(self) -> dict:
        return next(m for m in self.manifests if m.get("kind", "").endswith("WebhookConfiguration"))

    @property
    def webhook_name(self) -> str:
        return self.webhook_configuration["webhooks"][0]["name"]

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        """An object of the release as the API server has it (``kubectl get -o json``)."""
        ns = ["-n", namespace or self.namespace] if namespace is not False else []
        return json.loads(self.cp.kubectl("get", kind, name, *ns, "-o", "json").stdout)


def credential_id(token: str) -> str:
    """What the API server records of a ServiceAccount token in ``user.extra["authentication.kubernetes.io/
    credential-id"]`` (audit log, SubjectAccessReviews): ``JTI=<the token's jti>``. It tells one token's requests
    from another's of the same ServiceAccount."""
    payload = token.split(".")[1]
    return "JTI=" + json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"]


def helm(cp: ControlPlane, *args: str, timeout: float = 120, binary: str = "helm") -> str:
    """The built Helm CLI (``binary``: ``helm``, v4, or ``helm3``) against the control plane, as the admin; its
    stdout, or an error with its output."""
    env = {**os.environ, "HELM_CACHE_HOME": str(cp.dir / "helm" / "cache"),
           "HELM_CONFIG_HOME": str(cp.dir / "helm" / "config"), "HELM_DATA_HOME": str(cp.dir / "helm" / "data")}
    cmd = [str(cp.bin / binary), "--kubeconfig", str(cp.admin_kubeconfig), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    return out.stdout


def issue_certs(workdir: Path, service: str, namespace: str) -> tuple[dict[str, Path], str]:
    """``kubevirt-eviction-guard certs``, the CLI a user runs: (paths of ca/cert/key, the caBundle it prints)."""
    out_dir = workdir / "certs"
    run = subprocess.run([sys.executable, "-m", "app", "--log-level", "warning", "certs", "--service", service,
                          "--namespace", namespace, "--out", str(out_dir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        raise RuntimeError(f"kubevirt-eviction-guard certs exited {run.returncode}: {run.stderr}")
    paths = {"ca": out_dir / "ca.crt", "cert": out_dir / "tls.crt", "key": out_dir / "tls.key"}
    missing = [str(p) for p in paths.values() if not p.exists()]
    assert not missing, f"certs did not write {missing}: {run.stderr}"
    return paths, run.stdout.strip()


def install_chart(cp: ControlPlane, workdir: Path, *, release: str = RELEASE, namespace: str = NAMESPACE,
                  values: dict | None = None, port: int | None = None, service: bool = False) -> Installation:
    """Install the chart with ``helm install`` for a guard that will listen on 127.0.0.1:``port``.

    ``values`` are merged over the test's own (``webhook.url``, ``certificates.mode: secret``); anything a user may
    set can be given, e.g. ``{"policy": {...}, "cancelStuckEvacuations": {"enabled": True}}``. ``service``: no
    ``webhook.url``, the chart's own ``clientConfig.service`` (the API server reaches the guard through the Service's
    EndpointSlice, ``publish_endpoint``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    certs, ca_bundle = issue_certs(workdir, fullname(release, values or {}), namespace)
    if cp.kubectl("get", "namespace", namespace, check=False).returncode != 0:
        cp.kubectl("create", "namespace", namespace)
    cp.kubectl("-n", namespace, "create", "secret", "tls", TLS_SECRET, "--cert", str(certs["cert"]),
               "--key", str(certs["key"]))
    chosen = merge({
        **({} if service else {"webhook": {"url": f"https://127.0.0.1:{port}"}}),
        "certificates": {"mode": "secret", "secret": {"name": TLS_SECRET, "caBundle": ca_bundle}},
    }, values or {})
    values_file = workdir / f"values-{release}.yaml"
    values_file.write_text(yaml.safe_dump(chosen, sort_keys=False))
    output = helm(cp, "install", release, str(CHART), "--namespace", namespace, "--values", str(values_file))
    inst = Installation(cp, release, namespace, chosen, port, certs, workdir, helm_output=output)
    manifest = helm(cp, "get", "manifest", release, "--namespace", namespace)
    inst.manifests = [d for d in yaml.safe_load_all(manifest) if d]
    return inst


def publish_endpoint(inst: Installation, address: str, port: int) -> None:
    """What the EndpointSlice controller writes for a Ready pod of the release at ``address``: the chart's Service
    (port ``https``) then leads to ``address:port``; the API server, run with ``--enable-aggregator-routing``, calls a
    service webhook there. ``address`` must be one the API server accepts as an endpoint (not loopback)."""
    service = inst.one("Service")
    doc = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": f"{inst.fullname}-e2e", "namespace": inst.namespace,
                        "labels": {"kubernetes.io/service-name": service["metadata"]["name"],
                                   "endpointslice.kubernetes.io/managed-by": "e2e.kubevirt-eviction-guard.io"}},
           "addressType": "IPv4", "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
           "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]}
    endpoints = legacy_endpoints(inst.namespace, service["metadata"]["name"], address, port, "https")
    inst.cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [doc, endpoints]}))


def uninstall_chart(inst: Installation) -> None:
    """``helm uninstall`` and the TLS Secret the install created (the namespace stays)."""
    helm(inst.cp, "uninstall", inst.release, "--namespace", inst.namespace, "--wait")
    inst.cp.kubectl("-n", inst.namespace, "delete", "secret", TLS_SECRET, "--ignore-not-found")


class GuardProcess:
    """``python -m app serve`` with the installed Deployment's args and the chart ServiceAccount's token.

    ``extra_args`` are appended (later flags win in argparse), e.g. ``["--stale-after", "5s"]``. By default
    ``--shutdown-drain=0s`` is added so that stopping costs no drain time; ``drain=True`` keeps the chart's."""

    def __init__(self, inst: Installation, extra_args: tuple[str, ...] | list[str] = (), *, name: str = "guard",
                 drain: bool = False, token_seconds: int = 3 * 3600, host: str = "127.0.0.1",
                 files: dict[str, Path] | None = None, probe: str = "https") -> None:
        """``host``: the address both ports listen on; ``files``: local stand-ins for more of the pod's paths (e.g. the
        client CA's); ``probe``: ``https`` (``/readyz`` on the webhook port) or ``metrics`` (on the plain port, as
        the chart's probes do: the way with ``clientCA``)."""
        self.inst, self.cp = inst, inst.cp
        self.dir = inst.workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host, self.probe = host, probe
        self.port = inst.port
        self.metrics_port = free_port()
        self.url = f"https://{host}:{self.port}"
        self.log = self.dir / "guard.log"
        token = self.cp.service_account_token(inst.namespace, inst.service_account, seconds=token_seconds)
        self.kubeconfig = self.cp.token_kubeconfig(token, f"{name}-{inst.service_account}")
        token_file = self.dir / "token"
        token_file.write_text(token)
        self.credential_id = credential_id(token)
        config = self.dir / "config.yaml"
        configmap = inst.get("configmap", inst.fullname)
        config.write_text(configmap["data"]["config.yaml"])
        self.paths = {f"{POD_TLS_DIR}/tls.crt": inst.certs["cert"], f"{POD_TLS_DIR}/tls.key": inst.certs["key"],
                      POD_CONFIG: config, POD_SA_TOKEN: token_file, **(files or {})}
        deployment = inst.get("deployment", inst.fullname)
        (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "guard"]
        self.chart_args = list(container["args"])
        self.args = [*self._local(self.chart_args), f"--kubeconfig={self.kubeconfig}",
                     *([] if drain else ["--shutdown-drain=0s"]), *extra_args]
        self.proc: subprocess.Popen | None = None

    def _local(self, args: list[str]) -> list[str]:
        out = []
        for arg in args:
            flag, eq, value = arg.partition("=")
            if flag == "--host":
                value = self.host
            elif flag == "--port":
                value = str(self.port)
            elif flag == "--metrics-port":
                value = str(self.metrics_port)
            elif value.startswith("/"):
                if value not in self.paths:
                    raise ValueError(f"the chart's {flag} names {value} in the pod; no local file stands in for it")
                value = str(self.paths[value])
            out.append(f"{flag}{eq}{value}" if eq else arg)
        return out

    # ---- lifecycle --------------------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = 60) -> GuardProcess:
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "app", "serve", *self.args], cwd=ROOT, stdout=f,
                                         stderr=subprocess.STDOUT, env={k: v for k, v in os.environ.items()
                                                                        if k not in ("KUBECONFIG",
                                                                                     "KUBERNETES_SERVICE_HOST")})
        if wait:
            self.wait_ready(timeout)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        if not self.alive():
            return self.proc.returncode if self.proc else None
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the process reads nothing (its sockets keep what arrives) until ``resume``."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def wait_ready(self, timeout: float = 60) -> None:
        """Until ``/readyz`` answers 200 (every kind listed through the API server with the chart's RBAC)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"guard exited ({self.proc.returncode if self.proc else '?'}):\n{self.tail()}")
            try:
                status, body = self.readyz()
                if status == 200:
                    return
                last = json.dumps(body)
            except httpx.TransportError as e:
                last = str(e)
            time.sleep(0.1)
        raise TimeoutError(f"guard not ready in {timeout:.0f} s ({last}):\n{self.tail()}")

    # ---- what it says ---------------------------------------------------------------------------------

    def client(self, **kw) -> httpx.Client:
        """HTTPS to the guard, trusting the CA the API server trusts for it (the caBundle)."""
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=str(self.inst.certs["ca"])),
                            timeout=10, **kw)

    def readyz(self) -> tuple[int, dict]:
        if self.probe == "metrics":
            r = httpx.get(f"http://{self.host}:{self.metrics_port}/readyz", timeout=10)
            return r.status_code, r.json()
        with self.client() as c:
            r = c.get("/readyz")
            return r.status_code, r.json()

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """``/metrics`` of the plain metrics port as {(sample name, labels): value}."""
        r = httpx.get(f"http://{self.host}:{self.metrics_port}/metrics", timeout=10)
        r.raise_for_status()
        return {(s.name, frozenset(s.labels.items())): s.value
                for fam in text_string_to_metric_families(r.text) for s in fam.samples}

    def metric(self, name: str, **labels: str) -> float:
        """The sum of ``name`` over the series whose labels include ``labels`` (0 when none)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and want <= ls)

    def logs(self) -> list[dict]:
        """The guard's JSON log lines so far."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
