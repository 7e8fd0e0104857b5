"""The guard's own HTTP/1.1 protocol (app/transport/http.py) against clients that split, pipeline, linger and
bend the RFCs: the real ``serve`` over TLS and its plain metrics port (bench/attacks.py), and the protocol in
process under hypothesis-generated request streams cut at arbitrary read boundaries."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.transport.http import Connection, HttpLimits, Listener
from bench.attacks import (
    Guard,
    Memory,
    Prober,
    answers,
    close_notify_after_request,
    closing_linger,
    conformance,
    connect,
    pipelined_pair,
    split_head,
    tiny_chunks,
    wait_closed,
)
from tests.guard_process import ROOT


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    g = Guard(ROOT, tmp_path_factory.mktemp("protocol"))
    yield g
    g.stop()


@pytest.mark.parametrize("port", ["https", "metrics"])
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bodies_in_two_byte_chunks_cost_their_length_not_an_object_a_chunk(guard, port) -> None:
    prober = Prober(guard)
    with Memory(guard.proc.pid) as mem, prober.running():
        outcome = tiny_chunks(guard, 150, port=None if port == "https" else guard.metrics_port)
    assert outcome["refused"] == 0, outcome  # taken, as the RFC allows: the cost is what is bounded
    assert mem.growth_mib < 64, (mem.growth_mib, outcome)
    # every probe answered (how fast is make reliability's figure, not a test's: the machine may be busy)
    assert prober.answered == prober.asked > 0, (prober.answered, prober.asked, prober.worst)


@pytest.mark.slow
def test_a_second_head_over_the_budget_is_refused_when_it_begins_in_the_read_of_the_first_request(guard) -> None:
    got = split_head(guard)["answers"]
    # the first request is answered; the second never is (a 431, or the connection cut before it was read)
    assert got[:1] == ["HTTP/1.1 200 OK"] and got[1:] in ([], ["HTTP/1.1 431 Request Header Fields Too Large"]), got


@pytest.mark.slow
def test_a_pipelined_pair_whose_first_body_spans_two_reads_gets_two_answers(guard) -> None:
    got = pipelined_pair(guard)["answers"]
    assert got == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"], got


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_closing_answer_whose_client_never_sends_close_notify_is_cut_within_seconds(guard) -> None:
    outcome = closing_linger(guard, 20, within=20.0)
    # the linger is 1 s; the TLS layer's own shutdown timeout (30 s) is what used to hold them
    assert outcome["still_open"] == 0 and outcome["last_closed_s"] < 10, outcome


@pytest.mark.slow
def test_an_http_1_0_answer_is_followed_by_a_close_within_seconds(guard) -> None:
    s = connect(guard, timeout=10)
    s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    raw = socket.socket(fileno=s.detach())  # the TCP stream: the client never answers close_notify
    [closed_after] = wait_closed([raw], 20.0)
    raw.close()
    assert closed_after is not None and closed_after < 10, closed_after


@pytest.mark.slow
def test_a_request_followed_at_once_by_close_notify_or_a_half_close_is_answered(guard) -> None:
    outcome = close_notify_after_request(guard, 5)
    assert outcome["tls_answered"] == outcome["plain_answered"] == 5, outcome


@pytest.mark.slow
def test_request_targets_versions_and_expect_follow_rfc_9112_and_9110_and_nothing_redirects(guard) -> None:
    got = conformance(guard)
    assert got["http_0_9"].startswith("HTTP/1.1 505"), got
    assert got["http_1_0_expect_continue"] == "nothing", got  # RFC 9110 10.1.1: never 100 to HTTP/1.0
    assert got["absolute_form_same_host"] == "HTTP/1.1 200 OK", got
    assert got["absolute_form_other_host"].startswith("HTTP/1.1 400"), got
    assert got["slash_path_forged_host"].startswith("HTTP/1.1 404") and "location" not in got["slash_path_forged_host"].lower(), got


@pytest.mark.slow
def test_http_1_1_with_a_body_to_come_gets_100_continue_and_a_request_without_host_400(guard) -> None:
    s = connect(guard, timeout=5)
    s.sendall(b"POST /validate HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
              b"Content-Length: 2\r\n\r\n")
    assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    s.close()
    s = connect(guard, timeout=5)
    s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    got = answers(s, 5.0)
    assert got == ["HTTP/1.1 400 Bad Request"], got


# ---- in process: the protocol under generated request streams -----------------------------------------------


class Wire:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closing = True

    abort = close

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None


LIMITS = HttpLimits(max_header_bytes=2048, max_headers=16, max_body_bytes=4096)


def serve_stream(stream: bytes, cuts: list[int]) -> tuple[list[tuple[str, str, bytes]], bytes]:
    """Feed ``stream`` to one connection in reads cut at ``cuts``: (what the app was asked, what was written)."""
    seen: list[tuple[str, str, bytes]] = []

    async def app(scope, receive, send) -> None:
        body = (await receive())["body"]
        seen.append((scope["method"], scope["path"], body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % len(body)})

    async def run() -> bytes:
        conn = Connection(Listener(app, LIMITS))
        wire = Wire()
        conn.connection_made(wire)  # type: ignore[arg-type]
        edges = [0, *sorted(set(cuts)), len(stream)]
        for a, b in itertools.pairwise(edges):
            if a < b and not wire.closing:
                conn.data_received(stream[a:b])
            for _ in range(20):  # whatever the connection left to tasks runs before the next read
                await asyncio.sleep(0)
        conn.connection_lost(None)
        return bytes(wire.out)

    return seen, asyncio.run(run())


header = st.tuples(st.text("abcdefgh-", min_size=1, max_size=12), st.text("xyz 0123", max_size=40))
request_st = st.tuples(
    st.sampled_from(["GET", "POST"]), st.text("abcxyz/", max_size=20), st.lists(header, max_size=8),
    st.binary(max_size=3000), st.booleans(), st.lists(st.integers(1, 700), max_size=6))


def encode(method: str, path: str, headers, body: bytes, chunked: bool, sizes: list[int]) -> bytes:
    head = f"{method} /{path} HTTP/1.1\r\nHost: g\r\n" + "".join(f"x-{n}: {v.strip()}\r\n" for n, v in headers)
    if method == "GET":
        return (head + "\r\n").encode()
    if not chunked:
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    out, i = [(head + "Transfer-Encoding: chunked\r\n\r\n").encode()], 0
    for size in [*sizes, len(body)]:
        part = body[i:i + size]
        if part:
            out.append(b"%x\r\n%s\r\n" % (len(part), part))
        i += len(part)
    return b"".join(out) + b"0\r\n\r\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(request_st, min_size=1, max_size=5), cuts=st.lists(st.integers(0, 40_000), max_size=12))
def test_pipelined_requests_are_answered_in_order_however_reads_split_them(requests, cuts) -> None:
    stream = b"".join(encode(*r) for r in requests)
    seen, out = serve_stream(stream, cuts)
    want = [(m, "/" + p, b"" if m == "GET" else body) for m, p, _, body, _, _ in requests]
    assert seen == want, (seen, want)
    assert out.count(b"HTTP/1.1 200 OK") == len(requests), out


@settings(max_examples=200, deadline=None)
@given(pad=st.integers(1500, 2600), before=st.integers(0, 2), cuts=st.lists(st.integers(0, 8000), max_size=6))
def test_a_head_is_charged_its_own_bytes_whatever_comes_before_it_in_the_same_read(pad, before, cuts) -> None:
    """Each request's head against the 2 KiB budget, with 0-2 small requests before it in the stream."""
    small = b"GET /a HTTP/1.1\r\nHost: g\r\n\r\n"
    big = b"GET /big HTTP/1.1\r\nHost: g\r\nx-pad: " + b"p" * pad + b"\r\n\r\n"
    seen, out = serve_stream(small * before + big, cuts)
    fits = len(big) <= LIMITS.max_header_bytes
    assert [p for _, p, _ in seen] == ["/a"] * before + (["/big"] if fits else []), (len(big), seen)
    assert (b"431" in out) is not fits, (len(big), out[-200:])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=8))
