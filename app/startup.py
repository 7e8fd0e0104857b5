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
