"""Is the descheduler configured to run KubeVirt evictions in the background?

The guard's "evacuation in progress" denials only stop the descheduler from
evicting a second VM when its ``EvictionsInBackground`` feature gate is on.
Without it every KubeVirt eviction looks failed to the descheduler and it
keeps going down its list of candidate VMs (see kubevirt-facts.md), so the
guard exports what the cluster says, for an alert:

    kubevirt_eviction_guard_descheduler_background_evictions{state="enabled|disabled|unknown"}

exactly one state is 1. The OpenShift operator turns the gate on exactly when
``spec.profiles`` holds ``KubeVirtRelieveAndMigrate`` or its deprecated
``DevKubeVirtRelieveAndMigrate``, or ``spec.profileCustomizations.
devEnableEvictionsInBackground`` is true (cluster-kube-descheduler-operator,
``manageDeschedulerDeployment`` and ``hasKubeVirtRelieveAndMigrateProfile``,
June 2026); ``background_evictions`` decides the same way.

``unknown`` covers everything that is not a clear answer: the KubeDescheduler
API is not served (not OpenShift, operator not installed), the ``cluster``
object does not exist, or the guard may not read it. Those are normal
conditions on most clusters, so they are logged once, at info level, and
re-checked quietly every few minutes.

Beside it, ``descheduler_config_info`` (one series, value 1, only while the
object is known) carries what else the object says: see ``config_labels``.

The object is followed with list + watch on a field selector for its name.
Watches end at ``timeoutSeconds`` and resume from the last resourceVersion; a
410 (history compacted) relists.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Gauge
from urllib3.exceptions import HTTPError

from app.domain.descheduler import descheduler_from_object, node_limit_mismatch
from app.domain.records import KubeVirtRecord
from app.metrics import PREFIX

log = logging.getLogger("kubevirt_eviction_guard.descheduler")

GROUP, VERSION, PLURAL = "operator.openshift.io", "v1", "kubedeschedulers"
DEFAULT_NAMESPACE = "openshift-kube-descheduler-operator"
OBJECT_NAME = "cluster"
ENABLED, DISABLED, UNKNOWN = "enabled", "disabled", "unknown"
STATES = (ENABLED, DISABLED, UNKNOWN)
FIX = ("add the KubeVirtRelieveAndMigrate profile to spec.profiles, or set "
       "spec.profileCustomizations.devEnableEvictionsInBackground: true")
CONFIG_LABELS = ("profiles", "mode", "interval_seconds", "eviction_limit_total", "eviction_limit_node",
                 "migration_aware_plugin", "background_evictions_by", "migration_cooldown",
                 "max_migration_cooldown", "migration_history_window", "kubevirt_parallel_outbound_per_node",
                 "node_limit_above_kubevirt")


def background_evictions(obj: dict[str, Any] | None) -> str:
    """The state a KubeDescheduler object declares, decided as the operator does."""
    if not isinstance(obj, dict):
        return UNKNOWN
    return ENABLED if descheduler_from_object(obj).background_by else DISABLED


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def config_labels(obj: dict[str, Any], kubevirt: KubeVirtRecord | None = None) -> dict[str, str]:
    """The labels of ``descheduler_config_info``: the object's settings, named after its fields.

    ``profiles`` comma-separated in the object's order; ``mode`` ``Automatic`` or
    ``Predictive`` (the CRD's default: evict nothing); ``interval_seconds`` from
    ``deschedulingIntervalSeconds`` ("" when unset: the operator then refuses to run the
    descheduler); ``eviction_limit_total``/``_node`` the limits the operator applies
    (``spec.evictionLimits``, else 5/2 for the KubeVirt profiles, else "" for none);
    ``migration_aware_plugin`` "true" when a profile carries ``KubevirtMigrationAware``;
    ``background_evictions_by`` "profile", "flag", "profile+flag" or ""; the plugin's tuning
    (``devMigrationCooldown`` and friends) as written, "" for the plugin's default;
    ``kubevirt_parallel_outbound_per_node`` from the KubeVirt CR ("" when unknown) and
    ``node_limit_above_kubevirt`` "true" when the descheduler lets more VMs leave a node than KubeVirt
    migrates from it at once, "false", or "unknown".
    """
    d = descheduler_from_object(obj)
    outbound = kubevirt.effective_outbound_per_node if kubevirt is not None else None
    mismatch = node_limit_mismatch(d, outbound)
    return {
        "profiles": ",".join(d.profiles),
        "mode": d.mode,
        "interval_seconds": _text(d.interval_seconds),
        "eviction_limit_total": _text(d.eviction_limit_total),
        "eviction_limit_node": _text(d.eviction_limit_node),
        "migration_aware_plugin": "true" if d.kubevirt_profile else "false",
        "background_evictions_by": d.background_by,
        "migration_cooldown": d.migration_cooldown,
        "max_migration_cooldown": d.max_migration_cooldown,
        "migration_history_window": d.migration_history_window,
        "kubevirt_parallel_outbound_per_node": _text(outbound),
        "node_limit_above_kubevirt": "unknown" if mismatch is None else "true" if mismatch else "false",
    }


class _Gone(Exception):
    """The API or our permission to read it went away: back to quiet discovery."""


class DeschedulerCheck:
    def __init__(
        self,
        api: client.ApiClient,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        name: str = OBJECT_NAME,
        rediscover_every: float = 300.0,
        watch_timeout: int = 300,
        max_backoff: float = 60.0,
        kubevirt: Callable[[], KubeVirtRecord | None] = lambda: None,
    ) -> None:
        self.api = client.CustomObjectsApi(api)
        self.namespace, self.name = namespace, name
        self.rediscover_every, self.watch_timeout, self.max_backoff = rediscover_every, watch_timeout, max_backoff
        self.gauge = Gauge(
            PREFIX + "descheduler_background_evictions",
            "1 for the descheduler's background-evictions state (KubeDescheduler: a KubeVirtRelieveAndMigrate "
            "profile or profileCustomizations.devEnableEvictionsInBackground)",
            ["state"], registry=registry,
        )
        self.info = Gauge(
            PREFIX + "descheduler_config_info", "1, labelled with the KubeDescheduler's settings; absent when unknown",
            list(CONFIG_LABELS), registry=registry,
        )
        self.config: dict[str, str] = {}
        self.kubevirt = kubevirt  # the KubeVirt CR as the guard's store holds it, for the mismatch label
        self.object: dict[str, Any] | None = None  # the KubeDescheduler as last seen
        self.state = UNKNOWN  # until the API says otherwise; not worth a log line
        self._said: set[str] = set()  # quiet conditions already logged once
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self._publish(UNKNOWN)

    # -- state -------------------------------------------------------------

    def _publish(self, state: str) -> None:
        for s in STATES:
            self.gauge.labels(s).set(1 if s == state else 0)

    def refresh(self) -> None:
        """Re-publish the info labels (the KubeVirt CR changed)."""
        self._apply(self.object)

    def _apply(self, obj: dict[str, Any] | None) -> None:
        """The object as it is now (None: gone or unreadable)."""
        self.object = obj if isinstance(obj, dict) else None
        config = config_labels(obj, self.kubevirt()) if isinstance(obj, dict) else {}
        if config != self.config:
            self.config = config
            self.info.clear()
            if config:
                self.info.labels(**config).set(1)
                log.info("descheduler configuration", extra={"namespace": self.namespace, "object": self.name,
                                                             **{"descheduler_" + k: v for k, v in config.items()}})
        self._set(background_evictions(obj) if obj is not None else UNKNOWN)

    def _set(self, state: str) -> None:
        self._publish(state)
        if state == self.state:
            return
        self.state = state
        where = {"namespace": self.namespace, "object": self.name}
        if state == DISABLED:
            log.warning("descheduler background evictions are disabled: the descheduler will take KubeVirt's "
                        "evictions for failures and keep evicting more VMs; " + FIX, extra=where)
        else:
            log.info("descheduler background evictions: %s", state, extra=where)

    def _once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message, extra={"namespace": self.namespace, "object": self.name})

    # -- API ---------------------------------------------------------------

    def served(self) -> bool:
        """Whether the API server serves kubedeschedulers in operator.openshift.io/v1."""
        try:
            # raw JSON: the generated model rejects lists that omit fields it deems required
            resp = self.api.get_api_resources(GROUP, VERSION, _preload_content=False, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        resources = json.loads(resp.data).get("resources") or ()
        return any(isinstance(r, dict) and r.get("name") == PLURAL for r in resources)

    def _selector(self) -> str:
        return f"metadata.name={self.name}"

    def _is_ours(self, obj: Any) -> bool:
        return isinstance(obj, dict) and (obj.get("metadata") or {}).get("name") == self.name

    def _list(self) -> str:
        result = self.api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, field_selector=self._selector(), _request_timeout=30
        )
        items = [i for i in result.get("items") or () if self._is_ours(i)]
        if items:
            self._apply(items[0])
        else:
            self._once("absent", f"no KubeDescheduler {self.namespace}/{self.name}; background evictions unknown")
            self._apply(None)
        return (result.get("metadata") or {}).get("resourceVersion") or ""

    def _follow(self, resource_version: str) -> None:
        """Apply watch events until the stream ends (timeout) or fails; returns to relist on 410."""
        self._watch = w = watch.Watch()
        while not self._stop.is_set():
            stream = w.stream(
                self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                field_selector=self._selector(), resource_version=resource_version,
                timeout_seconds=self.watch_timeout, allow_watch_bookmarks=True,
                _request_timeout=self.watch_timeout + 30,
            )
            for event in stream:
                kind, obj = event.get("type"), event.get("object")
                if not self._is_ours(obj):
                    pass  # bookmarks, and other objects if the server ignored the field selector
                elif kind in ("ADDED", "MODIFIED"):
                    self._apply(obj)
                elif kind == "DELETED":
                    self._apply(None)
                if self._stop.is_set():
                    return
            resource_version = w.resource_version or resource_version

    # -- loop --------------------------------------------------------------

    def run_once(self) -> None:
        """Discover, list, then watch until something ends it. Raises _Gone or API/connection errors."""
        try:
            if not self.served():
                self._once("not-served", f"the API server does not serve {PLURAL}.{GROUP}/{VERSION}; "
                                         "descheduler background evictions unknown")
                self._apply(None)
                raise _Gone
            while not self._stop.is_set():
                try:
                    self._follow(self._list())
                except ApiException as e:
                    if e.status != 410:
                        raise
        except ApiException as e:
            if e.status in (401, 403, 404):
                self._once(f"http-{e.status}", f"cannot read {PLURAL}.{GROUP} ({e.status} {e.reason}); "
                                               "descheduler background evictions unknown")
                self._apply(None)
                raise _Gone from None
            raise

    def _run(self) -> None:
        backoff, failing = 1.0, False
        while not self._stop.is_set():
            try:
                self.run_once()
                backoff, failing = 1.0, False
            except _Gone:
                backoff, failing = 1.0, False
                self._stop.wait(self.rediscover_every)
            except (ApiException, HTTPError, OSError, ValueError) as e:
                # Unreachable or odd API server: the cluster's setting did not change, so the last known state
                # stays. Warn when it starts failing, not on every retry.
                (log.debug if failing else log.warning)(
                    "descheduler check: %s; retrying with backoff", e.__class__.__name__,
                    extra={"error": str(e).splitlines()[0] if str(e) else "", "retry_in_s": backoff})
                failing = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)
            except Exception:  # a bug here must not end the check for the life of the process
                log.exception("descheduler check failed; retrying")
                self._stop.wait(self.max_backoff)

    def start(self) -> DeschedulerCheck:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="descheduler-check", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
