"""Property-based fuzzing of the admission endpoint and the snapshot loader.

Whatever a client sends, the answer is a well-formed AdmissionReview (200) or a
4xx with a JSON error body: never a 500, never an exception out of the app.
The in-process ASGI app takes the volume (hundreds of examples); a sample of the
nastiest bodies then goes to the real TLS server, which must stay up.
"""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from app.admission.server import GuardContext, create_app
from app.cluster.snapshot import SnapshotError, load_snapshot
from app.policy import PolicySettings
from tests.builders import FIXTURES, NOW, mstate, node, pod, store_of, vmi

REVIEWS = [json.loads(p.read_text()) for p in sorted((FIXTURES / "admission").glob("*.json"))]
STORE = store_of(node("worker-a"), vmi("desched", "worker-a", migration=mstate("m", "b", "worker-a", 7, 5)),
                 pod("desched", "worker-a", name="virt-launcher-desched"))

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=50), st.text(alphabet=string.digits, min_size=1, max_size=5),  # numbers as strings
    st.just("x" * 100_000), st.text(alphabet="\u202e\u0000\ud7ff\U0001f600é漢", max_size=20),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                  st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                           max_leaves=20)
PATHS = [
    ("apiVersion",), ("kind",), ("request",), ("request", "uid"), ("request", "name"), ("request", "namespace"),
    ("request", "operation"), ("request", "resource"), ("request", "resource", "resource"), ("request", "subResource"),
    ("request", "dryRun"), ("request", "options"), ("request", "options", "dryRun"), ("request", "userInfo"),
    ("request", "userInfo", "username"), ("request", "object"), ("request", "object", "metadata"),
    ("request", "object", "metadata", "annotations"), ("request", "object", "metadata", "annotations", "requested-by"),
    ("request", "object", "deleteOptions"), ("request", "object", "deleteOptions", "dryRun"),
]


def mutate(doc: dict, path: tuple, value) -> dict:
    cur = doc
    for key in path[:-1]:
        if not isinstance(cur.get(key), dict):
            cur[key] = {}
        cur = cur[key]
    if value is DELETE:
        cur.pop(path[-1], None)
    else:
        cur[path[-1]] = value
    return doc


DELETE = object()
mutations = st.lists(st.tuples(st.sampled_from(PATHS), st.one_of(st.just(DELETE), json_values)), min_size=1, max_size=4)


@pytest.fixture(scope="module")
def client():
    ctx = GuardContext(view=STORE, settings=PolicySettings(), clock=lambda: NOW)
    with TestClient(create_app(ctx), raise_server_exceptions=True) as c:
        yield c


def check(r) -> None:
    assert r.status_code in (200, 400, 413), r.text[:300]
    body = r.json()
    if r.status_code == 200:
        assert body["kind"] == "AdmissionReview" and isinstance(body["response"]["uid"], str)
        assert isinstance(body["response"]["allowed"], bool)
        assert "retryAfterSeconds" not in r.text
    else:
        assert isinstance(body["error"], str)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(base=st.sampled_from(REVIEWS), changes=mutations)
def test_mutated_reviews(client, base, changes) -> None:
    doc = json.loads(json.dumps(base))
    for path, value in changes:
        mutate(doc, path, value)
    check(client.post("/mutate", content=json.dumps(doc), headers={"Content-Type": "application/json"}))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode())))
def test_arbitrary_bodies(client, body) -> None:
    check(client.post("/validate", content=body, headers={"Content-Type": "application/json"}))


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,  # deep nesting
    b'{"request": ' * 5000 + b"1" + b"}" * 5000,
    b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"a","uid":"b","name":"x","name":7}}',
    b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"\xff\xfe"}}',  # invalid UTF-8
    b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"\\ud800"}}',  # lone surrogate
    b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"1e999"}}',
    b"\x00" * 1000,
])
def test_nasty_bodies(client, body) -> None:
    check(client.post("/mutate", content=body, headers={"Content-Type": "application/json"}))


def test_duplicate_keys_last_wins_and_uid_is_echoed(client) -> None:
    body = (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"first","uid":"second",'
            b'"operation":"CREATE","resource":{"resource":"pods"},"subResource":"eviction","namespace":"vms","name":"nope"}}')
    r = client.post("/mutate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["response"]["uid"] == "second"


# ---- snapshot loader -----------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=400), json_values.map(lambda v: json.dumps(v).encode()),
                      st.lists(st.sampled_from([b"kind: List\n", b"items:\n", b"- kind: Pod\n", b"  metadata: {name: a}\n",
                                                b"---\n", b"  spec: [\n", b"- *x\n", b"- &x [1]\n", b"  - kind: Node\n",
                                                b"    metadata: {name: 5}\n", b"{", b"- !!python/object:os.system x\n"]),
                               max_size=12).map(b"".join)))
def test_snapshot_loader_never_crashes(tmp_path_factory, data) -> None:
    f = tmp_path_factory.mktemp("snap") / "dump.yaml"
    f.write_bytes(data)
    try:
        store, stats = load_snapshot(f)
    except SnapshotError as e:
        assert str(f) in str(e)
    else:
        assert sum(stats.loaded.values()) == sum(store.counts().values())


def test_deeply_nested_snapshot_is_a_clear_error(tmp_path) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(SnapshotError, match=str(f)):
        load_snapshot(f)
