"""``serve``: wire settings, cluster state, the app and TLS together, then run uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import logging
import resource
import signal
import threading

import uvicorn

from app.admission.server import GuardContext, create_app, log_decision
from app.cli import UsageError, clock, load_store, policy_settings
from app.admission import protocol
from app.timefmt import parse_duration
from app.tls import server_context

log = logging.getLogger("kubevirt_eviction_guard")


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


def raise_fd_limit() -> None:
    """Every connection is a file descriptor; the usual soft limit of 1024 would let a few
    hundred idle clients starve the API server's requests. Raise it to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


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
    ctx = build_context(args)
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
    log.info("serving", extra={"url": f"https://{args.host}:{args.port}", "settings": repr(ctx.settings)})
    GuardServer(config, ctx, args.shutdown_drain).run()
    return 0
