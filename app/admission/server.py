"""The FastAPI app: /mutate, /validate, /healthz, /readyz, and /metrics where asked for.

``admit`` takes the raw body (read whole, within the body limit, by the HTTP server: ``app.transport.http``),
decodes it with ``review.decode``, asks ``policy.decide`` and returns the answer; everything else a decision
causes (log line, metrics, Events, the annotation) goes to ``on_decision``,
which must not block: side effects are queued, never run on the request path. ``GuardApp`` hands POST /mutate
and /validate to ``AdmissionEndpoint`` ahead of FastAPI's request path; FastAPI's route for them is the same endpoint.

One answer waits on the API server: an allow that `node_busy` found room for is decided again over the node's VMIs
read fresh (``fresh_view``; ``app.cluster.fresh`` says why), in a thread, so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from app.admission import review as rv
from app.admission.reads import ReadRefused, SharedReads
from app.domain.usage import UsageSnapshot
from app.domain.view import HEALTHY, CacheHealth, ClusterView
from app.effects import Effects
from app.metrics import Metrics
from app.metricsource.steering import Steering
from app.policy import decide
from app.policy.model import Decision, PolicySettings, Reason

log = logging.getLogger("kubevirt_eviction_guard.admission")
JSON = "application/json"
ADMISSION_PATHS = frozenset({"/mutate", "/validate"})
INTERNAL_ERROR = b'{"error":"internal error in the admission endpoint","code":500}'


@dataclass
class GuardContext:
    """Everything the HTTP layer needs, passed in (the CLI wires it)."""

    view: ClusterView
    settings: PolicySettings
    health: Callable[[float], CacheHealth] = lambda now: HEALTHY
    readiness_detail: Callable[[], dict] = dict  # per-kind "why not ready", for /readyz
    clock: Callable[[], float] = time.time
    metrics: Metrics = field(default_factory=Metrics)
    on_decision: Callable[[rv.Review, Decision], None] | None = None
    effects: Effects | None = None  # started and stopped with the server
    shutting_down: bool = False
    # steering: the latest Prometheus snapshot; None turns the rule off
    usage: Callable[[], UsageSnapshot | None] = lambda: None
    usage_source: Steering | None = None  # where ``usage`` comes from: started and stopped with the server
    # `node_busy` read again before an allow (blocking; None in snapshot mode): node -> the view with its VMIs fresh
    fresh_view: Callable[[str], ClusterView] | None = None
    fresh_view_timeout: float = 2.0
    fresh_reads_per_second: float = 20.0  # reads before an allow, all nodes together (cluster.fresh.SharedReads)
    # time.monotonic() of the HTTPS port's event loop's last heartbeat (transport.listeners.GuardServer); None: not beating
    webhook_beat: float | None = None
    stalled_after: float = 5.0  # seconds without a heartbeat after which /healthz and /readyz fail


def stalled(ctx: GuardContext) -> float | None:
    """Seconds since the HTTPS loop last beat, when that is past ``stalled_after`` (else None). Probes answered on
    that loop itself cannot see it stalled (they are simply not answered); probes on the metrics port's own loop
    can, through this."""
    beat = ctx.webhook_beat
    if beat is None:
        return None
    quiet = time.monotonic() - beat
    return quiet if quiet > ctx.stalled_after else None


class AdmissionEndpoint:
    """POST /mutate and /validate as a bare ASGI app. The HTTP server delivers the body whole, in one message,
    within its limit."""

    def __init__(self, admit: Callable) -> None:
        self.admit = admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        ctype = ""
        for name, value in scope["headers"]:
            if name == b"content-type":
                ctype = value.decode("latin-1")
                break
        body = (await receive()).get("body", b"")
        try:
            answer = self.admit(ctype, body, started)
            status, payload = await answer if inspect.isawaitable(answer) else answer
        except Exception:  # admit() fails open on policy errors; anything else is a bug: say so, in JSON
            log.exception("admission endpoint failed")
            status, payload = 500, INTERNAL_ERROR
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]})
        await send({"type": "http.response.body", "body": payload})


class GuardApp(FastAPI):
    """FastAPI, with POST /mutate and /validate handed straight to their endpoint: its request path (middleware,
    routing, Request and Response objects) costs about as much as the answer. Everything else goes through it."""

    admission: AdmissionEndpoint | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.admission is not None and scope["type"] == "http" and scope["method"] == "POST" \
                and scope["path"] in ADMISSION_PATHS:
            await self.admission(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _json(status: int, payload: dict) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type=JSON)


def create_app(ctx: GuardContext, metrics_route: bool = True) -> GuardApp:
    """``metrics_route``: serve /metrics here. ``serve`` turns it off on the HTTPS port when there is a metrics
    port: the chart's NetworkPolicy admits monitoring to the metrics port only and everyone to the webhook port, so
    the metrics (nodes, namespaces, decisions) must not be one port away from everyone."""
    # no redirects: a slash-ended path is a 404, never a Location built from the client's Host header
    app = GuardApp(title="kubevirt-eviction-guard", docs_url=None, redoc_url=None, openapi_url=None,
                   redirect_slashes=False)
    app.state.guard = ctx
    metrics = ctx.metrics

    def error(status: int, message: str) -> tuple[int, bytes]:
        metrics.bad_requests_by(str(status)).inc()
        return status, rv.errored(status, message)

    def admit(ctype: str, body: bytes, started: float):
        """The answer to one POST: (status, JSON body), or a coroutine that gives it when the answer needs the
        API server."""
        if ctype.split(";", 1)[0].strip().lower() != JSON:
            return error(400, f"content type must be {JSON}, got {ctype or 'none'!r}")
        try:
            review = rv.decode(body)
        except rv.BadReview as e:
            return error(e.status, e.message)
        now = ctx.clock()
        decision = judge(review, ctx.view, now)
        if decision.allowed and decision.budget_node and ctx.fresh_view is not None:
            return confirmed(review, decision, now, started)
        return finish(review, decision, started)

    def judge(review: rv.Review, view: ClusterView, now: float) -> Decision:
        try:
            return decide(review.eviction, view, now, ctx.settings, ctx.health(now), ctx.usage())
        except Exception:  # a bug must not block evictions: fail open, loudly
            log.exception("policy failed; allowing", extra={"uid": review.uid})
            return Decision(allowed=True, reason="internal_error", message="guard error; failing open")

    reads = SharedReads(ctx.fresh_view, ctx.fresh_reads_per_second, ctx.fresh_reads_per_second) \
        if ctx.fresh_view is not None else None
    refused_logged = [float("-inf")]

    async def confirmed(review: rv.Review, decision: Decision, now: float, started: float) -> tuple[int, bytes]:
        """`node_busy` again over the node's VMIs as the API server has them now (a mark the watch has not brought yet)."""
        node = decision.budget_node
        try:
            fresh = await asyncio.wait_for(asyncio.shield(reads.view_of(node)), ctx.fresh_view_timeout)  # type: ignore[union-attr,arg-type]
        except ReadRefused as e:  # past the bound: fail open, counted, a warning at most every 10 s
            metrics.leaver_reads_by("over_budget").inc()
            if time.monotonic() - refused_logged[0] > 10:
                refused_logged[0] = time.monotonic()
                log.warning("not reading the VMIs of node %s again before allowing (%s); the cached answer stands",
                            node, e, extra={"uid": review.uid})
            return finish(review, decision, started)
        except Exception as e:  # the store's answer stands: fail open, and say so
            metrics.leaver_reads_by("failed").inc()
            why = f"no answer within {ctx.fresh_view_timeout:g}s" if isinstance(e, TimeoutError) else f"{e}"[:200]
            log.warning("could not read the VMIs of node %s again before allowing (%s); the cached answer stands",
                        node, why or type(e).__name__, extra={"uid": review.uid})
            return finish(review, decision, started)
        again = judge(review, fresh, now)
        changed = again.allowed != decision.allowed or again.reason != decision.reason
        metrics.leaver_reads_by("changed" if changed else "same").inc()
        return finish(review, again, started)

    def finish(review: rv.Review, decision: Decision, started: float) -> tuple[int, bytes]:
        out = rv.respond(review, decision)
        metrics.decisions_by("allowed" if decision.allowed else "denied", decision.reason).inc()
        if decision.denied:
            metrics.blocks_by(decision.reason, decision.node, review.eviction.namespace).inc()
        if decision.reason == Reason.COOLDOWN and decision.cooldown is not None:  # blocks only, as the plugin
            metrics.effective_cooldown.observe(decision.cooldown.cooldown)  # type: ignore[attr-defined]
        if ctx.on_decision is not None:
            try:
                ctx.on_decision(review, decision)
            except Exception:
                log.exception("decision hook failed", extra={"uid": review.uid})
        metrics.admission_duration.observe(time.perf_counter() - started)
        return 200, out

    app.admission = AdmissionEndpoint(admit)
    for path in sorted(ADMISSION_PATHS):  # the same endpoint as FastAPI's route: the routing table tells the truth
        app.router.add_route(path, app.admission, methods=["POST"], include_in_schema=False)

    @app.get("/healthz")
    async def healthz() -> Response:
        quiet = stalled(ctx)
        if quiet is not None:
            return _json(503, {"status": "webhook port stalled", "seconds": round(quiet, 1)})
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if ctx.shutting_down:
            return _json(503, {"ready": False, "reason": "shutting down"})
        quiet = stalled(ctx)
        if quiet is not None:
            return _json(503, {"ready": False, "reason": f"webhook port stalled for {quiet:.1f}s"})
        health = ctx.health(ctx.clock())
        if health.ready:
            return _json(200, {"ready": True, "stale": sorted(health.stale)})
        detail = ctx.readiness_detail()
        return _json(503, {"ready": False, "notSynced": {k: detail.get(k, "not listed yet") for k in sorted(health.not_synced)}})

    if metrics_route:
        @app.get("/metrics")
        async def metrics_endpoint() -> Response:
            body, ctype = metrics.render()
            return Response(body, media_type=ctype)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> Response:
        return _json(404, {"error": f"no such endpoint: {request.method} {request.url.path}", "code": 404})

    @app.exception_handler(405)
    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _json(405, {"error": f"method {request.method} not allowed on {request.url.path}", "code": 405})

    return app

