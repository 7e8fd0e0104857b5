"""The bare ASGI admission endpoint in front of FastAPI (app/admission/asgi.py)."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from app.admission.asgi import AdmissionEndpoint
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
        async with client(max_body_bytes=1000) as c:
            wrong_type = await c.post("/validate", content=PLAIN, headers={"Content-Type": "text/plain"})
            no_type = await c.post("/validate", content=PLAIN)
            too_big = await c.post("/validate", content=b"{" + b" " * 2000 + b"}", headers=JSON)
            not_json = await c.post("/mutate", content=b"{nope", headers=JSON)
            get = await c.get("/mutate")
            metrics = await c.get("/metrics")
            return wrong_type, no_type, too_big, not_json, get, metrics

    wrong_type, no_type, too_big, not_json, get, metrics = run(go())
    assert (wrong_type.status_code, no_type.status_code, too_big.status_code, not_json.status_code) == (400, 400, 413, 400)
    assert "text/plain" in wrong_type.json()["error"] and "none" in no_type.json()["error"]
    assert too_big.json() == {"error": "request body larger than 1000 bytes", "code": 413}
    assert "not valid JSON" in not_json.json()["error"]
    assert get.status_code == 405 and get.json()["code"] == 405  # other methods still go through FastAPI
    text = metrics.text
    assert 'kubevirt_eviction_guard_bad_requests_total{code="400"} 3.0' in text
    assert 'kubevirt_eviction_guard_bad_requests_total{code="413"} 1.0' in text


def test_the_routing_table_still_lists_the_admission_routes() -> None:
    app = create_app(GuardContext(view=ClusterStore(), settings=PolicySettings()))
    paths = {getattr(r, "path", None): getattr(r, "methods", None) for r in app.router.routes}
    assert paths["/mutate"] == {"POST"} and paths["/validate"] == {"POST"}


class Recorder:
    def __init__(self, messages: list[dict]) -> None:
        self.incoming = list(messages)
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        return self.incoming.pop(0) if self.incoming else {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)


def endpoint(limit: int, seen: list) -> AdmissionEndpoint:
    def answer(ctype: str, body: bytes | None, started: float) -> tuple[int, bytes]:
        seen.append((ctype, body))
        return (413, b"{}") if body is None else (200, b'{"ok":true}')

    return AdmissionEndpoint(answer, limit)


def scope(headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "method": "POST", "path": "/validate", "headers": headers}


def test_a_body_in_several_chunks_is_joined_and_bounded() -> None:
    seen: list = []
    ok = Recorder([{"type": "http.request", "body": b"ab", "more_body": True},
                   {"type": "http.request", "body": b"cd", "more_body": False}])
    run(endpoint(10, seen)(scope([(b"content-type", b"application/json")]), ok.receive, ok.send))
    over = Recorder([{"type": "http.request", "body": b"abcdef", "more_body": True},
                     {"type": "http.request", "body": b"ghijkl", "more_body": True}])
    run(endpoint(10, seen)(scope([]), over.receive, over.send))  # no content-length: counted as it streams
    assert seen == [("application/json", b"abcd"), ("", None)]
    assert ok.sent[0]["status"] == 200 and ok.sent[1]["body"] == b'{"ok":true}'
    assert over.sent[0]["status"] == 413
    assert len(over.incoming) == 0  # stopped reading at the limit: nothing more was asked for after it


def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    seen: list = []
    r = Recorder([{"type": "http.request", "body": b"x" * 50, "more_body": False}])
    run(endpoint(10, seen)(scope([(b"content-length", b"50")]), r.receive, r.send))
    assert seen == [("", None)] and len(r.incoming) == 1


def test_a_client_that_went_away_gets_no_answer_and_no_error() -> None:
    seen: list = []
    r = Recorder([{"type": "http.disconnect"}])
    run(endpoint(10, seen)(scope([]), r.receive, r.send))
    assert seen == [] and r.sent == []


def test_an_unexpected_failure_is_a_json_500_not_a_crash() -> None:
    def broken(ctype, body, started):
        raise RuntimeError("bug")

    r = Recorder([{"type": "http.request", "body": b"{}", "more_body": False}])
    run(AdmissionEndpoint(broken, 100)(scope([]), r.receive, r.send))
    assert r.sent[0]["status"] == 500 and orjson.loads(r.sent[1]["body"])["code"] == 500


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


def sent_without_length(endpoint: AdmissionEndpoint, chunks: list[bytes]) -> int:
    """The status ``endpoint`` answers a body sent in ``chunks`` without a Content-Length header (chunked)."""
    scope = {"type": "http", "method": "POST", "path": "/validate", "headers": [(b"content-type", b"application/json")]}
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(endpoint(scope, receive, send))
    return sent[0]["status"]


@pytest.mark.parametrize("split", [1, 3], ids=["one message", "three chunks"])
def test_a_body_without_a_length_is_taken_up_to_the_limit_and_not_a_byte_more(split) -> None:
    limit = 1000
    endpoint = AdmissionEndpoint(lambda ctype, body, started: (413, b"") if body is None else (200, b"{}"), limit)

    def chunks(size: int) -> list[bytes]:
        body, step = b"x" * size, -(-size // split)
        return [body[i:i + step] for i in range(0, size, step)]

    assert sent_without_length(endpoint, chunks(limit)) == 200
    assert sent_without_length(endpoint, chunks(limit + 1)) == 413
