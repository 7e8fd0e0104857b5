"""The API writes side effects make (and the VMI reads that guard them),
and how their failures are classified.

``KubeEffectsApi`` speaks to a real API server with the ``kubernetes`` client;
``LogOnlyApi`` stands in when there is none (snapshot mode) and logs what it
would have written, so the whole pipeline (re-check, rate limit, aggregation)
still runs and can be watched in ``make run``.

Failures map to what the caller can do about them:
- ``Conflict`` (409, 422): the object changed under us (a failed JSON-patch
  ``test`` is a 422). Re-read the store; never retry the same write blindly.
- ``NotFound`` (404): the object is gone (a pod deleted, an Event expired).
- ``TransientApiError`` (connection errors, timeouts, 429, 5xx): retry with
  backoff (it is a ``queue.Retry``).
- ``PermanentApiError`` (any other 4xx: forbidden, invalid): counted, logged,
  not retried.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import orjson
import urllib3
from kubernetes.client import ApiClient, AuthorizationV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from app.domain.records import RecordError, VMIRecord, vmi_from_object
from app.effects.queue import Retry

log = logging.getLogger("kubevirt_eviction_guard.effects")

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
DEFAULT_TIMEOUT = (3.05, 10.0)  # (connect, read) seconds for one side-effect call


class Conflict(Exception):
    """409/422: the object is not in the state the write assumed."""


class NotFound(Exception):
    """404: the object does not exist (any more)."""


class TransientApiError(Retry):
    """Worth retrying after a backoff."""


class PermanentApiError(Exception):
    """Retrying will not help (403, 400, ...)."""


class EffectsApi(Protocol):
    def patch_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None: ...

    def create_event(self, namespace: str, event: dict[str, Any]) -> None: ...

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...

    def read_vmi(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The VMI as the API server has it now; None when there is no API server to ask."""
        ...

    def patch_vmi(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None: ...

    def patch_vmim(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None: ...

    def cancel_evacuation(self, namespace: str, name: str, node: str) -> None:
        """KubeVirt (v1.8+) ``evacuate/cancel`` subresource: clear the VMI's mark for ``node``."""
        ...

    def serves(self, group: str, version: str, resource: str) -> bool:
        """Discovery: does the API server list ``resource`` in ``group/version``?"""
        ...

    def allowed(self, verb: str, group: str, resource: str, subresource: str = "", namespace: str = "") -> bool:
        """A SelfSubjectAccessReview: may the guard's own identity do this?"""
        ...


CANCEL_PATH = ("/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}"
               "/evacuate/cancel")


def classify(e: ApiException) -> Exception:
    status = e.status or 0
    text = f"{status} {e.reason or ''}".strip()
    if status in (409, 422):
        return Conflict(text)
    if status == 404:
        return NotFound(text)
    if status == 0 or status == 429 or status >= 500:
        return TransientApiError(text)
    return PermanentApiError(text)


def server_said(body: str, limit: int = 300) -> str:
    """A refusal's own words: a Status's ``message``, else the text (virt-api's authorizer answers 401 in plain
    text); at most ``limit`` characters."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return " ".join(body.split())[:limit]
    message = doc.get("message") if isinstance(doc, dict) else None
    return message[:limit] if isinstance(message, str) else ""


class KubeEffectsApi:
    """The writes, over a ``kubernetes.client.ApiClient`` (from kubeconfig or in-cluster)."""

    def __init__(self, api_client: ApiClient, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.timeout = timeout

    def _call(self, method, *args, **kwargs) -> bytes:
        try:
            resp = method(*args, _request_timeout=self.timeout, _preload_content=False, **kwargs)
        except ApiException as e:
            raise classify(e) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:  # refused, reset, timed out
            raise TransientApiError(f"{type(e).__name__}: {e}") from None
        try:
            return resp.read()  # drain, so the connection returns to the pool
        finally:
            resp.release_conn()

    def read_vmi(self, namespace: str, name: str) -> dict[str, Any] | None:
        body = self._call(self.custom.get_namespaced_custom_object, "kubevirt.io", "v1", namespace,
                          "virtualmachineinstances", name)
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise TransientApiError("VMI read: response is not JSON") from None
        return obj if isinstance(obj, dict) else None

    def patch_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        self._call(self.core.patch_namespaced_pod, name, namespace, patch, _content_type=JSON_PATCH)

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self._call(self.core.create_namespaced_event, namespace, event)

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._call(self.core.patch_namespaced_event, name, namespace, patch, _content_type=MERGE_PATCH)

    def patch_vmi(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        self._call(self.custom.patch_namespaced_custom_object, "kubevirt.io", "v1", namespace,
                   "virtualmachineinstances", name, patch, _content_type=JSON_PATCH)

    def patch_vmim(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        self._call(self.custom.patch_namespaced_custom_object, "kubevirt.io", "v1", namespace,
                   "virtualmachineinstancemigrations", name, patch, _content_type=JSON_PATCH)

    def cancel_evacuation(self, namespace: str, name: str, node: str) -> None:
        # the generated clients have no method for KubeVirt's aggregated API: the client's own request path
        api = self.custom.api_client
        request = api.param_serialize("PUT", CANCEL_PATH, path_params={"namespace": namespace, "name": name},
                                      # virt-api's route declares no Produces: go-restful answers 406 unless
                                      # Accept allows */* (client-go's default Accept does)
                                      header_params={"Accept": "application/json, */*",
                                                     "Content-Type": "application/json"},
                                      body={"evacuationNodeName": node}, auth_settings=["BearerToken"])
        try:
            resp = api.call_api(*request, _request_timeout=self.timeout)
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as e:  # refused, reset, timed out
            raise TransientApiError(f"{type(e).__name__}: {e}") from None
        if not 200 <= resp.status <= 299:
            text = data.decode("utf-8", "replace")
            try:
                ApiException.from_response(http_resp=resp, body=text, data=None)
            except ApiException as e:  # it raises the status's own subclass
                err = classify(e)
                said = server_said(text)  # why virt-api refused (its drain taint, its own review): for the log line
                raise type(err)(f"{err}: {said}" if said else str(err)) from None
            raise PermanentApiError(f"{resp.status} {resp.reason or ''}".strip())

    def serves(self, group: str, version: str, resource: str) -> bool:
        try:
            body = self._call(self.custom.get_api_resources, group, version)
        except NotFound:
            return False  # the group/version is not served at all
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise TransientApiError(f"discovery of {group}/{version}: response is not JSON") from None
        listed = doc.get("resources") if isinstance(doc, dict) else None
        return any(isinstance(r, dict) and r.get("name") == resource for r in listed or ())

    def allowed(self, verb: str, group: str, resource: str, subresource: str = "", namespace: str = "") -> bool:
        attrs = {"verb": verb, "group": group, "resource": resource}
        attrs.update({k: v for k, v in (("subresource", subresource), ("namespace", namespace)) if v})
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": attrs}}
        body = self._call(AuthorizationV1Api(self.custom.api_client).create_self_subject_access_review, review)
        try:
            status = orjson.loads(body).get("status") or {}
        except (orjson.JSONDecodeError, AttributeError):
            raise TransientApiError("SelfSubjectAccessReview: response is not a review") from None
        return status.get("allowed") is True


class LogOnlyApi:
    """No API server (snapshot mode): log each write the guard would make, succeed."""

    def patch_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        log.info("would patch pod (no API server)", extra={"namespace": namespace, "pod": name,
                                                            "patch": orjson.dumps(patch).decode()})

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        obj = event.get("involvedObject", {})
        log.info("would create Event (no API server)", extra={
            "namespace": namespace, "vmi": obj.get("name"), "event_reason": event.get("reason"),
            "count": event.get("count"), "event_message": event.get("message"),
        })

    def read_vmi(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # the snapshot is all there is: the store's record stands

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        log.info("would update Event (no API server)", extra={"namespace": namespace, "event": name,
                                                               "count": patch.get("count")})

    def cancel_evacuation(self, namespace: str, name: str, node: str) -> None:
        log.info("would cancel evacuation (no API server)", extra={"namespace": namespace, "vmi": name, "node": node})

    def serves(self, group: str, version: str, resource: str) -> bool:
        return False  # no API server: nothing is served

    def allowed(self, verb: str, group: str, resource: str, subresource: str = "", namespace: str = "") -> bool:
        return False

    def patch_vmi(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        log.info("would patch VMI (no API server)", extra={"namespace": namespace, "vmi": name,
                                                            "patch": orjson.dumps(patch).decode()})

    def patch_vmim(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        log.info("would patch VMIM (no API server)", extra={"namespace": namespace, "vmim": name,
                                                             "patch": orjson.dumps(patch).decode()})


def read_vmi_afresh(api: EffectsApi, namespace: str, name: str) -> tuple[VMIRecord, dict] | None:
    """The VMI as the API server has it now, and its object (for ``resourceVersion``); None when it is gone,
    when there is no API server to ask (snapshot mode), or when it is not a VMI the guard can read. A job that
    writes from what it read re-reads first: the store may be behind, and a review names only a pod."""
    try:
        obj = api.read_vmi(namespace, name)
    except NotFound:
        return None
    if obj is None:
        return None
    try:
        return vmi_from_object(obj), obj
    except RecordError:
        return None
