"""The API resources the fake server knows, label selectors, and Status bodies.

Everything here mirrors what kube-apiserver answers on the wire, so that a
client that works against the fake has a fair chance of working against the
real thing: the same URL layout, the same ``Status`` objects for errors (the
``kubernetes`` client turns them into ``ApiException`` with ``.status`` and
``.body``), the same label-selector grammar (the equality-based subset).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Resource:
    """One API resource, e.g. pods in core/v1 or virtualmachineinstances in kubevirt.io/v1."""

    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def id(self) -> str:
        """``plural`` for the core group, ``plural.group`` otherwise (as kubectl spells it)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


PODS = Resource("", "v1", "pods", "Pod", True)
NODES = Resource("", "v1", "nodes", "Node", False)
EVENTS = Resource("", "v1", "events", "Event", True)
EVENTS_V1 = Resource("events.k8s.io", "v1", "events", "Event", True)
VMIS = Resource("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True)
VMIMS = Resource("kubevirt.io", "v1", "virtualmachineinstancemigrations", "VirtualMachineInstanceMigration", True)
KUBEVIRTS = Resource("kubevirt.io", "v1", "kubevirts", "KubeVirt", True)
# the OpenShift descheduler operator's configuration (the guard only reads the object named "cluster")
KUBEDESCHEDULERS = Resource("operator.openshift.io", "v1", "kubedeschedulers", "KubeDescheduler", True)
# Helm's `lookup` of the chart's generated certificate Secret (tests/test_chart.py)
SECRETS = Resource("", "v1", "secrets", "Secret", True)
# the descheduler's policy, where steering finds its Prometheus (app/metricsource/discovery.py)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", True)
# the chart's lookup of its live webhook configuration (certificate rotation) and `kubevirt-eviction-guard unregister`
MUTATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                             "MutatingWebhookConfiguration", False)
VALIDATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                               "ValidatingWebhookConfiguration", False)
ALL = (PODS, NODES, EVENTS, EVENTS_V1, VMIS, VMIMS, KUBEVIRTS, KUBEDESCHEDULERS, SECRETS, CONFIGMAPS, MUTATING_WEBHOOKS,
       VALIDATING_WEBHOOKS)

# names the control surface accepts for each resource (besides Resource objects)
_ALIASES: dict[str, Resource] = {}
for _r in ALL:
    _ALIASES[_r.id] = _r
for _r, _names in (
    (PODS, ("pod", "Pod")),
    (NODES, ("node", "Node")),
    (EVENTS, ("event", "Event")),
    (VMIS, ("vmi", "VirtualMachineInstance", "virtualmachineinstances")),
    (VMIMS, ("vmim", "VirtualMachineInstanceMigration", "virtualmachineinstancemigrations")),
    (KUBEVIRTS, ("kubevirt", "KubeVirt")),
    (KUBEDESCHEDULERS, ("kubedescheduler", "KubeDescheduler")),
    (SECRETS, ("secret", "Secret")),
    (CONFIGMAPS, ("configmap", "ConfigMap")),
    (MUTATING_WEBHOOKS, ("MutatingWebhookConfiguration",)),
    (VALIDATING_WEBHOOKS, ("ValidatingWebhookConfiguration",)),
):
    for _n in _names:
        _ALIASES[_n] = _r


def resolve(what: str | Resource) -> Resource:
    """A Resource from itself, its id (``pods``, ``events.events.k8s.io``), kind or short name (``vmi``)."""
    if isinstance(what, Resource):
        return what
    try:
        return _ALIASES[what]
    except KeyError:
        raise KeyError(f"fake API server: unknown resource {what!r}") from None


def resource_of(obj: dict) -> Resource:
    """The resource an object belongs to, from its apiVersion and kind."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    for r in ALL:
        if r.api_version == api_version and r.kind == kind:
            return r
    raise KeyError(f"fake API server: no resource for apiVersion={api_version!r} kind={kind!r}")


# ---- label selectors ---------------------------------------------------------------

_REQUIREMENT = re.compile(r"^\s*(!?)\s*([A-Za-z0-9./_-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9._-]*))?\s*$")


class SelectorError(ValueError):
    pass


def parse_selector(text: str | None) -> list[tuple[str, str, str]]:
    """``a=b,c!=d,e,!f`` -> [(key, op, value)] with op in ``= != exists !exists``.

    Set-based requirements (``in``/``notin``) are not needed by anyone yet and
    are rejected with 400 rather than silently ignored.
    """
    if not text:
        return []
    out = []
    for part in text.split(","):
        m = _REQUIREMENT.match(part)
        if not m:
            raise SelectorError(f"unable to parse requirement: {part!r}")
        bang, key, op, value = m.groups()
        if bang and op:
            raise SelectorError(f"unable to parse requirement: {part!r}")
        if bang:
            out.append((key, "!exists", ""))
        elif op is None:
            out.append((key, "exists", ""))
        else:
            out.append((key, "!=" if op == "!=" else "=", value or ""))
    return out


def selector_matches(selector: list[tuple[str, str, str]], labels: dict | None) -> bool:
    labels = labels or {}
    for key, op, value in selector:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!exists" and key in labels:
            return False
    return True


# ---- Status bodies, as kube-apiserver writes them ---------------------------------------

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status(code: int, message: str, reason: str | None = None, details: dict | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, ""),
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def status_bytes(code: int, message: str, reason: str | None = None, details: dict | None = None) -> bytes:
    return orjson.dumps(status(code, message, reason, details))


# virt-api's discovery document of subresources.kubevirt.io/v1 (pkg/virt-api/api.go, KubeVirt 1.9): names only,
# no kinds or verbs; KubeVirt < 1.8 lacks the evacuate/cancel entries
KUBEVIRT_SUBRESOURCES = (
    "expand-vm-spec", "virtualmachineinstances/vnc", "virtualmachineinstances/console",
    "virtualmachineinstances/pause", "virtualmachineinstances/unpause", "virtualmachines/start", "virtualmachines/stop",
    "virtualmachines/restart", "virtualmachines/migrate", "virtualmachines/evacuate/cancel",
    "virtualmachineinstances/guestosinfo", "virtualmachineinstances/evacuate/cancel",
)
SUBRESOURCES_GROUP = "subresources.kubevirt.io"


def not_found_api() -> dict:
    """What kube-apiserver says for a group/version or resource it does not serve."""
    return status(404, "the server could not find the requested resource", "NotFound", {})


def forbidden(resource: Resource, verb: str, namespace: str, user: str) -> dict:
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    group = f'in API group "{resource.group}"'
    return status(
        403,
        f'{resource.id} is forbidden: User "{user}" cannot {verb} resource "{resource.plural}" {group} {scope}',
        "Forbidden",
        {"group": resource.group, "kind": resource.plural},
    )
