"""``serve``: wire settings, cluster state, the app and TLS together, then run uvicorn."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from app.admission.server import GuardContext, create_app, log_decision
from app.cli import UsageError, clock, load_store, policy_settings
from app.tls import server_context
from app.tlsreload import CertReloader

log = logging.getLogger("kubevirt_eviction_guard")


def build_context(args: argparse.Namespace) -> GuardContext:
    settings = policy_settings(args)
    if not args.snapshot:
        raise UsageError("serve: --snapshot FILE is required until live cluster watches are configured")
    store = load_store(args)
    if args.max_body_bytes <= 0:
        raise UsageError(f"--max-body-bytes: must be positive, got {args.max_body_bytes}")
    return GuardContext(
        view=store, settings=settings, clock=clock(args), on_decision=log_decision, max_body_bytes=args.max_body_bytes
    )


def serve(args: argparse.Namespace) -> int:
    ssl_ctx = server_context(args.tls_cert, args.tls_key, args.client_ca)
    ctx = build_context(args)
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
    log.info("serving", extra={"url": f"https://{args.host}:{args.port}", "settings": repr(ctx.settings)})
    try:
        uvicorn.Server(config).run()
    finally:
        for part in reversed(background):
            part.stop()
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
        from app.cluster.apiclient import ClusterConfigError, api_client
        from app.cluster.descheduler import DeschedulerCheck

        try:
            api = api_client(getattr(args, "kubeconfig", None))
        except ClusterConfigError as e:
            raise UsageError(str(e)) from None
        parts.append(DeschedulerCheck(api, registry, namespace=args.descheduler_namespace).start())
    return parts
