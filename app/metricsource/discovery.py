"""Where the descheduler's Prometheus is: the metrics provider its own policy names.

The descheduler (v0.30+, policy ``descheduler/v1alpha2``) reads Prometheus where its policy says::

    metricsProviders:
    - source: Prometheus
      prometheus:
        url: https://...
        authToken:                      # optional
          secretReference: {namespace: ..., name: ...}   # key "prometheusAuthToken"

Without ``authToken`` it sends its own ServiceAccount's token; it trusts only the pod's
ServiceAccount ``ca.crt``. Its policy lives in a ConfigMap under the key ``policy.yaml``: the
upstream chart's is ``<release>`` in the release namespace (``kube-system/descheduler``), and
OpenShift's operator renders ``openshift-kube-descheduler-operator/cluster`` from the
``KubeDescheduler`` CR (whose KubeVirtRelieveAndMigrate profile gets the URL of the
``openshift-monitoring/prometheus-k8s`` Route; the CR itself names no URL). So the guard reads
those ConfigMaps, in order, and takes the first Prometheus provider it finds.

``provider_from_policy`` is pure; ``discover`` and ``SecretToken`` read the API server.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger("kubevirt_eviction_guard.prometheus")

POLICY_KEY = "policy.yaml"
TOKEN_KEY = "prometheusAuthToken"  # the descheduler's key in the authToken Secret
DEFAULT_POLICY_CONFIGMAPS = ("openshift-kube-descheduler-operator/cluster", "kube-system/descheduler")
POD_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"  # what the descheduler verifies Prometheus with


class PolicyProblem(ValueError):
    """A policy that cannot be read as the descheduler's; the text says why."""


@dataclass(frozen=True)
class Provider:
    """The descheduler's Prometheus: its URL, and the Secret holding its token (None: its own ServiceAccount's)."""

    url: str
    token_secret: tuple[str, str] | None
    where: str  # "ConfigMap NS/NAME"


@dataclass(frozen=True)
class Discovery:
    provider: Provider | None
    why: str  # when provider is None: what was looked at and what it said
    certain: bool = True  # False when a policy could not be read (an error other than 404): the answer may be wrong


def configmap_ref(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` of a policy ConfigMap; ValueError for anything else."""
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
    return ns, name


def provider_from_policy(text: str, where: str) -> Provider | None:
    """The Prometheus provider of a ``DeschedulerPolicy`` document (None: it names none)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyProblem(f"{where}: {POLICY_KEY} is not YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "DeschedulerPolicy":
        raise PolicyProblem(f"{where}: {POLICY_KEY} is not a DeschedulerPolicy")
    providers = doc.get("metricsProviders")
    providers = [] if providers is None else providers
    if not isinstance(providers, list):
        raise PolicyProblem(f"{where}: metricsProviders is not a list")
    for p in providers:
        if not isinstance(p, dict) or p.get("source") != "Prometheus":
            continue
        prom = p.get("prometheus")
        url = prom.get("url") if isinstance(prom, dict) else None
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise PolicyProblem(f"{where}: the Prometheus metrics provider has no http(s) url")
        ref = ((prom.get("authToken") or {}).get("secretReference") or {}) if isinstance(prom, dict) else {}
        secret = None
        if isinstance(ref, dict) and ref:
            ns, name = ref.get("namespace"), ref.get("name")
            if not isinstance(ns, str) or not isinstance(name, str) or not ns or not name:
                raise PolicyProblem(f"{where}: authToken.secretReference needs both namespace and name")
            secret = (ns, name)
        return Provider(url.rstrip("/"), secret, where)
    return None


def _api_problem(e: Exception, what: str) -> str:
    if isinstance(e, ApiException):
        if e.status == 404:
            return f"no {what}"
        if e.status in (401, 403):
            return f"may not read {what} ({e.status}; the chart's prometheus.discovery grants it)"
        return f"cannot read {what}: {e.status} {e.reason}"
    return f"cannot read {what}: {type(e).__name__}"


def discover(api: client.ApiClient, configmaps: Sequence[str], timeout: float = 10.0) -> Discovery:
    """The first Prometheus provider named by the policies in ``configmaps`` (``NS/NAME``), in order."""
    core = client.CoreV1Api(api)
    said, certain = [], True
    for ref in configmaps:
        ns, name = configmap_ref(ref)
        where = f"ConfigMap {ns}/{name}"
        try:
            cm = core.read_namespaced_config_map(name, ns, _request_timeout=timeout)
        except (ApiException, HTTPError, OSError) as e:
            said.append(_api_problem(e, where))
            certain = certain and isinstance(e, ApiException) and e.status == 404
            continue
        text = (cm.data or {}).get(POLICY_KEY)
        if not text:
            said.append(f"{where} has no {POLICY_KEY}")
            continue
        try:
            provider = provider_from_policy(text, where)
        except PolicyProblem as e:
            said.append(str(e))
            continue
        if provider is not None:
            return Discovery(provider, "")
        said.append(f"the descheduler's policy in {where} names no Prometheus metrics provider")
    return Discovery(None, "; ".join(said) or "no policy ConfigMap to look in", certain)


class SecretToken:
    """The token the descheduler sends, from its ``authToken`` Secret; re-read every ``ttl`` seconds
    (the Secret may be rotated). Raises OSError naming the Secret when it cannot be read."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, ttl: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.name, self.ttl, self.clock = namespace, name, ttl, clock
        self._token, self._read_at = "", -float("inf")
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            if self.clock() - self._read_at < self.ttl:
                return self._token
            what = f"Secret {self.namespace}/{self.name}"
            try:
                secret = self.core.read_namespaced_secret(self.name, self.namespace, _request_timeout=10)
            except (ApiException, HTTPError, OSError) as e:
                raise OSError(_api_problem(e, what)) from None
            raw = (secret.data or {}).get(TOKEN_KEY)
            try:
                token = base64.b64decode(raw).decode().strip() if raw else ""
            except (ValueError, UnicodeDecodeError):
                token = ""
            if not token:
                raise OSError(f"{what} has no {TOKEN_KEY}")
            self._token, self._read_at = token, self.clock()
            return token
