"""``serve``: wire settings, cluster state, the app and TLS together, then serve (``app.transport.http``)."""

from __future__ import annotations

import argparse
import gc
import logging
import resource
import threading

from app.admission.server import ADMISSION_PATHS, GuardContext, create_app
from app.cluster.informer import ClusterWatch
from app.config import SettingsError, by_name, load_config_file
from app.domain.view import ClusterView
from app.effects import Effects, KubeEffectsApi, LogOnlyApi
from app.effects.cancel import DISABLED, SNAPSHOT
from app.logs import batch_writes
from app.metrics import Metrics
from app.startup import UsageError, check_steering, clock, load_store, policy_settings, prometheus_durations, steering
from app.timefmt import format_duration, parse_duration
from app.transport import http
from app.transport.listeners import GuardServer, listen, listener
from app.transport.tls import server_context
from app.transport.tlsreload import CertReloader

log = logging.getLogger("kubevirt_eviction_guard")
DEFAULT_STALE_AFTER = "2m"
BACKLOG = 2048


def stale_after(args: argparse.Namespace) -> float:
    """``--stale-after`` (or ``staleAfter`` in ``--config``): a positive Go duration, in seconds."""
    raw, name = getattr(args, "stale_after", None), "--stale-after"
    if raw is None and getattr(args, "config", None):
        raw, name = load_config_file(args.config).get("staleAfter"), "staleAfter"
    if raw is None:
        raw = DEFAULT_STALE_AFTER
    try:
        seconds = parse_duration(str(raw))
    except ValueError as e:
        raise SettingsError(f"{name}: {e}") from None
    if seconds <= 0:
        raise SettingsError(f"{name}: must be a positive duration, got {raw!r}")
    return seconds


def live_cluster(args: argparse.Namespace, metrics: Metrics) -> ClusterWatch:
    """Watches on the cluster from --kubeconfig / in-cluster config (not started yet)."""
    from app.cluster.kube import api_client

    return ClusterWatch(api_client(args.kubeconfig, getattr(args, "kube_context", None)), metrics=metrics,
                        stale_after=stale_after(args))


def with_usage(ctx: GuardContext, args: argparse.Namespace) -> GuardContext:
    st = steering(args, ctx.metrics, discover=not args.snapshot, background=True)
    ctx.usage, ctx.usage_source = st.usage, st
    return ctx


def build_context(args: argparse.Namespace, cluster: ClusterWatch | None = None) -> GuardContext:
    return with_usage(_build_context(args, cluster), args)


def _build_context(args: argparse.Namespace, cluster: ClusterWatch | None = None) -> GuardContext:
    settings = policy_settings(args)
    limit = stale_after(args)  # validated in every mode: a bad flag is a bad flag
    if args.max_body_bytes <= 0:
        raise UsageError(f"--max-body-bytes: must be positive, got {args.max_body_bytes}")
    if cluster is not None:
        cluster.board.stale_after = limit
        metrics = cluster.metrics or Metrics()
        effects = build_effects(args, cluster.store, metrics, api_client=effects_client(args))
        if not args.no_side_effects and not getattr(args, "no_history_annotation", False):
            effects.record_history(cluster.store, settings, ready=lambda: cluster.health().ready)
            effects.record_causes(cluster.store)
        ready = cluster.health
        if not args.no_side_effects and getattr(args, "cancel_stuck_evacuations", True):
            # a stale eviction-source would make a later evacuation the descheduler did not cause cancellable
            effects.clean_stale_sources(cluster.store)
            effects.cancel_stuck_evacuations(cluster.store, settings, ready=lambda: ready().ready,
                                             interval=cancel_interval(args))
        else:
            metrics.set_canceller(DISABLED)
        effects.watch_held_nodes(cluster.store, settings, ready=lambda: ready().ready)
        effects.watch_failing_evacuations(cluster.store, settings, ready=lambda: ready().ready)
        return GuardContext(
            view=cluster.store, settings=settings, health=cluster.health, readiness_detail=cluster.readiness_detail,
            metrics=metrics, clock=clock(args), on_decision=effects.on_decision,
            effects=effects, fresh_view=leaver_read(args, cluster.store),
        )
    if not args.snapshot:
        raise UsageError("serve: give --snapshot FILE, or a cluster to watch (--kubeconfig FILE, or run in a pod)")
    store = load_store(args)
    metrics = Metrics()
    metrics.set_canceller(SNAPSHOT)  # no API server to cancel through
    effects = build_effects(args, store, metrics, api_client=None)  # snapshot: no API server, log what it would write
    return GuardContext(
        view=store, settings=settings, clock=clock(args), metrics=metrics, on_decision=effects.on_decision,
        effects=effects,
    )


def freeze_state() -> None:
    """The loaded state lives as long as the process: keep it out of the cyclic GC, whose full
    collections would otherwise walk it again and again (about 0.2 s each with 100,000 VMIs,
    every few seconds under load: the whole p99)."""
    gc.collect()
    gc.freeze()


