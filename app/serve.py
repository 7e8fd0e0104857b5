"""``serve``: wire settings, cluster state, the app and TLS together, then run uvicorn."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from app.admission.server import GuardContext, create_app, log_decision
from app.cli import UsageError, clock, load_store, policy_settings
from app.cluster.informer import ClusterWatch
from app.config import SettingsError, load_config_file
from app.metrics import Metrics
from app.timefmt import parse_duration
from app.tls import server_context
from app.tlsreload import CertReloader

log = logging.getLogger("kubevirt_eviction_guard")
DEFAULT_STALE_AFTER = "2m"


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


def build_context(args: argparse.Namespace, cluster: ClusterWatch | None = None) -> GuardContext:
    settings = policy_settings(args)
    limit = stale_after(args)  # validated in every mode: a bad flag is a bad flag
    if args.max_body_bytes <= 0:
        raise UsageError(f"--max-body-bytes: must be positive, got {args.max_body_bytes}")
    if cluster is not None:
        cluster.board.stale_after = limit
        return GuardContext(
            view=cluster.store, settings=settings, health=cluster.health, readiness_detail=cluster.readiness_detail,
            metrics=cluster.metrics or Metrics(), clock=clock(args), on_decision=log_decision,
            max_body_bytes=args.max_body_bytes,
        )
    if not args.snapshot:
        raise UsageError("serve: give --snapshot FILE, or a cluster to watch (--kubeconfig FILE, or run in a pod)")
    store = load_store(args)
    return GuardContext(
        view=store, settings=settings, clock=clock(args), on_decision=log_decision, max_body_bytes=args.max_body_bytes
    )


def serve(args: argparse.Namespace) -> int:
    ssl_ctx = server_context(args.tls_cert, args.tls_key, args.client_ca)
    policy_settings(args), stale_after(args)  # refuse bad settings before touching the cluster
    cluster = None if args.snapshot else live_cluster(args, Metrics())
    ctx = build_context(args, cluster)
    config = uvicorn.Config(
        create_app(ctx),
        host=args.host,
        port=args.port,
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        loop="auto",
        http="auto",
        log_config=None,
        access_log=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=20,
        h11_max_incomplete_event_size=64 * 1024,
    )
    config.load()
    config.ssl = ssl_ctx  # ours: TLS 1.2 minimum, optional client-certificate verification
    background = start_background(args, ssl_ctx, ctx)
    log.info("serving", extra={"url": f"https://{args.host}:{args.port}", "settings": repr(ctx.settings),
                               "source": args.snapshot or "live cluster"})
    if cluster is not None:
        cluster.start()
    try:
        uvicorn.Server(config).run()
    finally:
        for part in reversed(background):
            part.stop()
        if cluster is not None:
            cluster.stop()
    return 0


def start_background(args: argparse.Namespace, ssl_ctx, ctx: GuardContext) -> list:
    """What lives beside the HTTPS server: certificate reload, the plain-HTTP metrics port, the descheduler check."""
    if args.metrics_port and not (0 < args.metrics_port < 65536 and args.metrics_port != args.port):
        raise UsageError(f"--metrics-port: must be a free port other than --port {args.port}, got {args.metrics_port}")
    registry = ctx.metrics.registry
    parts: list = [CertReloader(ssl_ctx, args.tls_cert, args.tls_key, args.client_ca,
                                interval=args.tls_reload_interval, registry=registry).start()]
    if args.metrics_port:
        from app.metrics_server import MetricsServer

        try:
            parts.append(MetricsServer(ctx, args.host, args.metrics_port).start())
        except OSError as e:
            raise UsageError(str(e)) from None
    if not args.snapshot and args.descheduler_check:
        from app.cluster.descheduler import DeschedulerCheck
        from app.cluster.kube import api_client

        api = api_client(args.kubeconfig, getattr(args, "kube_context", None))
        parts.append(DeschedulerCheck(api, registry, namespace=args.descheduler_namespace).start())
    return parts
