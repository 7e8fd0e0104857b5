"""What every command starts from: its settings, its clock, and the cluster state
(a snapshot file, or one list of a live cluster). Shared by ``serve``, ``explain``
and ``report``; ``app.cli`` only parses arguments and dispatches."""

from __future__ import annotations

import argparse
import logging
import time

from app.cluster.snapshot import SnapshotError, load_snapshot
from app.cluster.store import ClusterStore
from app.config import SETTING_NAMES, SettingsError, build_settings, load_config_file
from app.domain.kinds import VMI
from app.policy.model import PolicySettings
from app.timefmt import parse_timestamp

log = logging.getLogger("kubevirt_eviction_guard")


class UsageError(Exception):
    """A command cannot run as asked; the text says why."""


def policy_settings(args: argparse.Namespace) -> PolicySettings:
    values = load_config_file(args.config) if args.config else {}
    for name in SETTING_NAMES:
        flag = getattr(args, name, None)
        if flag is not None:
            values[name] = flag
    return build_settings(values)


def clock(args: argparse.Namespace):
    if getattr(args, "now", None) is None:
        return time.time
    fixed = parse_timestamp(args.now)
    if fixed is None:
        raise SettingsError(f"--now: not an RFC 3339 timestamp: {args.now!r}")
    return lambda: fixed


def load_store(args: argparse.Namespace) -> ClusterStore:
    if not args.snapshot:
        return list_live_store(args)
    store, stats = load_snapshot(args.snapshot)
    if not stats.loaded[VMI]:
        raise SnapshotError(f"--snapshot {args.snapshot}: no VirtualMachineInstance in it (expected what "
                            "'kubectl get vmi,vmim,pods,nodes -A -o yaml' prints)")
    log.info("snapshot loaded", extra={"file": args.snapshot, **stats.loaded, "skipped_kinds": stats.skipped_kinds,
                                       "skipped_malformed": stats.skipped_malformed})
    if stats.skipped_malformed:
        log.warning("snapshot: objects without a name skipped", extra={"file": args.snapshot,
                                                                       "skipped_malformed": stats.skipped_malformed})
    return store


def list_live_store(args: argparse.Namespace) -> ClusterStore:
    """One list of each kind through the API (``--kubeconfig`` or in-cluster)."""
    from app.cluster.kube import api_client
    from app.cluster.listing import ListError, list_store

    with api_client(getattr(args, "kubeconfig", None), getattr(args, "kube_context", None)) as client:
        try:
            store, stats = list_store(client)
        except ListError as e:
            raise UsageError(str(e)) from None
    log.info("cluster listed", extra={**stats.loaded, "skipped_malformed": stats.skipped_malformed})
    return store


def load_eviction_requests(args: argparse.Namespace):
    """Kubernetes' EvictionRequests (lifecycle.k8s.io/v1alpha1) from the cluster, for explain and report; None when
    reading a snapshot, or when the API server does not serve them or we may not list them (they are then not
    mentioned: the API is alpha and off by default)."""
    if args.snapshot:
        return None
    from app.cluster.kube import api_client
    from app.cluster.listing import ListError, list_eviction_requests

    with api_client(getattr(args, "kubeconfig", None), getattr(args, "kube_context", None)) as client:
        try:
            return list_eviction_requests(client)
        except ListError as e:
            raise UsageError(str(e)) from None


def prometheus_source(args: argparse.Namespace, metrics=None):
    """The background Prometheus poller when ``--prometheus-url`` is given (not started), else None."""
    url = getattr(args, "prometheus_url", None)
    if not url:
        return None
    from app.metricsource.prometheus import PrometheusSource, SettingsProblem

    durations = prometheus_durations(args)
    try:
        return PrometheusSource(url, token_file=args.prometheus_token_file, ca_file=args.prometheus_ca,
                                interval=durations.get("prometheus_interval", 30.0),
                                timeout=durations.get("prometheus_timeout", 5.0),
                                max_age=durations.get("prometheus_max_age"), clock=clock(args), metrics=metrics)
    except SettingsProblem as e:
        raise SettingsError(str(e)) from None


def policy_configmaps(args: argparse.Namespace) -> list[str]:
    """``--descheduler-policy``: the ConfigMaps (``NS/NAME``, comma-separated) holding the descheduler's policy."""
    from app.metricsource.discovery import DEFAULT_POLICY_CONFIGMAPS, configmap_ref

    raw = getattr(args, "descheduler_policy", None)
    refs = list(DEFAULT_POLICY_CONFIGMAPS) if raw is None else [r.strip() for r in raw.split(",") if r.strip()]
    for ref in refs:
        try:
            configmap_ref(ref)
        except ValueError as e:
            raise SettingsError(f"--descheduler-policy: {e}") from None
    return refs