def freeze_after_sync(cluster: ClusterWatch, timeout: float = 600.0) -> None:
    """Live mode: the same, once every kind has been listed (later relists replace the
    frozen records; their replacements age into the old generation as usual)."""
    def run() -> None:
        if cluster.wait_synced(timeout):
            freeze_state()

    threading.Thread(target=run, name="gc-freeze", daemon=True).start()


def raise_fd_limit() -> None:
    """Every connection is a file descriptor; the usual soft limit of 1024 would let a few
    hundred idle clients starve the API server's requests. Raise it to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def effects_client(args: argparse.Namespace):
    """The side effects' own ApiClient (its own connection pool: the watches hold theirs open)."""
    from app.cluster.kube import api_client

    return api_client(args.kubeconfig, getattr(args, "kube_context", None), pool_size=2)


def leaver_read(args: argparse.Namespace, store: ClusterView):
    """`node_busy` read again before an allow (app/cluster/fresh.py), on its own small connection pool."""
    from app.cluster.fresh import LeaverRead
    from app.cluster.kube import api_client

    return LeaverRead(api_client(args.kubeconfig, getattr(args, "kube_context", None), pool_size=4), store).view_of


def cancel_interval(args: argparse.Namespace) -> float:
    raw = getattr(args, "cancel_interval", "30s")
    try:
        seconds = parse_duration(raw)
    except ValueError as e:
        raise SettingsError(f"--cancel-interval: {e}") from None
    if seconds <= 0:
        raise SettingsError(f"--cancel-interval: must be positive, got {raw}")
    return seconds


def event_interval(args: argparse.Namespace) -> float:
    try:
        interval = parse_duration(args.event_interval)
    except ValueError as e:
        raise SettingsError(f"--event-interval: {e}") from None
    if interval < 0:
        raise SettingsError(f"--event-interval: must not be negative, got {args.event_interval}")
    return interval


def build_effects(args: argparse.Namespace, view: ClusterView, metrics: Metrics, api_client=None) -> Effects:
    """Side effects write through ``api_client`` in live mode. Without an API server
    (snapshot mode) they run the same pipeline and log what they would write."""
    interval = event_interval(args)
    if args.side_effect_queue < 1:
        raise UsageError(f"--side-effect-queue: must be positive, got {args.side_effect_queue}")
    api = KubeEffectsApi(api_client) if api_client is not None else LogOnlyApi()
    on = not args.no_side_effects
    return Effects(view, api, metrics, queue_capacity=args.side_effect_queue, event_interval=interval,
                   annotate=on, events=on, descheduler_users=policy_settings(args).descheduler_users)


def http_limits(args: argparse.Namespace) -> http.HttpLimits:
    """The bounds on clients from serve's flags (durations parsed in place); a bad one is a UsageError naming it."""
    for flag in ("request_timeout", "idle_timeout", "graceful_timeout", "shutdown_drain", "tls_handshake_timeout"):
        raw = getattr(args, flag)
        try:
            value = parse_duration(raw) if isinstance(raw, str) else float(raw)
        except ValueError as e:
            raise UsageError(f"--{flag.replace('_', '-')}: {e}") from None
        if value < 0 or (value == 0 and flag != "shutdown_drain"):
            raise UsageError(f"--{flag.replace('_', '-')}: must be positive, got {raw}")
        setattr(args, flag, value)
    for flag, least in (("max_header_bytes", 1024), ("max_headers", 16), ("max_connections", 8)):
        if getattr(args, flag) < least:
            raise UsageError(f"--{flag.replace('_', '-')}: must be at least {least}, got {getattr(args, flag)}")
    return http.HttpLimits(request_timeout=args.request_timeout, max_header_bytes=args.max_header_bytes,
                               max_headers=args.max_headers, max_connections=args.max_connections,
                               tls_handshake_timeout=args.tls_handshake_timeout, idle_timeout=args.idle_timeout,
                               max_body_bytes=args.max_body_bytes)


