"""``serve``: wire settings, cluster state, the app and TLS together, then run uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import resource
import signal
import threading

import uvicorn

from app.admission import protocol
from app.admission.server import GuardContext, create_app
from app.cluster.informer import ClusterWatch
from app.config import SettingsError, load_config_file
from app.domain.view import ClusterView
from app.effects import Effects, KubeEffectsApi, LogOnlyApi
from app.effects.cancel import DISABLED, SNAPSHOT
from app.logs import batch_writes
from app.metrics import Metrics
from app.startup import UsageError, clock, load_store, policy_settings, prometheus_source
from app.timefmt import parse_duration
from app.tls import server_context
from app.tlsreload import CertReloader

log = logging.getLogger("kubevirt_eviction_guard")
DEFAULT_STALE_AFTER = "2m"


class GuardServer(uvicorn.Server):
    """uvicorn's server, but a SIGTERM ends in exit status 0 after the graceful drain.

    uvicorn re-raises the captured signal once it has shut down, so the process
    dies "killed by SIGTERM"; Kubernetes and process supervisors read that as a
    crash. The guard stops on SIGTERM by design.
    """

    def __init__(self, config: uvicorn.Config, ctx: GuardContext, drain_seconds: float) -> None:
        super().__init__(config)
        self.ctx = ctx
        self.drain_seconds = drain_seconds

    def handle_exit(self, sig: int, frame) -> None:
        """SIGINT (Ctrl-C) stops at once. First SIGTERM: report not ready and keep serving for ``drain_seconds`` (the
        API server keeps sending to an endpoint until it is removed from the Service),
        then stop accepting and let in-flight requests finish. A second signal stops now."""
        if self.ctx.shutting_down or self.drain_seconds <= 0 or sig != signal.SIGTERM:
            super().handle_exit(sig, frame)
            return
        self.ctx.shutting_down = True
        log.info("shutting down: readiness off, draining", extra={"drain_seconds": self.drain_seconds})
        timer = threading.Timer(self.drain_seconds, super().handle_exit, (sig, None))
        timer.daemon = True
        timer.start()

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)



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
    source = prometheus_source(args, ctx.metrics)
    if source is not None:
        ctx.usage, ctx.usage_source = source.current, source
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
        ready = cluster.health
        if not args.no_side_effects and getattr(args, "cancel_stuck_evacuations", True):
            effects.cancel_stuck_evacuations(cluster.store, settings, ready=lambda: ready().ready,
                                             interval=cancel_interval(args))
        else:
            metrics.set_canceller(DISABLED)
        effects.watch_held_nodes(cluster.store, settings, ready=lambda: ready().ready)
        return GuardContext(
            view=cluster.store, settings=settings, health=cluster.health, readiness_detail=cluster.readiness_detail,
            metrics=metrics, clock=clock(args), on_decision=effects.on_decision,
            max_body_bytes=args.max_body_bytes, effects=effects,
        )
    if not args.snapshot:
        raise UsageError("serve: give --snapshot FILE, or a cluster to watch (--kubeconfig FILE, or run in a pod)")
    store = load_store(args)
    metrics = Metrics()
    metrics.set_canceller(SNAPSHOT)  # no API server to cancel through
    effects = build_effects(args, store, metrics, api_client=None)  # snapshot: no API server, log what it would write
    return GuardContext(
        view=store, settings=settings, clock=clock(args), metrics=metrics, on_decision=effects.on_decision,
        max_body_bytes=args.max_body_bytes, effects=effects,
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


def cancel_interval(args: argparse.Namespace) -> float:
    raw = getattr(args, "cancel_interval", "30s")
    try:
        seconds = parse_duration(raw)
    except ValueError as e:
        raise SettingsError(f"--cancel-interval: {e}") from None
    if seconds <= 0:
        raise SettingsError(f"--cancel-interval: must be positive, got {raw}")
    return seconds


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
                   annotate=on, events=on, descheduler_users=policy_settings(args).descheduler_users)


def serve(args: argparse.Namespace) -> int:
    ssl_ctx = server_context(args.tls_cert, args.tls_key, args.client_ca)
    for flag in ("request_timeout", "idle_timeout", "graceful_timeout", "shutdown_drain"):
        raw = getattr(args, flag)
        try:
            value = parse_duration(raw)
        except ValueError as e:
            raise UsageError(f"--{flag.replace('_', '-')}: {e}") from None
        if value < 0 or (value == 0 and flag != "shutdown_drain"):
            raise UsageError(f"--{flag.replace('_', '-')}: must be positive, got {raw}")
        setattr(args, flag, value)
    protocol.GuardHttpProtocol.request_timeout = args.request_timeout
    raise_fd_limit()
    policy_settings(args), stale_after(args), cancel_interval(args)  # refuse bad settings before touching the cluster
    cluster = None if args.snapshot else live_cluster(args, Metrics())
    ctx = build_context(args, cluster)
    if cluster is None:
        freeze_state()
    config = uvicorn.Config(
        create_app(ctx),
        host=args.host,
        port=args.port,
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        loop="auto",
        http=protocol.GuardHttpProtocol,
        log_config=None,
        access_log=False,
        timeout_keep_alive=args.idle_timeout,
        timeout_graceful_shutdown=args.graceful_timeout,
        backlog=2048,
    )
    config.load()
    config.ssl = ssl_ctx  # ours: TLS 1.2 minimum, optional client-certificate verification
    batch_writes()  # one log line per decision: write them in batches (logs.BatchingStreamHandler)
    background = start_background(args, ssl_ctx, ctx)
    log.info("serving", extra={"url": f"https://{args.host}:{args.port}", "settings": repr(ctx.settings),
                               "source": args.snapshot or "live cluster"})
    if cluster is not None:
        cluster.start()
        freeze_after_sync(cluster)
    if ctx.effects is not None:
        ctx.effects.start()
    if ctx.usage_source is not None:
        log.info("steering on: polling Prometheus", extra={"url": ctx.usage_source.url,
                                                           "interval_s": ctx.usage_source.interval,
                                                           "max_age_s": ctx.usage_source.max_age})
        ctx.usage_source.start()
    try:
        GuardServer(config, ctx, args.shutdown_drain).run()
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
        from app.domain.kinds import KUBEVIRT

        api = api_client(args.kubeconfig, getattr(args, "kube_context", None))
        view = ctx.view
        check = DeschedulerCheck(api, registry, namespace=args.descheduler_namespace,
                                 kubevirt=getattr(view, "kubevirt", lambda: None))
        if hasattr(view, "add_listener"):  # the KubeVirt CR changed: the mismatch label may have
            view.add_listener(lambda kind, old, new: check.refresh() if kind == KUBEVIRT else None)
        parts.append(check.start())
    return parts
