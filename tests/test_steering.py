"""Rule 10's prediction (app/policy/steering.py) and the snapshot built from Prometheus answers."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.usage import NodeUsage, UsageSnapshot, VMUsage
from app.metricsource.prometheus import build_snapshot, node_of
from app.policy.steering import rank, score, shifted, workers_average
from app.sim.descheduler import node_scores
from tests.builders import GIB, NOW, usage_snapshot

CAP = {"cpu_cores": 64.0, "memory_bytes": 256 * GIB}


def test_score_is_the_profile_rule() -> None:
    # 3 x norm of positive deviations, capped at 1: hot worker of the table rows
    assert score((0.75, 0.55, 0.05, 0.0), (0.6, 0.5, 0.025, 0.0)) == pytest.approx(48.02, abs=0.01)
    assert score((0.5, 0.5, 0, 0), (0.6, 0.5, 0, 0)) == 0.0  # at or below the average: 0
    assert score((1, 1, 1, 1), (0, 0, 0, 0)) == 100.0  # capped


dims = st.tuples(*[st.floats(0, 1)] * 4)


@given(st.lists(dims, min_size=1, max_size=8))
def test_score_agrees_with_the_simulators_rule(nodes) -> None:
    avg = [sum(n[i] for n in nodes) / len(nodes) for i in range(4)]
    assert [int(score(n, avg) + 1e-9) for n in nodes] == node_scores(nodes)


def test_ranking_of_the_table_rows() -> None:
    u = usage_snapshot()
    r = rank(u.nodes, u.averages, "worker-a", u.vms_on("worker-a"))
    assert r is not None and r.target == "worker-b"
    assert [(c.key[1], round(c.gain)) for c in r.candidates] == [("big", 36), ("web", 30), ("db", 11)]
    assert r.hot_score == pytest.approx(48.0, abs=0.1) and r.measured_score == pytest.approx(48.0)


def test_pressure_counts_only_above_70_percent_use() -> None:
    node = NodeUsage(cpu=0.75, memory=0.5, cpu_pressure=0.2, **CAP)
    assert shifted(node, VMUsage("n", 1.0, 0), -1)[2] == 0.2  # 73.4%: measured pressure kept
    assert shifted(node, VMUsage("n", 4.0, 0), -1)[2] == 0.0  # 68.75%: the rule drops it


def test_target_is_the_least_favourable_underutilised_node_not_excluded() -> None:
    # scores 100, 30, 0 (mean 43): b and c are underutilised; the scheduler may place the VM on either
    nodes = {"hot": NodeUsage(0.9, 0.6, **CAP), "b": NodeUsage(0.5, 0.5, **CAP), "c": NodeUsage(0.1, 0.1, **CAP)}
    vms = [(("ns", "v"), VMUsage("hot", 4, GIB))]
    assert rank(nodes, None, "hot", vms).target == "b"
    assert rank(nodes, None, "hot", vms, excluded={"b"}).target == "c"
    assert rank(nodes, None, "hot", vms, excluded={"b", "c"}) is None


def test_the_gain_is_judged_where_the_move_may_land_not_on_the_emptiest_node() -> None:
    # mean CPU 54%: scores hot 94, mid 19, warm 0, idle 0 (mean 28); moving 12 of hot's 64 cores helps hot
    # (to 37.5), but mid, an underutilised node the scheduler may well pick, would rise to 75
    nodes = {"hot": NodeUsage(0.85, 0.5, **CAP), "mid": NodeUsage(0.6, 0.5, **CAP),
             "warm": NodeUsage(0.5, 0.5, **CAP), "idle": NodeUsage(0.2, 0.5, **CAP)}
    r = rank(nodes, None, "hot", [(("ns", "v"), VMUsage("hot", 12, GIB))])
    best = r.best
    assert (r.target, round(r.target_score)) == ("mid", 19), r
    assert (round(best.hot_after), round(best.target_after), round(best.gain)) == (38, 75, 19), best


def test_a_move_that_makes_the_target_the_hottest_has_negative_gain() -> None:
    nodes = {"hot": NodeUsage(0.7, 0.5, **CAP), "cold": NodeUsage(0.6, 0.5, **CAP)}
    r = rank(nodes, None, "hot", [(("ns", "huge"), VMUsage("hot", 32, GIB))])
    assert r.candidates[0].gain < 0  # 50% of a node lands on a node already near the average


def test_no_prediction_without_capacities() -> None:
    nodes = {"hot": NodeUsage(0.9, 0.6), "cold": NodeUsage(0.1, 0.1, **CAP)}
    assert rank(nodes, None, "hot", [(("ns", "v"), VMUsage("hot", 4, GIB))]) is None


def test_workers_average() -> None:
    nodes = {"a": NodeUsage(0.2, 0.4, 0.1, 0), "b": NodeUsage(0.4, 0.6, 0.3, 0)}
    assert workers_average(nodes) == pytest.approx((0.3, 0.5, 0.2, 0.0))


def test_snapshot_age_and_usability() -> None:
    u = usage_snapshot(age=30, max_age=90)
    assert u.age(NOW) == 30 and u.usable(NOW) and not u.usable(NOW + 61)
    assert not UsageSnapshot().usable(NOW)
    assert not UsageSnapshot(taken_at=NOW, nodes=MappingProxyType({})).usable(NOW)


@pytest.mark.parametrize(("labels", "node"), [
    ({"instance": "worker-1"}, "worker-1"), ({"instance": "10.0.0.5:9100"}, "10.0.0.5"),
    ({"instance": "worker-1:9100", "node": "worker-1"}, "worker-1"), ({"instance": "[fd00::1]:9100"}, "[fd00::1]"),
])
def test_node_of(labels, node) -> None:
    assert node_of(labels) == node


def _v(labels: dict, value: float) -> dict:
    return {"metric": labels, "value": [1700000000.0, str(value)]}


def test_build_snapshot_from_query_results() -> None:
    results = {
        "score": [_v({"instance": "a"}, 0.4), _v({"instance": "b"}, 0.0)],
        "score_time": [_v({"instance": "a"}, 1000.0), _v({"instance": "b"}, 990.0)],
        "cpu": [_v({"instance": "a"}, 0.8), _v({"instance": "b"}, 0.4), _v({"instance": "master-0"}, 0.1)],
        "memory": [_v({"instance": "a"}, 0.6), _v({"instance": "b"}, 0.4)],
        "cpu_pressure": [_v({"instance": "a"}, 0.1)],
        "avg_cpu": [_v({}, 0.55)],
        "cpu_cores": [_v({"node": "a"}, 32), _v({"node": "b"}, 32)],
        "memory_bytes": [_v({"node": "a"}, 128 * GIB), _v({"node": "b"}, 128 * GIB)],
        "vm_cpu": [_v({"namespace": "vms", "name": "db", "node": "a"}, 1.5),
                   _v({"namespace": "vms", "name": "nomem", "node": "a"}, 1.0)],
        "vm_memory": [_v({"namespace": "vms", "name": "db", "node": "a"}, 4 * GIB),
                      {"metric": {"namespace": "vms", "name": "bad", "node": "a"}, "value": [0, "NaN"]}],
    }
    snap = build_snapshot(results, taken_at=2000.0, max_age=90)
    assert sorted(snap.nodes) == ["a", "b"]  # master-0 has no score: not a node the descheduler considers
    assert snap.nodes["a"].cpu_pressure == 0.1 and snap.nodes["b"].cpu_pressure == 0.0
    assert snap.averages == pytest.approx((0.55, 0.5, 0.05, 0.0))  # use average from the rule, pressure the mean
    assert snap.taken_at == 990.0  # the oldest score sample
    assert dict(snap.vms) == {("vms", "db"): VMUsage("a", 1.5, 4 * GIB)}


def test_the_token_is_sent_and_read_again_every_round(tmp_path) -> None:
    """A stand-in for thanos-querier's auth proxy on 127.0.0.1: 401 unless the bearer token is the current one."""
    import json
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from app.metricsource.prometheus import PrometheusSource
    from app.transport.tls import issue_certs, write_certs

    seen: list[str] = []
    valid = {"token": "first"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            auth = self.headers.get("Authorization", "")
            seen.append(auth)
            ok = auth == f"Bearer {valid['token']}"
            body = {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"instance": "a"}, "value": [0, "0.5"]}]}} if ok else {"status": "error"}
            data = json.dumps(body).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    certs = write_certs(issue_certs("prometheus", "monitoring"), tmp_path / "certs")  # a token goes over https only
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certs["cert"], certs["key"])
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("first\n")
    source = PrometheusSource(f"https://127.0.0.1:{server.server_port}", token_file=str(token),
                              ca_file=str(certs["ca"]), clock=lambda: 1000.0)
    try:
        source.poll_once()
        assert source.current().error == "" and seen[-1] == "Bearer first"
        valid["token"] = "second"  # the token rotates: the old one is refused
        source.poll_once()
        assert "answered 401" in source.current().error
        token.write_text("second")
        source.poll_once()
        assert source.current().error == "" and seen[-1] == "Bearer second"
    finally:
        source.stop()
        server.shutdown()

