"""Delete one webhook configuration by name: ``kubevirt-eviction-guard unregister``.

The chart runs it as a ``pre-delete`` hook so that the API server stops calling the guard before Helm deletes the
guard's Service and pods (Helm 3 deletes webhook configurations last). It retries what can pass on its own: a 403
right after Helm created the hook's RoleBinding (the API server's authorizer sees new RBAC a moment later), 429,
5xx and connection errors, until its deadline; a webhook configuration that is already gone is success.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from app.backoff import EQUAL, Backoff

KINDS = {"mutating": "mutatingwebhookconfiguration", "validating": "validatingwebhookconfiguration"}
# answers no retry changes: a malformed request or credentials the API server does not accept
FINAL = {400, 401, 405, 422}


class UnregisterError(Exception):
    """The webhook configuration could not be deleted; the text says what the API server answered last."""


def delete_webhook_configuration(
    api: client.ApiClient,
    kind: str,
    name: str,
    *,
    timeout: float,
    backoff: Backoff = Backoff(base=0.5, cap=4.0, jitter=EQUAL),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """``"deleted"`` or ``"absent"`` (already gone); raises UnregisterError once ``timeout`` seconds have passed or
    the API server gave an answer that a retry cannot change."""
    adm = client.AdmissionregistrationV1Api(api)
    delete = {"mutating": adm.delete_mutating_webhook_configuration,
              "validating": adm.delete_validating_webhook_configuration}[kind]
    deadline = clock() + timeout
    attempt = 0
    while True:
        attempt += 1
        remaining = max(deadline - clock(), 0.5)
        try:
            delete(name, _request_timeout=min(remaining, 10.0))
            return "deleted"
        except ApiException as e:
            if e.status == 404:
                return "absent"
            last = f"HTTP {e.status} {e.reason}"
            if e.status in FINAL:
                raise UnregisterError(f"{KINDS[kind]} {name}: {last}") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            last = f"{type(e).__name__}: {e}"
        delay = backoff.delay(attempt)
        if clock() + delay >= deadline:
            raise UnregisterError(f"{KINDS[kind]} {name}: not deleted after {attempt} attempts in {timeout:g} s; "
                                  f"last answer: {last}")
        sleep(delay)
