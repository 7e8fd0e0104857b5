"""Kubernetes' declarative eviction requests (``lifecycle.k8s.io/v1alpha1`` ``EvictionRequest``), as ``explain`` and
``report`` show them beside the guard's decision.

Served by kube-apiserver 1.37+ with the ``EvictionRequestAPI`` feature gate and the ``lifecycle.k8s.io/v1alpha1``
API on (both off by default). A requester (``spec.requester``, a domain-prefixed name such as
``descheduler.example.io/balance``) asks for ``spec.target.pod`` (name and uid, same namespace) to be evicted
(``spec.intent: Eviction``) or takes that back (``Withdrawn``); the evictionrequest-controller turns them into
``Eviction`` objects, whose last responder calls ``pods/eviction``, the call the guard judges. A request has ended
once its ``TargetEvicted`` or ``Failed`` condition is True (the controller may reset them when a new intent
arrives); until then, and while its intent is ``Eviction``, it is pending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.domain.records import RecordError
from app.timefmt import parse_timestamp

GROUP, VERSION, PLURAL = "lifecycle.k8s.io", "v1alpha1", "evictionrequests"
INTENT_EVICTION = "Eviction"
ENDED_CONDITIONS = ("TargetEvicted", "Failed")


@dataclass(frozen=True, slots=True)
class EvictionRequestRecord:
    namespace: str
    name: str
    pod: str  # spec.target.pod.name ("" when the target is not a pod)
    pod_uid: str  # spec.target.pod.uid
    requester: str  # spec.requester
    intent: str  # spec.intent: Eviction or Withdrawn
    created: float | None  # metadata.creationTimestamp
    ended: str  # the True one of TargetEvicted / Failed ("" while none is)

    @property
    def pending(self) -> bool:
        return self.intent == INTENT_EVICTION and not self.ended


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def eviction_request_from_object(obj: Any) -> EvictionRequestRecord:
    """Raises ``RecordError`` when the object has no name or no spec; any other odd field becomes empty."""
    if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
        raise RecordError("EvictionRequest is not a mapping with a spec")
    meta, spec = _d(obj.get("metadata")), obj["spec"]
    name = _s(meta.get("name"))
    if not name:
        raise RecordError("EvictionRequest has no metadata.name")
    pod = _d(_d(spec.get("target")).get("pod"))
    conditions = _d(obj.get("status")).get("conditions")
    ended = [c.get("type") for c in (conditions if isinstance(conditions, list) else [])
             if isinstance(c, dict) and c.get("type") in ENDED_CONDITIONS and c.get("status") == "True"]
    return EvictionRequestRecord(
        namespace=_s(meta.get("namespace")), name=name, pod=_s(pod.get("name")), pod_uid=_s(pod.get("uid")),
        requester=_s(spec.get("requester")), intent=_s(spec.get("intent")),
        created=parse_timestamp(meta.get("creationTimestamp")), ended=ended[0] if ended else "")


def requests_for_pod(requests: list[EvictionRequestRecord], namespace: str, pod: str,
                     pod_uid: str = "") -> list[EvictionRequestRecord]:
    """The requests whose target is this pod, oldest first. A request naming another uid targets an earlier pod of
    the same name (a VM's launcher pod is re-created under its name only by a user; a request is never moved)."""
    found = [r for r in requests if r.namespace == namespace and r.pod == pod
             and not (pod_uid and r.pod_uid and r.pod_uid != pod_uid)]
    return sorted(found, key=lambda r: (r.created or 0.0, r.name))
