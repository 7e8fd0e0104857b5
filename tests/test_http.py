"""The real server process over TLS, driven with AdmissionReviews captured from kube-apiserver's dispatcher."""

from __future__ import annotations

import json
import socket
import ssl
import time
import warnings

import httpx
import pytest
import yaml

from tests.builders import FIXTURES, condition, failing_evacuation, mstate, node, pod, ts, vmi, vmim
from tests.guard_process import GuardProcess

ADMISSION = FIXTURES / "admission"
NOW_ARG = "2026-11-21T12:00:00Z"  # builders.NOW
PREFER_NO_EVICTION = "descheduler.alpha.kubernetes.io/prefer-no-eviction"

RECENT = mstate("m-recent", "worker-b", "worker-a", start=7, end=5)
OBJECTS = [
    node("worker-a"), node("worker-b"),
    vmi("plain", "worker-a", migration=RECENT), pod("plain", "worker-a", name="virt-launcher-plain"),
    vmi("desched", "worker-a", migration=RECENT), pod("desched", "worker-a", name="virt-launcher-desched"),
    vmi("dryrun", "worker-b", migration=mstate("m-fly", "worker-b", "worker-a", start=2)),
    pod("dryrun", "worker-b", name="virt-launcher-dryrun"),
    vmi("delopts", "worker-b", evacuation="worker-b"), pod("delopts", "worker-b", name="virt-launcher-delopts-dryrun"),
    vmi("a-evac", "worker-a", migration=RECENT), pod("a-evac", "worker-a", name="virt-launcher-a-evacuate-fake"),
    node("worker-c"), vmi("c-allow", "worker-c"), pod("c-allow", "worker-c", name="virt-launcher-c-allow-fake"),
    vmi("grace", "worker-b", migration=RECENT), pod("grace", "worker-b", name="virt-launcher-grace"),
    vmim("m-recent", "plain", "Succeeded", 8, RECENT),
    vmi("shy", "worker-b", annotations={PREFER_NO_EVICTION: ""}),
    pod("shy", "worker-b", name="virt-launcher-shy", annotations={PREFER_NO_EVICTION: ""}),
    vmi("rested", "worker-c", migration=mstate("m-old", "worker-a", "worker-c", start=40, end=30)),  # cooldown over
    pod("rested", "worker-c", name="virt-launcher-rested"),
    # a descheduler-caused evacuation that failed 3 times (rule 5a), and a VM beside it on its node (rule 8)
    node("worker-d"),
    vmi("stuck", "worker-d", evacuation="worker-d", annotations={"kubevirt.io/eviction-source": "descheduler"}),
    pod("stuck", "worker-d", name="virt-launcher-stuck"), *failing_evacuation("stuck", "worker-d", 3),
    vmi("beside", "worker-d"), pod("beside", "worker-d", name="virt-launcher-beside"),
    # a VM that cannot live-migrate (rule 7n), and one whose migration waits for a backup (rule 6)
    node("worker-e"),
    vmi("pinned-disk", "worker-e", strategy="LiveMigrateIfPossible",
        migratable=("False", "DisksNotLiveMigratable", "cannot migrate VMI: PVC pd is not shared")),
    pod("pinned-disk", "worker-e", name="virt-launcher-pinned-disk"),
    vmi("backed-up", "worker-e", evacuation="worker-e", annotations={"kubevirt.io/eviction-source": "descheduler"}),
    pod("backed-up", "worker-e", name="virt-launcher-backed-up"), *failing_evacuation("backed-up", "worker-e", 3),
    vmim("backed-up-e3", "backed-up", "Pending", 1, evacuation="worker-e", priority="system-maintenance",
         conditions=[condition("migrationBlockedByBackup", "BackupInProgress", "Waiting for backup nightly to complete")]),
    # the source side of a decentralized migration, not finished (rule 6)
    vmi("sent", "worker-b"), pod("sent", "worker-b", name="virt-launcher-sent"),
    vmim("sent-away", "sent", "Synchronizing", 1, send_to=True),
]

