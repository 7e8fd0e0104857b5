"""Real KubeVirt on the end-to-end control plane: virt-api and virt-controller, installed as virt-operator would.

The binaries are KubeVirt's own, built from the release pinned in ``e2e/kubevirt/go.mod`` by
``e2e/kubevirt/build.sh`` (``make e2e-bin``), and so is every object installed here: ``kubevirt-manifests`` prints
them from KubeVirt's generators (``pkg/virt-operator/resource/generate``: the CRDs, the ServiceAccounts, ClusterRoles,
Roles and bindings of virt-api, virt-controller and virt-handler, virt-api's validating and mutating webhook
configurations, its Service and APIService, the ``kubevirt-ca`` ConfigMap). ``install`` applies them as the operator
does, with three changes because no pod runs: the webhooks' ``clientConfig`` names virt-api's local URL and the
CA instead of the Service; an EndpointSlice (what the EndpointSlice controller would write for a Ready virt-api pod)
points the Service, and so the APIService, at the local virt-api; the CA and the certificates are made here, as the
operator's certificate manager would make them, each pair in its own directory (KubeVirt's certificate managers watch
the whole directory).

virt-api and virt-controller then run as local processes, each with a TokenRequest token of its own ServiceAccount
(``kubevirt-apiserver``, ``kubevirt-controller``, bound to KubeVirt's own ClusterRoles, never cluster-admin) in a
kubeconfig, with the arguments virt-operator's Deployments give them (``NewApiServerDeployment``,
``NewControllerDeployment``) plus only the local paths and ports. virt-controller listens on loopback and elects a
leader through its Lease, as shipped. virt-api listens on this machine's own address (``host_address``), because the
aggregation layer dials the APIService's endpoint and EndpointSlice validation refuses loopback; that address is
local, so nothing leaves the machine.

What has no binary here (kubelet, the scheduler's binding, virt-handler) is the actor's (``tests/e2e/actor/node.py``).
"""

from __future__ import annotations

import base64
import copy
import json
import platform
import signal
import ssl
import subprocess
import time
from pathlib import Path

import httpx

from tests.e2e.controlplane import BIN, CRDS, ROOT, CertificateAuthority, ControlPlane, Process, free_port, host_address
from tests.live_support import eventually

NAMESPACE = "kubevirt"
GROUP = "subresources.kubevirt.io"
APISERVICE = f"v1.{GROUP}"
API_SA, CONTROLLER_SA, HANDLER_SA = "kubevirt-apiserver", "kubevirt-controller", "kubevirt-handler"
BINARIES = ("virt-api", "virt-controller", "kubevirt-manifests")
LAUNCHER_IMAGE = "registry.example/kubevirt/virt-launcher:e2e"  # never pulled: no kubelet runs the pods
TOKEN_SECONDS = 4 * 3600
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "s390x": "s390x"}.get(platform.machine(), "amd64")


def missing_binaries(bin_dir: Path = BIN) -> list[str]:
    return [b for b in BINARIES if not (bin_dir / b).exists()]


