"""The real descheduler (``build/e2e/bin/descheduler``, v0.36) as the KubeVirt profile runs it, with its own identity.

Policy: what OpenShift's ``KubeVirtRelieveAndMigrate`` profile sets, as far as upstream v0.36 has it (there is no
``KubevirtMigrationAware`` plugin and no soft-tainter upstream): DefaultEvictor with ``noEvictionPolicy:
Mandatory`` and ``evictLocalStoragePods: true`` (the operator's ``kubeVirtRelieveAndMigrateProfile``: a real
virt-launcher pod has emptyDir volumes, which DefaultEvictor otherwise protects); LowNodeUtilization with deviation thresholds on the profile's Prometheus score and
``evictionLimits.node``; ``maxNoOfPodsToEvictPerNode``, ``maxNoOfPodsToEvictTotal``; the nodes labelled
``kubevirt.io/schedulable=true``; feature gate ``EvictionsInBackground=true``. The numbers are the scenario's
``descheduler`` settings (the profile's: 0/10, node 2, 2 per node, 5 in total), as the simulator reads them.

Identity: the ServiceAccount, ClusterRole and binding of the descheduler's own Helm chart (rendered with the real
``helm`` from the descheduler v0.36 module, the one the binary is built from), and a TokenRequest token of that
ServiceAccount. The descheduler runs *in-cluster*: in v0.36 the Prometheus client is only built from the in-cluster
service-account token (or a token Secret) and the pod's CA file, at fixed paths under
``/var/run/secrets/kubernetes.io/serviceaccount``. So it runs in a private mount namespace (``unshare``; not as
root, inside a user namespace)
with a tmpfs on ``/run`` holding that token and the control plane's CA, and ``KUBERNETES_SERVICE_HOST/PORT``
pointing at the API server: its API calls and its Prometheus queries both carry the ServiceAccount's token, as in a
pod. Nothing outside that process sees the mount. Prometheus is plain HTTP here and does not check the token
(in OpenShift a kube-rbac-proxy in front of Thanos does).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from app.sim.scenario import DeschedulerSettings
from tests.e2e.controlplane import BIN, ROOT, ControlPlane, free_port
from tests.e2e.outcome.policycheck import check_policy
from tests.e2e.outcome.process import Service
from tests.e2e.outcome.prometheus import SCORE

NAMESPACE, NAME = "kube-system", "descheduler"
PROFILE = "KubeVirtRelieveAndMigrate"
SA_DIR = "/run/secrets/kubernetes.io/serviceaccount"


def policy(prometheus_url: str, s: DeschedulerSettings) -> dict:
    """The DeschedulerPolicy for the scenario's descheduler settings (thresholds and the three limits)."""
    return {
        "apiVersion": "descheduler/v1alpha2", "kind": "DeschedulerPolicy",
        "nodeSelector": "kubevirt.io/schedulable=true",
        "maxNoOfPodsToEvictPerNode": s.max_per_node, "maxNoOfPodsToEvictTotal": s.max_total,
        "metricsProviders": [{"source": "Prometheus", "prometheus": {"url": prometheus_url}}],
        "profiles": [{
            "name": PROFILE,
            "pluginConfig": [
                # the profile's DefaultEvictor (evictLocalStoragePods: virt-launcher pods carry emptyDir volumes)
                {"name": "DefaultEvictor", "args": {"noEvictionPolicy": "Mandatory", "evictLocalStoragePods": True}},
                {"name": "LowNodeUtilization", "args": {
                    "useDeviationThresholds": True,
                    "thresholds": {"MetricResource": s.low}, "targetThresholds": {"MetricResource": s.high},
                    "evictionLimits": {"node": s.eviction_limit_node},
                    "metricsUtilization": {"source": "Prometheus", "prometheus": {"query": SCORE}},
                }},
            ],
            "plugins": {"balance": {"enabled": ["LowNodeUtilization"]},
                        "filter": {"enabled": ["DefaultEvictor"]},
                        "preevictionfilter": {"enabled": ["DefaultEvictor"]}},
        }],
    }


