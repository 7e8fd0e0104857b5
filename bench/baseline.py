"""The baseline: the guard's own ``serve`` command with the guard taken out.

Same process start-up, same server settings, same TLS context, same logging
set-up, because it *is* ``app.serve.serve``; only the context (no cluster state)
and the app differ: a bare FastAPI route that answers every POST with one
constant "allowed" AdmissionReview, without reading or parsing the body. What
the guard costs beyond this is what the guard itself does.

The constant answer carries the uid ``baseline``, so the bench can check that it
is really talking to the baseline (should ``serve`` ever stop building its app
through ``create_app``, this substitution would silently stop working).

    python -m bench.baseline [the command line of python -m app serve, --snapshot ignored]
    python -m bench.floor    [same]: the floor, see ``raw_app``
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import orjson
from fastapi import FastAPI
from fastapi.responses import Response

import app.serve as serve_module
from app.admission.asgi import AdmissionEndpoint, GuardApp
from app.admission.server import GuardContext
from app.cli import build_parser
from app.cluster.store import ClusterStore
from app.logs import configure
from app.policy.model import PolicySettings

ALLOWED = orjson.dumps(
    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "baseline", "allowed": True}}
)


def bare_app(_ctx: GuardContext | None = None, **_options) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    async def admit() -> Response:
        return Response(ALLOWED, media_type="application/json")

    app.add_api_route("/mutate", admit, methods=["POST"])
    app.add_api_route("/validate", admit, methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return app


def empty_context(_args, _cluster=None) -> GuardContext:
    return GuardContext(view=ClusterStore(), settings=PolicySettings())


def raw_app(_ctx: GuardContext | None = None, **_options) -> FastAPI:
    """The floor: the same constant answer from the guard's own bare ASGI endpoint
    (``app.admission.asgi``), i.e. the guard's server + TLS + its request path with no
    work in it. What is left between this and the guard is the guard's own work."""
    app = GuardApp(docs_url=None, redoc_url=None, openapi_url=None)
    app.serve_admission(AdmissionEndpoint(lambda ctype, body, started: (200, ALLOWED), 1 << 20))

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return app


def main(argv: Sequence[str] | None = None, app_factory=bare_app) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "serve":
        raise SystemExit("python -m bench.baseline: only the serve command has a baseline")
    configure(args.log_format, args.log_level)
    serve_module.build_context = empty_context
    serve_module.create_app = app_factory
    return serve_module.serve(args)


if __name__ == "__main__":
    sys.exit(main())
