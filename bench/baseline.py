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
from app.admission.server import ADMISSION_PATHS, GuardContext
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


def raw_app(_ctx: GuardContext | None = None, **_options):
    """The floor: the same constant answer from a bare ASGI callable on the guard's own server, i.e. the server
    and TLS with no request path and no work in it (everything else goes to ``bare_app``)."""
    rest = bare_app()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(ALLOWED)).encode())]

    async def app(scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ADMISSION_PATHS:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": ALLOWED})
            return
        await rest(scope, receive, send)

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
