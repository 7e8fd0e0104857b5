"""The plain baseline: what a user would compare the guard against.

A FastAPI app with one plain route, served by plain uvicorn with its default settings and nothing of the guard's:

    python -m uvicorn bench.plain:app --host 127.0.0.1 --port PORT --ssl-keyfile KEY --ssl-certfile CERT

(defaults: uvloop and httptools when installed, as here; access log on, at info). It does what a webhook written
the plain way does with each review, short of the policy: ``await request.json()``, the uid, and an
AdmissionReview answer built and serialised per request. The answer itself is the guard's to the same review
(allowed or refused, with its status and message, so that the bytes out match the guard's per mix), looked up by
uid in ``BENCH_ANSWERS`` (a JSON object uid -> response, written by ``bench.decide --answers``); a review not in it
is answered allowed. The healthz route answers ``{"status":"ok"}``.
"""

from __future__ import annotations

import json
import os

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

ANSWERS: dict[str, dict] = {}
if os.environ.get("BENCH_ANSWERS"):
    with open(os.environ["BENCH_ANSWERS"], "rb") as f:
        ANSWERS = json.load(f)
ALLOWED = {"allowed": True}

app = FastAPI()


@app.post("/mutate")
@app.post("/validate")
async def admit(request: Request) -> Response:
    review = await request.json()
    uid = review["request"]["uid"]
    response = {"uid": uid, **ANSWERS.get(uid, ALLOWED)}
    return JSONResponse({"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
                         "response": response})


@app.get("/healthz")
async def healthz() -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")