def check_steering(args: argparse.Namespace) -> None:
    """Refuse contradicting or bad steering flags (touches nothing)."""
    if getattr(args, "steering", "auto") == "off" and getattr(args, "prometheus_url", None):
        raise SettingsError("--steering off: contradicts --prometheus-url (give one or the other)")
    policy_configmaps(args)
    source = prometheus_source(args)  # built to be checked, then closed
    if source is not None:
        source.stop()
    ca = getattr(args, "prometheus_ca", None)
    if ca:
        import ssl

        try:
            ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise SettingsError(f"--prometheus-ca {ca}: not a readable PEM CA bundle: {e}") from None


def steering(args: argparse.Namespace, metrics=None, *, discover: bool = True, background: bool = False):
    """How steering runs (nothing started): ``--steering off``; ``--prometheus-url``; else, on a live cluster
    (``discover``), the Prometheus named by the descheduler's policy (app/metricsource/discovery.py)."""
    from app.metricsource.steering import DISABLED, FLAG, NOT_CONFIGURED, Steering

    check_steering(args)
    if getattr(args, "steering", "auto") == "off":
        return Steering(None, "", DISABLED, "--steering off", metrics=metrics)
    source = prometheus_source(args, metrics)
    if source is not None:
        return Steering(source, FLAG, metrics=metrics)
    refs = policy_configmaps(args)
    if not discover or getattr(args, "snapshot", None) or not refs:
        why = ("no --prometheus-url, and a snapshot names no descheduler policy" if getattr(args, "snapshot", None)
               else "no --prometheus-url, and no --descheduler-policy to find one in")
        return Steering(None, "", NOT_CONFIGURED, why, metrics=metrics)
    from app.cluster.kube import api_client
    from app.metricsource.discovery import discover as find

    api = api_client(getattr(args, "kubeconfig", None), getattr(args, "kube_context", None), pool_size=2)
    build = lambda p: discovered_source(args, p, api, metrics)  # noqa: E731
    if background:  # serve: nothing waits on the API server before the port is bound
        return Steering.discovering(lambda: find(api, refs), build, rediscover_every=60.0, metrics=metrics)
    return Steering.found(find(api, refs), build, metrics=metrics)


def steering_once(args: argparse.Namespace):
    """``steering`` for a one-shot command: one round of queries, here and now (nothing left running)."""
    st = steering(args)
    if st.source is not None:
        try:
            st.source.poll_once()
        finally:
            st.source.stop()
    return st


def discovered_source(args: argparse.Namespace, provider, api, metrics=None):
    """A poller for the descheduler's Prometheus, with the credentials it uses: the token in its ``authToken``
    Secret when it names one (only over https); otherwise it sends its own ServiceAccount's token, which the
    guard does not have, so the guard sends ``--prometheus-token-file`` when given (a reader ServiceAccount's),
    else nothing. Never the guard's own token. CA: ``--prometheus-ca``, else the pod's ServiceAccount
    ``ca.crt`` as the descheduler uses, else the system's."""
    import os
    from urllib.parse import urlsplit

    from app.metricsource.discovery import POD_CA, SecretToken
    from app.metricsource.prometheus import PrometheusSource

    https = urlsplit(provider.url).scheme == "https"
    token, token_file = None, None
    if https and provider.token_secret is not None:
        token = SecretToken(api, *provider.token_secret)
    elif https:
        token_file = args.prometheus_token_file
    ca = args.prometheus_ca or (POD_CA if https and os.path.exists(POD_CA) else None)
    durations = prometheus_durations(args)
    return PrometheusSource(provider.url, token=token, token_file=token_file, ca_file=ca,
                            interval=durations.get("prometheus_interval", 30.0),
                            timeout=durations.get("prometheus_timeout", 5.0),
                            max_age=durations.get("prometheus_max_age"), clock=clock(args), metrics=metrics)


def prometheus_durations(args: argparse.Namespace) -> dict[str, float]:
    """The ``--prometheus-*`` durations that are given, in seconds; each must be positive."""
    from app.timefmt import parse_duration

    durations = {}
    for flag in ("prometheus_interval", "prometheus_max_age", "prometheus_timeout"):
        raw = getattr(args, flag, None)
        if raw is None:
            continue
        try:
            durations[flag] = parse_duration(raw)
        except ValueError as e:
            raise SettingsError(f"--{flag.replace('_', '-')}: {e}") from None
        if durations[flag] <= 0:
            raise SettingsError(f"--{flag.replace('_', '-')}: must be a positive duration, got {raw!r}")
    return durations
