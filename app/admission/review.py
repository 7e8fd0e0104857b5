"""AdmissionReview: the request type, the response type, and allowed/denied/errored helpers.

Decoding is one orjson pass over the body and a handful of type-checked
lookups; the Eviction ``object`` is never validated as a whole (it is the
client's, and the guard reads three fields of it). Anything a client may send
either decodes or raises ``BadReview`` with the HTTP status and a message the
server returns as JSON: never an exception that becomes a 500.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.policy.model import Decision, EvictionAttempt, Reason, Review

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
GUARD = "kubevirt-eviction-guard"
MAX_WARNING = 240  # characters; the API server truncates long warnings anyway


class BadReview(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _str(d: dict, key: str) -> str:
    v = d.get(key)
    return v if isinstance(v, str) else ""


def _dict(d: Any, key: str) -> dict:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def _has_all(value: Any) -> bool:
    return isinstance(value, list) and "All" in value


def decode(body: bytes) -> Review:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadReview(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BadReview(400, "request body is not an AdmissionReview: expected a JSON object")
    api_version = doc.get("apiVersion")
    if doc.get("kind") != "AdmissionReview" or api_version not in API_VERSIONS:
        raise BadReview(400, f"not an AdmissionReview: kind must be AdmissionReview and apiVersion one of {', '.join(API_VERSIONS)}")
    req = doc.get("request")
    if not isinstance(req, dict):
        raise BadReview(400, "AdmissionReview has no request")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview(400, "AdmissionReview request has no uid")
    obj = _dict(req, "object")
    annotations = _dict(_dict(obj, "metadata"), "annotations")
    # Dry run comes in three shapes; the Eviction's deleteOptions.dryRun arrives with request.dryRun false.
    dry_run = (
        req.get("dryRun") is True
        or _has_all(_dict(req, "options").get("dryRun"))
        or _has_all(_dict(obj, "deleteOptions").get("dryRun"))
    )
    eviction = EvictionAttempt(
        operation=_str(req, "operation"),
        resource=_str(_dict(req, "resource"), "resource"),
        subresource=_str(req, "subResource"),
        namespace=_str(req, "namespace"),
        name=_str(req, "name"),
        username=_str(_dict(req, "userInfo"), "username"),
        requested_by=_str(annotations, "requested-by"),
        eviction_reason=_str(annotations, "reason"),
        dry_run=dry_run,
    )
    return Review(api_version=api_version, uid=uid, eviction=eviction)


def _review(api_version: str, response: dict) -> bytes:
    return orjson.dumps({"apiVersion": api_version, "kind": "AdmissionReview", "response": response})


def allowed(review: Review, decision: Decision) -> bytes:
    response: dict[str, Any] = {
        "uid": review.uid,
        "allowed": True,
        "auditAnnotations": {"decision": "allowed", "reason": decision.reason},
    }
    if review.eviction.dry_run:
        response["auditAnnotations"]["dry-run"] = "true"
    if decision.reason == Reason.NOT_AN_EVICTION:
        response["warnings"] = [f"{GUARD}: {decision.message}"]
    return _review(review.api_version, response)


def denied(review: Review, decision: Decision) -> bytes:
    """A denial the descheduler and kubectl understand: 429 TooManyRequests, the
    decision text as the message, and never ``details.retryAfterSeconds`` (the API
    server would turn it into a Retry-After header that makes client-go sleep and
    retry; the remaining time is in the message instead)."""
    audit = {"decision": "denied", "reason": decision.reason}
    if review.eviction.dry_run:
        audit["dry-run"] = "true"
    if decision.remaining is not None:
        audit["remaining-seconds"] = str(max(0, int(round(decision.remaining))))
    warning = f"{GUARD}: {decision.message}"
    if len(warning) > MAX_WARNING:
        warning = warning[: MAX_WARNING - 3] + "..."
    response = {
        "uid": review.uid,
        "allowed": False,
        "status": {
            "code": 429,
            "reason": "TooManyRequests",
            "message": decision.message,
            "status": "Failure",
        },
        "auditAnnotations": audit,
        "warnings": [warning],
    }
    return _review(review.api_version, response)


def respond(review: Review, decision: Decision) -> bytes:
    return allowed(review, decision) if decision.allowed else denied(review, decision)


def errored(status: int, message: str) -> bytes:
    """The JSON error body of a 4xx for input that is not a usable AdmissionReview."""
    return orjson.dumps({"error": message, "code": status})
