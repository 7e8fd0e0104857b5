"""``serve``: wire settings, cluster state, the app and TLS together, then run uvicorn."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from app.admission.server import GuardContext, create_app
from app.cli import UsageError, clock, load_store, policy_settings
from app.config import SettingsError
from app.effects import Effects, KubeEffectsApi, LogOnlyApi
from app.metrics import Metrics
from app.policy.model import ClusterView
from app.timefmt import parse_duration
from app.tls import server_context

log = logging.getLogger("kubevirt_eviction_guard")


def build_context(args: argparse.Namespace) -> GuardContext:
    settings = policy_settings(args)
    if not args.snapshot:
        raise UsageError("serve: --snapshot FILE is required until live cluster watches are configured")
    store = load_store(args)
    if args.max_body_bytes <= 0:
        raise UsageError(f"--max-body-bytes: must be positive, got {args.max_body_bytes}")
    metrics = Metrics()
    effects = build_effects(args, store, metrics, api_client=None)  # snapshot: no API server to write to
    return GuardContext(
        view=store, settings=settings, clock=clock(args), metrics=metrics, on_decision=effects.on_decision,
        max_body_bytes=args.max_body_bytes, effects=effects,
    )


def build_effects(args: argparse.Namespace, view: ClusterView, metrics: Metrics, api_client=None) -> Effects:
    """Side effects write through ``api_client`` in live mode. Without an API server
    (snapshot mode) they run the same pipeline and log what they would write."""
    try:
        interval = parse_duration(args.event_interval)
    except ValueError as e:
        raise SettingsError(f"--event-interval: {e}") from None
    if interval < 0:
        raise SettingsError(f"--event-interval: must not be negative, got {args.event_interval}")
    if args.side_effect_queue < 1:
        raise UsageError(f"--side-effect-queue: must be positive, got {args.side_effect_queue}")
    api = KubeEffectsApi(api_client) if api_client is not None else LogOnlyApi()
    on = not args.no_side_effects
    return Effects(view, api, metrics, queue_capacity=args.side_effect_queue, event_interval=interval,
                   annotate=on, events=on)


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
    log.info("serving", extra={"url": f"https://{args.host}:{args.port}", "settings": repr(ctx.settings)})
    if ctx.effects is not None:
        ctx.effects.start()
    try:
        uvicorn.Server(config).run()
    finally:
        if ctx.effects is not None:
            ctx.effects.stop()
    return 0