def custom_policy(path: Path, prometheus_url: str) -> dict:
    """A user's policy file for the pluggable mode, with this run's Prometheus as its metrics provider (the file
    cannot know the run's port): every Prometheus provider's ``url`` is replaced; nothing else is touched."""
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != "DeschedulerPolicy":
        raise RuntimeError(f"{path}: not a DeschedulerPolicy")
    for provider in doc.get("metricsProviders") or []:
        if isinstance(provider, dict) and provider.get("source") == "Prometheus":
            provider.setdefault("prometheus", {})["url"] = prometheus_url
    return doc


def protects_local_storage(doc: dict) -> bool:
    """Whether the policy's DefaultEvictor keeps pods with emptyDir volumes, every virt-launcher pod among them
    (descheduler v0.36's default ``PodsWithLocalStorage`` protection): such a policy evicts no VM at all."""
    for profile in doc.get("profiles") or []:
        for cfg in profile.get("pluginConfig") or []:
            if cfg.get("name") != "DefaultEvictor":
                continue
            args = cfg.get("args") or {}
            disabled = (args.get("podProtections") or {}).get("defaultDisabled") or []
            if args.get("evictLocalStoragePods") or "PodsWithLocalStorage" in disabled:
                return False
    return True


def settings_from_policy(doc: dict, base: DeschedulerSettings) -> DeschedulerSettings:
    """The limits and thresholds a policy sets, as the simulator's settings (``base`` for what it leaves out), so
    that its cycles are checked against what it asked for: ``maxNoOfPodsToEvictPerNode``, ``...Total``, and
    LowNodeUtilization's deviation thresholds and ``evictionLimits.node`` (the first profile that has it)."""
    changes: dict = {}
    if doc.get("maxNoOfPodsToEvictPerNode") is not None:
        changes["max_per_node"] = int(doc["maxNoOfPodsToEvictPerNode"])
    if doc.get("maxNoOfPodsToEvictTotal") is not None:
        changes["max_total"] = int(doc["maxNoOfPodsToEvictTotal"])
    for profile in doc.get("profiles") or []:
        for cfg in profile.get("pluginConfig") or []:
            if cfg.get("name") != "LowNodeUtilization":
                continue
            args = cfg.get("args") or {}
            node = (args.get("evictionLimits") or {}).get("node")
            if node is not None:
                changes["eviction_limit_node"] = int(node)
            for key, field_ in (("thresholds", "low"), ("targetThresholds", "high")):
                value = (args.get(key) or {}).get("MetricResource")
                if value is not None:
                    changes[field_] = float(value)
            return dataclasses.replace(base, **changes)
    return dataclasses.replace(base, **changes)


def chart_dir() -> Path:
    """The descheduler's Helm chart in the Go module cache (downloaded through the proxy if it is not there)."""
    out = subprocess.run(["go", "mod", "download", "-json", "sigs.k8s.io/descheduler"], cwd=ROOT / "e2e",
                         capture_output=True, text=True, timeout=300, env={**os.environ, "GOFLAGS": "-mod=mod"})
    if out.returncode != 0:
        raise RuntimeError(f"go mod download sigs.k8s.io/descheduler (in e2e/): {out.stderr.strip()}")
    chart = Path(json.loads(out.stdout)["Dir"]) / "charts" / "descheduler"
    if not (chart / "Chart.yaml").exists():
        raise RuntimeError(f"no Helm chart in {chart}")
    return chart