def manifests(bin_dir: Path = BIN, namespace: str = NAMESPACE) -> list[dict]:
    """The objects KubeVirt's operator installs for virt-api and virt-controller, from KubeVirt's generators."""
    out = subprocess.run([str(bin_dir / "kubevirt-manifests"), namespace], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def version(cp: ControlPlane) -> dict:
    """virt-api's own answer to ``GET /apis/subresources.kubevirt.io/v1/version`` (KubeVirt's version info)."""
    with cp.admin_http(timeout=10) as c:
        r = c.get(f"/apis/{GROUP}/v1/version")
        r.raise_for_status()
        return r.json()


class KubeVirt:
    """``KubeVirt(cp, workdir).start()`` installs KubeVirt and returns once virt-api serves its APIService and
    webhooks and virt-controller holds its leader Lease; ``stop()`` ends both processes."""

    def __init__(self, cp: ControlPlane, workdir: Path, bin_dir: Path = BIN, *, feature_gates: tuple[str, ...] = (),
                 migrations: dict | None = None, verbosity: int = 2) -> None:
        self.cp, self.dir, self.bin = cp, workdir, bin_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.feature_gates = feature_gates
        self.migrations = migrations or {}
        self.verbosity = verbosity
        self.address = host_address()
        self.api_port, self.controller_port = free_port(), free_port()
        self.ca = CertificateAuthority("kubevirt-ca")
        self.objects: list[dict] = []
        self.api: Process | None = None
        self.controller: Process | None = None

    # ---- install ----

    def _pair(self, name: str, cert_key: tuple[bytes, bytes]) -> tuple[Path, Path]:
        d = self.dir / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "tls.crt").write_bytes(cert_key[0])
        (d / "tls.key").write_bytes(cert_key[1])
        (d / "tls.key").chmod(0o600)
        return d / "tls.crt", d / "tls.key"

    def _apply(self, docs: list[dict]) -> None:
        self.cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                        input="\n---\n".join(json.dumps(d) for d in docs), timeout=120)

    def _webhooks(self, kind: str) -> list[dict]:
        """virt-api's webhook configurations, ``clientConfig`` rewritten from the Service to the local URL + CA."""
        out = []
        for cfg in (o for o in self.objects if o["kind"] == kind):
            cfg = copy.deepcopy(cfg)
            for hook in cfg["webhooks"]:
                svc = hook["clientConfig"].pop("service")
                hook["clientConfig"] = {"url": f"https://{self.address}:{self.api_port}{svc.get('path', '/')}",
                                        "caBundle": base64.b64encode(self.ca.pem).decode()}
            out.append(cfg)
        return out

    def install(self) -> None:
        self.objects = manifests(self.bin)
        kinds = {o["kind"] for o in self.objects}
        self.cp.kubectl("create", "namespace", NAMESPACE, check=False)
        crds = [o for o in self.objects if o["kind"] == "CustomResourceDefinition"]
        self._apply(crds)
        self.cp.kubectl("wait", "--for=condition=Established", "--timeout", "60s",
                        *[f"crd/{c['metadata']['name']}" for c in crds], timeout=70)
        rbac = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
        self._apply([o for o in self.objects if o["kind"] in rbac])
        # the CA, as the operator's certificate manager publishes it
        configmaps = [copy.deepcopy(o) for o in self.objects if o["kind"] == "ConfigMap"]
        for cm in configmaps:
            if cm["metadata"]["name"] == "kubevirt-ca":
                cm["data"] = {"ca-bundle": self.ca.pem.decode()}
        self._apply(configmaps)
        # the KubeVirt CR, with the status virt-operator writes once it has deployed: virt-config only reads a CR
        # whose status.phase is set, and takes the default architecture from its status (the operator's
        # SetConfigDefaults: the spec's, else the operator's own GOARCH)
        config: dict = {"developerConfiguration": {"featureGates": list(self.feature_gates)}}
        if self.migrations:
            config["migrations"] = self.migrations
        self._apply([{"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                      "metadata": {"name": "kubevirt", "namespace": NAMESPACE},
                      "spec": {"configuration": config}}])
        self.cp.kubectl("-n", NAMESPACE, "patch", "kubevirt", "kubevirt", "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": {"phase": "Deployed", "defaultArchitecture": ARCH}}))
        # virt-api's Service (the operator's) and the EndpointSlice a Ready virt-api pod would get
        service = next(o for o in self.objects if o["kind"] == "Service")
        slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": "virt-api-e2e", "namespace": NAMESPACE,
                               "labels": {"kubernetes.io/service-name": service["metadata"]["name"],
                                          "endpointslice.kubernetes.io/managed-by": "e2e.kubevirt-eviction-guard.io"}},
                  "addressType": "IPv4",
                  "ports": [{"name": p.get("name", ""), "port": self.api_port, "protocol": "TCP"}
                            for p in service["spec"]["ports"]],
                  "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}]}
        self._apply([service, slice_])
        assert {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "APIService"} <= kinds, kinds

    def _register(self) -> None:
        """The webhooks and the APIService, once virt-api serves (the operator creates them after its Deployment)."""
        self._apply(self._webhooks("ValidatingWebhookConfiguration") + self._webhooks("MutatingWebhookConfiguration"))
        apiservices = []
        for s in (o for o in self.objects if o["kind"] == "APIService"):
            s = copy.deepcopy(s)
            s["spec"]["caBundle"] = base64.b64encode(self.ca.pem).decode()
            s["spec"].pop("insecureSkipTLSVerify", None)
            apiservices.append(s)
        self._apply(apiservices)

    def _kubeconfig(self, service_account: str) -> Path:
        token = self.cp.service_account_token(NAMESPACE, service_account, seconds=TOKEN_SECONDS)
        return self.cp.token_kubeconfig(token, f"{NAMESPACE}-{service_account}")

    # ---- run ----

    def start(self, timeout: float = 120) -> KubeVirt:
        self.install()
        serving = self._pair("virt-api-certs", self.ca.issue(
            "virt-api.kubevirt.svc", server=True, dns_names=("virt-api", "virt-api.kubevirt", "virt-api.kubevirt.svc"),
            ips=(self.address,)))
        handler_client = self._pair("virt-api-handler-client-certs", self.ca.issue("kubevirt.io:system:client:virt-handler"))
        prom = self._pair("virt-controller-certs", self.ca.issue("virt-controller.kubevirt.svc", server=True))
        v = str(self.verbosity)
        self.api = Process("virt-api", [
            str(self.bin / "virt-api"), "--kubeconfig", str(self._kubeconfig(API_SA)),
            # NewApiServerDeployment's args
            "--port", str(self.api_port), "--console-server-port", "8186", "--subresources-only", "-v", v,
            # the pod's mounts, here local files; the listen address (see the module doc)
            "--listen", self.address,
            "--tls-cert-file", str(serving[0]), "--tls-key-file", str(serving[1]),
            "--handler-cert-file", str(handler_client[0]), "--handler-key-file", str(handler_client[1]),
        ], self.dir / "virt-api.log")
        self.controller = Process("virt-controller", [
            str(self.bin / "virt-controller"), "--kubeconfig", str(self._kubeconfig(CONTROLLER_SA)),
            # NewControllerDeployment's args
            "--launcher-image", LAUNCHER_IMAGE, "--exporter-image", LAUNCHER_IMAGE.replace("launcher", "exportserver"),
            "--port", str(self.controller_port), "-v", v,
            "--listen", "127.0.0.1", "--prom-cert-file", str(prom[0]), "--prom-key-file", str(prom[1]),
        ], self.dir / "virt-controller.log")
        self.api.start()
        self._wait(self._api_serving, self.api, timeout, "virt-api to serve")
        self._register()
        self.controller.start()
        self._wait(self._available, self.api, timeout, f"APIService {APISERVICE} to be Available")
        self._wait(self._leader, self.controller, timeout, "virt-controller to hold its leader Lease")
        return self

    def _wait(self, check, proc: Process, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for p in (self.api, self.controller):
                if p is not None and p.proc is not None and not p.alive():
                    raise RuntimeError(f"{p.name} exited ({p.proc.returncode}):\n{p.tail()}")
            try:
                result = check()
                if result is True:
                    return
                last = str(result)
            except (httpx.HTTPError, OSError, ValueError, KeyError) as e:
                last = repr(e)
            time.sleep(0.3)
        raise TimeoutError(f"waiting for {what} ({timeout:.0f} s): {last}\n{proc.tail()}")

    def _api_serving(self) -> bool | str:
        ctx = ssl.create_default_context(cadata=self.ca.pem.decode())
        ctx.check_hostname = False
        with httpx.Client(verify=ctx, timeout=3) as c:
            r = c.get(f"https://{self.address}:{self.api_port}/apis/{GROUP}/v1")
            return True if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"

    def _available(self) -> bool | str:
        with self.cp.admin_http(timeout=10) as c:
            svc = c.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}").json()
            cond = next((x for x in svc.get("status", {}).get("conditions", []) if x["type"] == "Available"), {})
            if cond.get("status") != "True":
                return f"{cond.get('reason')}: {cond.get('message')}"
            r = c.get(f"/apis/{GROUP}/v1")
            return r.status_code == 200 or f"discovery {r.status_code}"

    def _leader(self) -> bool | str:
        with self.cp.admin_http(timeout=10) as c:
            r = c.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/virt-controller")
            if r.status_code != 200:
                return f"lease {r.status_code}"
            return bool(r.json()["spec"].get("holderIdentity")) or "no holder"

    def stop(self) -> None:
        for p in (self.controller, self.api):
            if p is not None:
                p.stop(signal.SIGTERM, timeout=20)

    # ---- what it is ----

    @property
    def handler_kubeconfig(self) -> Path:
        """virt-handler's identity (its ServiceAccount's token), for the actor."""
        return self._kubeconfig(HANDLER_SA)

    # ---- summary.json ----

    @staticmethod
    def summary(bin_dir: Path = BIN) -> dict | None:
        """``{"version", "virt_api", "virt_controller"}`` for build/e2e/summary.json: the version virt-api reported
        in this session (else the one pinned in e2e/kubevirt/go.mod) and the binaries' paths."""
        if missing_binaries(bin_dir):
            return None
        served = _SERVED.get("gitVersion")
        pinned = next((line.split()[1] for line in (ROOT / "e2e" / "kubevirt" / "go.mod").read_text().splitlines()
                       if line.strip().startswith("kubevirt.io/kubevirt ")), None)
        return {"version": served or pinned, "version_from": "virt-api" if served else "e2e/kubevirt/go.mod",
                "git_commit": _SERVED.get("gitCommit"), "virt_api": str((bin_dir / "virt-api").resolve()),
                "virt_controller": str((bin_dir / "virt-controller").resolve()),
                "manifests": str((bin_dir / "kubevirt-manifests").resolve())}