# fixture -> (allowed, reason, dry run)
EXPECTED = {
    "eviction-plain.mutating.json": (True, "allowed", False),  # no requested-by: not in cooldown scope
    "eviction-plain.validating.json": (True, "allowed", False),
    "eviction-plain.validating.admissionreview-v1beta1.json": (True, "allowed", False),
    "eviction-requested-by-descheduler.mutating.json": (False, "cooldown", False),
    "eviction-requested-by-descheduler.validating.json": (False, "cooldown", False),
    "eviction-dryrun-query.mutating.json": (False, "migration_in_progress", True),
    "eviction-dryrun-query.validating.json": (False, "migration_in_progress", True),
    "eviction-deleteoptions-dryrun.mutating.json": (False, "evacuation_pending", True),
    "eviction-deleteoptions-dryrun.validating.json": (False, "evacuation_pending", True),
    "eviction-from-descheduler-PodEvictor-a-evacuate-fake.validating.json": (False, "cooldown", False),
    "eviction-from-descheduler-PodEvictor-c-allow-fake.validating.json": (True, "allowed", False),
    "eviction-grace-and-user.mutating.json": (True, "allowed", False),
    "eviction-grace-and-user.validating.json": (True, "allowed", False),
}


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    work = tmp_path_factory.mktemp("guard")
    snap = work / "snapshot.yaml"
    snap.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": OBJECTS}))
    g = GuardProcess(work, ["--snapshot", str(snap), "--now", NOW_ARG, "--max-body-bytes", "65536"])
    g.wait_healthy()
    yield g
    assert g.stop() == 0, g.log.read_text()


@pytest.fixture(scope="module")
def client(guard):
    with guard.client() as c:
        yield c


def post(client, body, path="/mutate", ctype="application/json"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(path + "?timeout=5s", content=data, headers={"Content-Type": ctype})


def test_fixture_set_is_complete() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in ADMISSION.glob("*.json"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_reviews_round_trip(client, name) -> None:
    req = json.loads((ADMISSION / name).read_text())
    path = "/mutate" if ".mutating." in name else "/validate"
    r = post(client, req, path)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = r.json()
    assert out["apiVersion"] == req["apiVersion"] and out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == req["request"]["uid"]
    allowed, reason, dry = EXPECTED[name]
    assert resp["allowed"] is allowed
    assert resp["auditAnnotations"]["reason"] == reason
    assert resp["auditAnnotations"]["decision"] == ("allowed" if allowed else "denied")
    assert (resp["auditAnnotations"].get("dry-run") == "true") is dry
    assert "retryAfterSeconds" not in r.text
    assert "patch" not in resp
    if not allowed:
        status = resp["status"]
        assert (status["code"], status["reason"]) == (429, "TooManyRequests")
        assert "details" not in status
        assert len(resp["warnings"]) == 1 and "\n" not in resp["warnings"][0]
        if reason in ("migration_in_progress", "evacuation_pending"):
            assert "Eviction triggered evacuation of VMI \"vms/" in status["message"]


def test_cooldown_denial_text_and_remaining(client) -> None:
    req = json.loads((ADMISSION / "eviction-requested-by-descheduler.mutating.json").read_text())
    resp = post(client, req).json()["response"]
    assert resp["status"]["message"] == (
        'VMI "vms/desched" is in migration cooldown: last migration finished 5m0s ago, cooldown 15m0s '
        "(1 migration in the last 48h0m0s), retry in 10m0s")
    assert resp["auditAnnotations"]["remaining-seconds"] == "600"


def test_pod_identity_comes_from_the_request_not_the_body(client) -> None:
    req = json.loads((ADMISSION / "eviction-requested-by-descheduler.mutating.json").read_text())
    req["request"]["object"]["metadata"]["name"] = "virt-launcher-c-allow-fake"  # body names a quiet pod
    assert post(client, req).json()["response"]["auditAnnotations"]["reason"] == "cooldown"


def base_review() -> dict:
    return json.loads((ADMISSION / "eviction-plain.mutating.json").read_text())


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_wrong_content_type_is_400(client, ctype) -> None:
    r = post(client, base_review(), ctype=ctype)
    assert r.status_code == 400 and "content type" in r.json()["error"]


@pytest.mark.parametrize("body, problem", [
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"kind": "Pod", "apiVersion": "v1"}', "not an AdmissionReview"),
    (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}', "has no request"),
    (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"name": "x"}}', "has no uid"),
    (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 7}}', "has no uid"),
])
def test_not_an_admission_review_is_400(client, body, problem) -> None:
    r = post(client, body)
    assert r.status_code == 400
    assert problem in r.json()["error"]


