"""The admission routes, /mutate and /validate: answered ahead of FastAPI's request path (app/admission/server.py)."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from fastapi import FastAPI

from app.admission.server import GuardContext, create_app
from app.cluster.store import ClusterStore
from app.policy.model import PolicySettings
from tests.builders import FIXTURES

PLAIN = (FIXTURES / "admission" / "eviction-plain.validating.json").read_bytes()
JSON = {"Content-Type": "application/json"}


def client(**kw) -> httpx.AsyncClient:
    app = create_app(GuardContext(view=ClusterStore(), settings=PolicySettings(), **kw))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://guard")


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_answers_an_admission_review_with_its_uid(path: str) -> None:
    async def go():
        async with client() as c:
            return await c.post(path, content=PLAIN, headers=JSON)

    r = run(go())
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["response"]["uid"] == orjson.loads(PLAIN)["request"]["uid"]
    assert body["response"]["allowed"] is True  # the pod is unknown to an empty store
    assert body["response"]["auditAnnotations"]["reason"] == "not_a_vm_pod"
    assert int(r.headers["content-length"]) == len(r.content)


def test_bad_requests_get_json_errors_and_are_counted() -> None:
    async def go():
        async with client() as c:
            wrong_type = await c.post("/validate", content=PLAIN, headers={"Content-Type": "text/plain"})
            no_type = await c.post("/validate", content=PLAIN)
            not_json = await c.post("/mutate", content=b"{nope", headers=JSON)
            get = await c.get("/mutate")
            slash = await c.post("/mutate/", content=PLAIN, headers=JSON)
            metrics = await c.get("/metrics")
            return wrong_type, no_type, not_json, get, slash, metrics

    wrong_type, no_type, not_json, get, slash, metrics = run(go())
    assert (wrong_type.status_code, no_type.status_code, not_json.status_code) == (400, 400, 400)
    assert "text/plain" in wrong_type.json()["error"] and "none" in no_type.json()["error"]
    assert slash.status_code == 404 and "location" not in slash.headers, (slash.status_code, slash.headers)
    assert "not valid JSON" in not_json.json()["error"]
    assert get.status_code == 405 and get.json()["code"] == 405  # other methods still go through FastAPI
    text = metrics.text
    assert 'kubevirt_eviction_guard_bad_requests_total{code="400"} 3.0' in text


def test_the_routing_table_still_lists_the_admission_routes() -> None:
    app = create_app(GuardContext(view=ClusterStore(), settings=PolicySettings()))
    paths = {getattr(r, "path", None): getattr(r, "methods", None) for r in app.router.routes}
    assert paths["/mutate"] == {"POST"} and paths["/validate"] == {"POST"}


class Seen:
    """A middleware: what reached FastAPI's request path."""

    def __init__(self, app, seen: list) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


def test_admission_posts_bypass_fastapi_with_the_routes_answers_and_the_rest_reach_it() -> None:
    app = create_app(GuardContext(view=ClusterStore(), settings=PolicySettings()))
    seen: list = []
    app.add_middleware(Seen, seen=seen)

    async def through_fastapi(scope, receive, send):  # FastAPI's own request path, the guard's front skipped
        await FastAPI.__call__(app, scope, receive, send)

    requests = [("POST", p, body, ctype) for p in ("/mutate", "/validate")
                for body, ctype in ((PLAIN, "application/json"), (b"{nope", "application/json"), (PLAIN, "text/plain"))]

    async def answers(asgi) -> list:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://guard") as c:
            return [await c.request(m, p, content=b, headers={"Content-Type": t}) for m, p, b, t in requests]

    bypassed = run(answers(app))
    assert seen == []
    routed = run(answers(through_fastapi))
    assert seen == [(m, p) for m, p, _, _ in requests]  # the route is there, and is the same endpoint
    assert [(r.status_code, r.headers["content-type"], r.content) for r in bypassed] == \
        [(r.status_code, r.headers["content-type"], r.content) for r in routed]
    assert [r.status_code for r in bypassed] == [200, 400, 400] * 2

    async def others():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://guard") as c:
            return [await c.get("/mutate"), await c.put("/validate", content=PLAIN, headers=JSON),
                    await c.post("/mutate/", content=PLAIN, headers=JSON), await c.post("/healthz"),
                    await c.get("/healthz")]

    seen.clear()
    assert [r.status_code for r in run(others())] == [405, 405, 404, 405, 200]
    assert seen == [("GET", "/mutate"), ("PUT", "/validate"), ("POST", "/mutate/"), ("POST", "/healthz"),
                    ("GET", "/healthz")]


def test_an_unexpected_failure_is_a_json_500_not_a_crash(monkeypatch) -> None:
    def broken(body):
        raise RuntimeError("bug")

    monkeypatch.setattr("app.admission.review.decode", broken)

    async def go():
        async with client() as c:
            return await c.post("/validate", content=PLAIN, headers=JSON)

    r = run(go())
    assert r.status_code == 500 and r.json()["code"] == 500, (r.status_code, r.text)


class BrokenStore(ClusterStore):
    """A bug inside the policy's reading of the state, as it would surface."""

    def pod(self, namespace: str, name: str):
        raise RuntimeError("a bug in the policy")


def test_an_exception_inside_the_policy_fails_open_visibly(caplog) -> None:
    """Fail open, with a reason, a log line and a metric: an eviction is never blocked (nor a 500) by a bug."""
    seen = []
    app = create_app(GuardContext(view=BrokenStore(), settings=PolicySettings(),
                                  on_decision=lambda review, decision: seen.append(decision)))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://guard") as c:
            return [await c.post(path, content=PLAIN, headers=JSON) for path in ("/mutate", "/validate")]

    with caplog.at_level("ERROR", logger="kubevirt_eviction_guard.admission"):
        answers = run(go())
    for r in answers:
        assert r.status_code == 200
        response = r.json()["response"]
        assert response["allowed"] is True and response["auditAnnotations"]["reason"] == "internal_error", response
        assert response["uid"] == orjson.loads(PLAIN)["request"]["uid"]
    assert [d.reason for d in seen] == ["internal_error", "internal_error"] and all(d.allowed for d in seen)
    assert sum("policy failed; allowing" in r.getMessage() for r in caplog.records) == 2
    metrics = app.state.guard.metrics
    assert metrics.registry.get_sample_value("kubevirt_eviction_guard_decisions_total",
                                             {"decision": "allowed", "reason": "internal_error"}) == 2