_SERVED: dict = {}  # virt-api's version answer, once a session started it


def wait_for(check, timeout: float, what: str, every: float = 0.2):
    """``check()``'s first truthy value, polled every ``every`` s (gentle on the API server), else AssertionError."""
    return eventually(check, timeout, what, every)


class RealKubeVirtCluster:
    """The real-KubeVirt control plane's parts: KubeVirt, the actor's nodes, the chart and its guard, and helpers
    that make VMs the way users do (a VMI, which KubeVirt starts)."""

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.cp, self.dir = cp, workdir
        self.kubevirt = KubeVirt(cp, workdir / "kubevirt")
        self.nodes = None
        self.installation = None
        self.guard = None
        self.cluster = None

    def start(self, *, chart_values: dict, guard_args: tuple[str, ...]) -> RealKubeVirtCluster:
        from tests.e2e.actor.node import Nodes
        from tests.e2e.guard import GuardProcess, install_chart

        self.cp.kubectl("apply", "--server-side", "-f", str(CRDS / "operator.openshift.io_kubedeschedulers.yaml"))
        self.kubevirt.start()
        _SERVED.update(version(self.cp))
        self.nodes = Nodes(self.cp, self.kubevirt.handler_kubeconfig, self.dir / "actor").start()
        self.installation = install_chart(self.cp, self.dir / "chart", values=chart_values)
        self.guard = GuardProcess(self.installation, guard_args).start()
        self.cluster = _Cluster(self.cp, self.guard)
        return self

    def stop(self) -> None:
        for part in (self.guard, self.nodes):
            if part is not None:
                part.stop()
        self.kubevirt.stop()

    # ---- objects ----

    @property
    def custom(self):
        return self.cluster.objects.custom

    def node(self, prefix: str = "node") -> str:
        """A Ready Node as kubelet registers it; the actor's virt-handler labels it schedulable."""
        name = self.cluster.fresh_node(prefix)
        wait_for(lambda: self.cluster.core.read_node(name).metadata.labels.get("kubevirt.io/schedulable") == "true",
                 30, f"virt-handler to label {name} schedulable")
        return name

    def vm(self, namespace: str, name: str, node: str, *, annotations: dict | None = None,
           eviction_strategy: str = "LiveMigrate", timeout: float = 60) -> dict:
        """A VMI created as a user creates one; KubeVirt's virt-controller makes its launcher pod, the actor
        schedules it on ``node`` and runs it, virt-handler reports it Running and LiveMigratable. Returns the VMI
        once virt-controller has also marked its Ready pod ``request-evict-only``."""
        self.nodes.placement[(namespace, name)] = node
        self.custom.create_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachineinstances",
                                                    vmi_body(namespace, name, annotations=annotations,
                                                             eviction_strategy=eviction_strategy))

        return wait_for(lambda: self._running(namespace, name), timeout, f"VMI {namespace}/{name} to run on {node}")

    def vms(self, namespace: str, specs: list[tuple[str, str, dict]], timeout: float = 90) -> None:
        """Several VMs at once, ``(name, node, vm() keywords)`` each: every VMI created first, then waited for
        together (KubeVirt starts them side by side)."""
        for name, node, kw in specs:
            self.nodes.placement[(namespace, name)] = node
            self.custom.create_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachineinstances",
                                                        vmi_body(namespace, name, **kw))
        for name, node, _ in specs:
            wait_for(lambda name=name: self._running(namespace, name), timeout, f"VMI {namespace}/{name} to run on {node}")

    def _running(self, namespace: str, name: str) -> dict | None:
        vmi = self.vmi(namespace, name)
        st = vmi.get("status", {})
        migratable = any(c["type"] == "LiveMigratable" and c["status"] == "True" for c in st.get("conditions", []))
        pod = self.source_pod(namespace, name)
        ready = (st.get("phase") == "Running" and migratable and pod is not None
                 and "descheduler.alpha.kubernetes.io/request-evict-only" in (pod.metadata.annotations or {}))
        return vmi if ready else None

    def vmi(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachineinstances", name)

    def vmims(self, namespace: str, vmi: str | None = None) -> list[dict]:
        items = self.custom.list_namespaced_custom_object("kubevirt.io", "v1", namespace,
                                                          "virtualmachineinstancemigrations")["items"]
        items = [m for m in items if vmi is None or m["spec"]["vmiName"] == vmi]
        return sorted(items, key=lambda m: m["metadata"]["creationTimestamp"] + m["metadata"]["name"])

    def launcher_pods(self, namespace: str, vmi: str) -> list:
        return [p for p in self.cluster.core.list_namespaced_pod(namespace, label_selector="kubevirt.io=virt-launcher").items
                if (p.metadata.annotations or {}).get("kubevirt.io/domain") == vmi]

    def source_pod(self, namespace: str, vmi_name: str):
        """The VM's active launcher pod: Running on the VMI's node."""
        node = self.vmi(namespace, vmi_name).get("status", {}).get("nodeName")
        pods = [p for p in self.launcher_pods(namespace, vmi_name) if p.spec.node_name == node and node
                and p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
        return pods[0] if pods else None

    def events(self, namespace: str, name: str, reason: str | None = None) -> list:
        return [e for e in self.cluster.core.list_namespaced_event(namespace).items
                if e.involved_object.name == name and (reason is None or e.reason == reason)]


def vmi_body(namespace: str, name: str, *, annotations: dict | None = None,
             eviction_strategy: str | None = "LiveMigrate") -> dict:
    """A VMI as a user writes it: the smallest spec virt-api's create validator accepts; no status, no labels
    (virt-api refuses KubeVirt's reserved labels from users and replaces any status with its own)."""
    spec: dict = {"domain": {"devices": {}, "resources": {"requests": {"memory": "128Mi"}}},
                  "terminationGracePeriodSeconds": 0}
    if eviction_strategy:
        spec["evictionStrategy"] = eviction_strategy
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}}, "spec": spec}


def _cluster_class():
    from tests.e2e.cluster import BARRIER_NS, Cluster

    class RealCluster(Cluster):
        """The session's ``Cluster`` helpers, with a barrier made of objects real KubeVirt accepts from a user."""

        def sync(self, guard=None, timeout: float = 30.0) -> None:
            super().sync(guard, timeout)

        def barrier_objects(self, tag: str) -> None:
            self.objects.node(tag)
            vmi = self.objects.custom.create_namespaced_custom_object(
                "kubevirt.io", "v1", BARRIER_NS, "virtualmachineinstances", vmi_body(BARRIER_NS, tag))
            self.objects.custom.create_namespaced_custom_object(
                "kubevirt.io", "v1", BARRIER_NS, "virtualmachineinstancemigrations",
                {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
                 "metadata": {"name": tag, "namespace": BARRIER_NS}, "spec": {"vmiName": tag}})
            self.objects.launcher_pod(BARRIER_NS, vmi, tag, phase="Succeeded", ready=False)

    return RealCluster


def _Cluster(cp, guard):
    return _cluster_class()(cp, guard)