def serve(args: argparse.Namespace) -> int:
    ssl_ctx = server_context(args.tls_cert, args.tls_key, args.client_ca)
    limits = http_limits(args)
    raise_fd_limit()
    http.return_freed_memory()
    # refuse every bad setting before binding a port, touching the cluster or loading a snapshot
    policy_settings(args), clock(args), stale_after(args), cancel_interval(args), prometheus_durations(args)
    event_interval(args), check_steering(args)
    if args.metrics_port and args.metrics_port == args.port:
        raise UsageError(f"--metrics-port: must be a port other than --port {args.port}")
    cluster = None if args.snapshot else live_cluster(args, Metrics())  # parses --kubeconfig; starts nothing
    ctx = build_context(args, cluster)  # the rest of the flags, the snapshot, the kubeconfig: nothing started yet
    # bound only once every flag is known good: a refusal never depends on whether the port is free
    try:
        sock = listen(args.host, args.port, BACKLOG, "--port")
        metrics_sock = listen(args.host, args.metrics_port, BACKLOG, "--metrics-port") if args.metrics_port else None
    except OSError as e:
        raise UsageError(str(e)) from None
    if cluster is None:
        freeze_state()
    # TLS 1.2 minimum; with --client-ca the admission paths need a verified client certificate (probes do not).
    # With a metrics port, /metrics is served there only.
    webhook = listener(create_app(ctx, metrics_route=not args.metrics_port), limits, ctx.metrics, "webhook",
                       tls=ssl_ctx, peer_cert_required=ADMISSION_PATHS)
    batch_writes()  # one log line per decision: write them in batches (logs.BatchingStreamHandler)
    background = start_background(args, ssl_ctx, ctx, limits, metrics_sock)
    log.info("serving", extra={"url": f"https://{args.host}:{args.port}", "source": args.snapshot or "live cluster",
                               "settings": by_name(ctx.settings), "server": server_settings(args, ctx)})
    if cluster is not None:
        cluster.start()
        freeze_after_sync(cluster)
    if ctx.effects is not None:
        ctx.effects.start()
    if ctx.usage_source is not None:
        ctx.usage_source.start()  # one line: steering on, pending (then on or off, why), or off and why
    try:
        GuardServer(webhook, sock, ctx, args.shutdown_drain, args.graceful_timeout).run()
    finally:
        for part in reversed(background):
            part.stop()
        if ctx.effects is not None:
            ctx.effects.stop()
        if ctx.usage_source is not None:
            ctx.usage_source.stop()
        if cluster is not None:
            cluster.stop()
    return 0


def server_settings(args: argparse.Namespace, ctx: GuardContext) -> dict:
    """serve's own settings by their chart names (values.yaml ``server``), durations the Go way."""
    out = {
        "host": args.host, "port": args.port, "metricsPort": args.metrics_port,
        "logLevel": logging.getLevelName(logging.getLogger().level).lower(),
        "maxBodyBytes": args.max_body_bytes, "staleAfter": format_duration(stale_after(args)),
        "tlsReloadInterval": format_duration(args.tls_reload_interval),
        "requestTimeout": format_duration(args.request_timeout), "idleTimeout": format_duration(args.idle_timeout),
        "gracefulTimeout": format_duration(args.graceful_timeout), "shutdownDrain": format_duration(args.shutdown_drain),
        "sideEffects": not args.no_side_effects, "eventInterval": format_duration(event_interval(args)),
        "sideEffectQueue": args.side_effect_queue, "historyAnnotation": not args.no_history_annotation,
        "cancelStuckEvacuations": args.cancel_stuck_evacuations, "clientCA": bool(args.client_ca),
        "maxHeaderBytes": args.max_header_bytes, "maxHeaders": args.max_headers,
        "maxConnections": args.max_connections, "tlsHandshakeTimeout": format_duration(args.tls_handshake_timeout),
    }
    if args.cancel_stuck_evacuations:
        out["cancelInterval"] = format_duration(cancel_interval(args))
    src = ctx.usage_source.source if ctx.usage_source is not None else None
    if src is not None:
        out["prometheus"] = {"url": src.url, "from": ctx.usage_source.origin, "interval": format_duration(src.interval),
                             "maxAge": format_duration(src.max_age)}
    return out


def start_background(args: argparse.Namespace, ssl_ctx, ctx: GuardContext, limits: http.HttpLimits,
                     metrics_sock=None) -> list:
    """What lives beside the HTTPS server: certificate reload, the plain-HTTP metrics port, the descheduler check."""
    registry = ctx.metrics.registry
    parts: list = [CertReloader(ssl_ctx, args.tls_cert, args.tls_key, args.client_ca,
                                interval=args.tls_reload_interval, registry=registry).start()]
    if args.metrics_port:
        from app.transport.metrics_port import MetricsServer

        try:
            parts.append(MetricsServer(create_app(ctx), ctx.metrics, metrics_sock, limits).start())
        except OSError as e:
            raise UsageError(str(e)) from None
    if not args.snapshot and args.descheduler_check:
        from app.cluster.descheduler import DeschedulerCheck
        from app.cluster.kube import api_client
        from app.domain.kinds import KUBEVIRT

        api = api_client(args.kubeconfig, getattr(args, "kube_context", None))
        view = ctx.view
        check = DeschedulerCheck(api, registry, namespace=args.descheduler_namespace,
                                 kubevirt=getattr(view, "kubevirt", lambda: None))
        if hasattr(view, "add_listener"):  # the KubeVirt CR changed: the mismatch label may have
            view.add_listener(lambda kind, old, new: check.refresh() if kind == KUBEVIRT else None)
        parts.append(check.start())
    return parts
