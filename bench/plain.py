"""The plain baseline: what a user would compare the guard against.

A FastAPI app with one plain route (``await request.body()``, one constant
"allowed" AdmissionReview as the answer), served by plain uvicorn with its
default settings and nothing of the guard's:

    python -m uvicorn bench.plain:app --host 127.0.0.1 --port PORT --ssl-keyfile KEY --ssl-certfile CERT

(defaults: uvloop and httptools when installed, as here; access log on, at info). The constant answer carries
the uid ``baseline`` so the bench can check it is talking to this server.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

ALLOWED = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"baseline","allowed":true}}'

app = FastAPI()


@app.post("/mutate")
@app.post("/validate")
async def admit(request: Request) -> Response:
    await request.body()
    return Response(ALLOWED, media_type="application/json")


@app.get("/healthz")
async def healthz() -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")