def rbac_manifests() -> list[dict]:
    """ServiceAccount, ClusterRole and ClusterRoleBinding as the descheduler's chart renders them."""
    out = subprocess.run(
        [str(BIN / "helm"), "template", NAME, str(chart_dir()), "--namespace", NAMESPACE,
         "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/clusterrole.yaml",
         "--show-only", "templates/clusterrolebinding.yaml"],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"helm template of the descheduler chart failed: {out.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    if kinds != ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]:
        raise RuntimeError(f"the descheduler chart rendered {kinds}")
    return docs


def install_rbac(cp: ControlPlane) -> str:
    """Apply the chart's RBAC (kubectl, as a user would); the ServiceAccount's name."""
    docs = rbac_manifests()
    out = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(cp.admin_kubeconfig), "apply", "-f", "-"],
                         input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl apply of the descheduler's RBAC: {out.stderr.strip()}")
    return next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")


class Descheduler(Service):
    """One descheduler process; ``metrics()`` reads its ``/metrics``."""

    def __init__(self, cp: ControlPlane, workdir: Path, service_account: str, prometheus_url: str,
                 settings: DeschedulerSettings, binary: Path | None = None, policy_doc: dict | None = None,
                 structure_only: bool = False) -> None:
        """``binary`` and ``policy_doc``: another descheduler build and its policy (the pluggable mode), else the
        pinned build with ``policy()``. The policy is refused before the start unless the descheduler reads every
        key of it (``policycheck``)."""
        if shutil.which("unshare") is None:
            raise RuntimeError("unshare (util-linux) is needed to give the descheduler its in-cluster identity")
        self.dir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.sa = workdir / "serviceaccount"
        self.sa.mkdir(exist_ok=True)
        (self.sa / "token").write_text(cp.service_account_token(NAMESPACE, service_account, seconds=7200))
        shutil.copy(cp.ca_path, self.sa / "ca.crt")
        (self.sa / "namespace").write_text(NAMESPACE)
        (workdir / "policy.yaml").write_text(yaml.safe_dump(policy_doc or policy(prometheus_url, settings)))
        check_policy(workdir / "policy.yaml", structure_only=structure_only)
        self.port = free_port()
        self.log = workdir / "descheduler.log"
        script = (f"mount -t tmpfs -o mode=755 tmpfs /run && mkdir -p {SA_DIR} && cp {self.sa}/* {SA_DIR}/ && "
                  f"exec {binary or BIN / 'descheduler'} --policy-config-file {workdir / 'policy.yaml'} "
                  f"--descheduling-interval {settings.interval}s --feature-gates EvictionsInBackground=true "
                  f"--bind-address 127.0.0.1 --secure-port {self.port} --cert-dir {workdir / 'certs'} --v 3")
        env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cp.port)}
        # not root: a user namespace first (where this user is root), if the kernel allows unprivileged ones
        unshare = ["unshare", "--mount", "--propagation", "private",
                   *([] if os.geteuid() == 0 else ["--map-root-user"])]
        self.proc = subprocess.Popen([*unshare, "sh", "-c", script],
                                     stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.started = time.monotonic()

    def metrics(self) -> str:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its self-signed serving certificate on loopback
        return httpx.get(f"https://127.0.0.1:{self.port}/metrics", verify=ctx, timeout=5).text

    def evictions(self) -> dict[str, float]:
        """``descheduler_pods_evicted_total`` summed by ``result`` (success, background, error, limit texts)."""
        out: dict[str, float] = {}
        for line in self.metrics().splitlines():
            m = re.match(r'descheduler_pods_evicted_total\{(.*)\} (\S+)$', line)
            if m:
                result = re.search(r'result="([^"]*)"', m.group(1))
                key = result.group(1) if result else ""
                out[key] = out.get(key, 0.0) + float(m.group(2))
        return out

    def cycles(self, wall0: float) -> list[float]:
        """Run times (seconds after ``wall0``) at which its cycles began, from its log (klog's time of day)."""
        day = datetime.datetime.fromtimestamp(wall0, datetime.UTC).date()
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            m = re.match(r"I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*Resetting pod evictor counters", line)
            if m:
                h, mi, sec = int(m.group(1)), int(m.group(2)), float(m.group(3))
                t = datetime.datetime.combine(day, datetime.time(h, mi), datetime.UTC).timestamp() + sec
                out.append(round(t - wall0, 2))
        return out