def test_arbitrary_bytes_get_answers_or_refusals_never_an_error(data, cuts) -> None:
    seen, out = serve_stream(b"POST / HTTP/1.1\r\nHost: g\r\nContent-Length: 3\r\n\r\nabc" + data, cuts)
    assert seen[:1] == [("POST", "/", b"abc")], seen
    statuses = out.split(b"\r\n")[0]
    assert statuses == b"HTTP/1.1 200 OK", out[:200]


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_a_chunked_body_is_taken_up_to_the_limit_and_not_a_byte_more(chunk) -> None:
    def chunked(size: int) -> bytes:
        body = b"x" * size
        parts = [b"%x\r\n%s\r\n" % (len(body[i:i + chunk]), body[i:i + chunk]) for i in range(0, size, chunk)]
        return b"POST /v HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(parts) + b"0\r\n\r\n"

    limits = HttpLimits(max_body_bytes=1000, max_header_bytes=16 * 1024)
    global LIMITS
    saved, LIMITS = LIMITS, limits
    try:
        seen, out = serve_stream(chunked(1000), [])
        assert seen == [("POST", "/v", b"x" * 1000)] and out.startswith(b"HTTP/1.1 200"), out[:100]
        seen, out = serve_stream(chunked(1001), [])
        assert seen == [] and out.startswith(b"HTTP/1.1 413"), out[:100]
    finally:
        LIMITS = saved