def test_body_over_the_limit_is_413(client) -> None:
    review = base_review()
    review["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * 70_000}
    r = post(client, review)
    assert r.status_code == 413 and "larger than 65536" in r.json()["error"]


def test_not_an_eviction_is_allowed_with_a_warning(client) -> None:
    review = base_review()
    review["request"]["operation"] = "UPDATE"
    review["request"]["subResource"] = ""
    resp = post(client, review).json()["response"]
    assert resp["allowed"] is True and resp["auditAnnotations"]["reason"] == "not_an_eviction"
    assert resp["warnings"] and "only judges evictions" in resp["warnings"][0]


@pytest.mark.parametrize("mutate", [
    lambda r: r["request"].update(name=12345),
    lambda r: r["request"].update(object="not an object"),
    lambda r: r["request"].update(userInfo=None, options=[1]),
    lambda r: r["request"]["object"].update(deleteOptions={"dryRun": "All"}),
    lambda r: r["request"].update(resource=None, namespace=["vms"]),
])
def test_wrong_types_are_answered_not_500(client, mutate) -> None:
    review = base_review()
    mutate(review)
    r = post(client, review)
    assert r.status_code == 200 and r.json()["response"]["uid"] == review["request"]["uid"]


def test_method_and_path_errors_are_json(client) -> None:
    assert client.get("/mutate").status_code == 405 and "error" in client.get("/mutate").json()
    assert client.get("/nope").status_code == 404 and "error" in client.get("/nope").json()


def test_health_ready_metrics(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    post(client, json.loads((ADMISSION / "eviction-requested-by-descheduler.mutating.json").read_text()))
    text = client.get("/metrics").text
    assert 'kubevirt_eviction_guard_decisions_total{decision="denied",reason="cooldown"}' in text
    assert 'kubevirt_eviction_guard_blocks_total{namespace="vms",node="worker-a",reason="cooldown"}' in text
    assert "kubevirt_eviction_guard_admission_duration_seconds_bucket" in text


def descheduler_review(pod_name: str) -> dict:
    review = json.loads((ADMISSION / "eviction-requested-by-descheduler.mutating.json").read_text())
    review["request"]["name"] = pod_name
    return review


def admin_review(pod_name: str) -> dict:
    """The same eviction without requested-by: an admin's."""
    review = base_review()
    review["request"]["name"] = pod_name
    return review


def plain_denial(r, reason: str) -> dict:
    """A 429 the descheduler reads as "try the next candidate": never retryAfterSeconds, never the
    background text (which it would count as an eviction running). Returns the response."""
    assert "retryAfterSeconds" not in r.text
    resp = r.json()["response"]
    assert resp["allowed"] is False and resp["auditAnnotations"]["reason"] == reason
    assert (resp["status"]["code"], resp["status"]["reason"]) == (429, "TooManyRequests")
    assert "Eviction triggered evacuation" not in resp["status"]["message"]
    return resp


def test_prefer_no_eviction_denial_over_the_wire(client) -> None:
    resp = plain_denial(post(client, descheduler_review("virt-launcher-shy")), "prefer_no_eviction")
    assert "prefers not to be evicted by the descheduler" in resp["status"]["message"]
    plain = admin_review("virt-launcher-shy")  # an admin's eviction is not held back by the annotation
    assert post(client, plain).json()["response"]["auditAnnotations"]["reason"] == "allowed"


def test_stuck_evacuation_denial_over_the_wire(client) -> None:
    resp = plain_denial(post(client, descheduler_review("virt-launcher-stuck")), "evacuation_stuck")
    assert 'the evacuation of VMI "vms/stuck" from node "worker-d" is stuck (3 failed attempts' in resp["status"]["message"]
    plain = admin_review("virt-launcher-stuck")  # an admin's eviction of the same VM still gets the background text
    resp = post(client, plain).json()["response"]
    assert resp["auditAnnotations"]["reason"] == "evacuation_pending"
    assert "Evacuation in progress: Eviction triggered evacuation" in resp["status"]["message"]
    metrics = client.get("/metrics").text
    assert 'kubevirt_eviction_guard_blocks_total{namespace="vms",node="worker-d",reason="evacuation_stuck"} 1.0' in metrics


def test_a_vm_beside_a_stuck_evacuation_is_refused_over_the_wire(client) -> None:
    resp = plain_denial(post(client, descheduler_review("virt-launcher-beside")), "node_busy")
    assert ('node "worker-d" already has 1 VM(s) leaving (vms/stuck (stuck: 3 failed attempts in 15m0s)); '
            "retry after they finish") in resp["status"]["message"]
    assert post(client, admin_review("virt-launcher-beside")).json()["response"]["allowed"] is True  # not in scope


def test_not_migratable_denial_over_the_wire(client) -> None:
    resp = plain_denial(post(client, descheduler_review("virt-launcher-pinned-disk")), "not_migratable")
    assert "LiveMigratable False: DisksNotLiveMigratable: cannot migrate VMI: PVC pd is not shared" in resp["status"]["message"]
    assert "would be shut down" in resp["status"]["message"] and "cannot live-migrate" in resp["warnings"][0]
    # a drain (an admin's eviction here) is never held back by it
    assert post(client, admin_review("virt-launcher-pinned-disk")).json()["response"]["allowed"] is True
    metrics = client.get("/metrics").text
    assert 'kubevirt_eviction_guard_decisions_total{decision="denied",reason="not_migratable"}' in metrics


def test_a_backup_blocked_evacuation_is_waiting_not_stuck_over_the_wire(client) -> None:
    resp = post(client, descheduler_review("virt-launcher-backed-up")).json()["response"]
    assert resp["auditAnnotations"]["reason"] == "migration_in_progress"  # background text: the descheduler waits
    assert ('Evacuation in progress: Eviction triggered evacuation of VMI "vms/backed-up": migration vms/backed-up-e3 is '
            "Pending; waiting: migrationBlockedByBackup (BackupInProgress: Waiting for backup nightly to complete)"
            ) in resp["status"]["message"]


def test_an_unfinished_decentralized_migration_is_in_flight_over_the_wire(client) -> None:
    resp = post(client, admin_review("virt-launcher-sent")).json()["response"]
    assert resp["auditAnnotations"]["reason"] == "migration_in_progress"
    assert "decentralized migration (sendTo: leaving for another namespace or cluster) vms/sent-away is Synchronizing" in \
        resp["status"]["message"]


def cooldown_observations(client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("kubevirt_eviction_guard_effective_cooldown_seconds_count "):
            return float(line.split()[1])
    raise AssertionError("histogram missing")


def test_cooldown_histogram_observes_denials_only(client) -> None:
    before = cooldown_observations(client)
    allowed = post(client, descheduler_review("virt-launcher-rested")).json()["response"]  # history, cooldown over
    assert allowed["allowed"] is True
    assert cooldown_observations(client) == before
    denied = post(client, descheduler_review("virt-launcher-desched")).json()["response"]
    assert denied["auditAnnotations"]["reason"] == "cooldown"
    assert cooldown_observations(client) == before + 1


def test_server_survives_bad_input_and_logs_decisions(guard, client) -> None:
    assert client.get("/healthz").status_code == 200
    assert guard.proc.poll() is None
    deadline = time.monotonic() + 5  # decision lines are written in batches, a moment later
    while True:
        lines = [json.loads(line) for line in guard.log.read_text().splitlines() if line.startswith("{")]
        decisions = [line for line in lines if line.get("reason") == "cooldown" and line.get("pod") == "virt-launcher-desched"]
        if decisions or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert decisions and decisions[0]["decision"] == "denied" and decisions[0]["requester"] == "sigs.k8s.io/descheduler"
    assert not any("Traceback" in line.get("msg", "") for line in lines)


def test_plain_http_is_not_served(guard) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.post(f"http://127.0.0.1:{guard.port}/mutate", json=base_review(), timeout=3)


def test_tls_below_1_2_is_refused(guard) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("ALL:@SECLEVEL=0")
    with socket.create_connection(("127.0.0.1", guard.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError):
            ctx.wrap_socket(raw, server_hostname="localhost")


@pytest.mark.parametrize("suite", ["ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA", "ECDHE-ECDSA-AES128-SHA256"])
def test_tls_1_2_offers_no_cbc_suite(guard, suite) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(suite)
    with socket.create_connection(("127.0.0.1", guard.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError):
            ctx.wrap_socket(raw, server_hostname="localhost")
    ctx.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")  # an AEAD suite: fine
    with socket.create_connection(("127.0.0.1", guard.port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"


def test_server_clock_matches_builders() -> None:
    assert ts(0) == NOW_ARG


# ---- node cooldowns (source and target) over the wire: a guard started with both node cooldowns on ----------------------

MOVED_OFF = mstate("m-off", "worker-x", "worker-z", start=7, end=5)  # descheduler move off worker-x, 5 min ago
MOVED_ON = mstate("m-on", "worker-z", "worker-y", start=7, end=5)  # descheduler move onto worker-y, 5 min ago
COOLING = [
    node("worker-x"), node("worker-y"), node("worker-z"),
    vmi("gone", "worker-z", migration=MOVED_OFF),
    vmim("m-off", "gone", "Succeeded", 8, MOVED_OFF, evacuation="worker-x", priority="system-maintenance"),
    vmi("came", "worker-y", migration=MOVED_ON),
    vmim("m-on", "came", "Succeeded", 8, MOVED_ON, evacuation="worker-z", priority="system-maintenance"),
    vmi("stay-x", "worker-x"), pod("stay-x", "worker-x", name="virt-launcher-stay-x"),
    vmi("stay-y", "worker-y"), pod("stay-y", "worker-y", name="virt-launcher-stay-y"),
]


@pytest.fixture(scope="module")
def cooling_client(tmp_path_factory):
    work = tmp_path_factory.mktemp("cooling")
    snap = work / "snapshot.yaml"
    snap.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": COOLING}))
    g = GuardProcess(work, ["--snapshot", str(snap), "--now", NOW_ARG, "--node-cooldown", "15m",
                            "--target-node-cooldown", "15m"])
    g.wait_healthy()
    with g.client() as c:
        yield c
    assert g.stop() == 0, g.log.read_text()


@pytest.mark.parametrize("pod_name, reason, text", [
    ("virt-launcher-stay-x", "node_cooldown", 'node "worker-x" is in node cooldown: VMI vms/gone left it for worker-z'),
    ("virt-launcher-stay-y", "target_node_cooldown",
     'node "worker-y" is in target-node cooldown: VMI vms/came arrived from worker-z'),
])
def test_node_cooldowns_over_the_wire(cooling_client, pod_name, reason, text) -> None:
    resp = plain_denial(post(cooling_client, descheduler_review(pod_name)), reason)
    assert text in resp["status"]["message"] and "choose a VM on another node" in resp["status"]["message"]
    assert resp["auditAnnotations"]["remaining-seconds"] == "600"
    plain = admin_review(pod_name)  # an admin's eviction is not held back (cooldownScope: descheduler)
    assert post(cooling_client, plain).json()["response"]["auditAnnotations"]["reason"] == "allowed"
    metrics = cooling_client.get("/metrics").text
    assert f'kubevirt_eviction_guard_decisions_total{{decision="denied",reason="{reason}"}}' in metrics
