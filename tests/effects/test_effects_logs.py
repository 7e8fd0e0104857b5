"""One structured line per decision, JSON by default, text for humans; no bodies, no tokens."""

import io
import logging

import orjson
import pytest

from app.effects import Effects
from app.effects.decision_log import log_decision
from app.logs import JSONFormatter, TextFormatter
from app.metrics import Metrics
from tests.effects.support import (
    DESCHEDULER,
    DESCHEDULER_USER,
    EVICTION_REASON,
    NS,
    RecordingApi,
    decided,
    node_obj,
    pod_obj,
    store_of,
    vmi_obj,
)

POD = "virt-launcher-db-abcde"


@pytest.fixture
def capture():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("kubevirt_eviction_guard.decision")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)

    def lines(formatter):
        handler.setFormatter(formatter)
        return out

    yield lines
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def cooldown_store():
    return store_of(node_obj("node-b"), vmi_obj("db", "node-b", ended_ago=300), pod_obj(POD, "db", "node-b"))


def test_json_line_has_the_fields_an_operator_filters_on(capture):
    out = capture(JSONFormatter())
    review, d = decided(cooldown_store(), POD, uid="7f1c-uid")
    log_decision(review, d)
    [line] = out.getvalue().splitlines()
    rec = orjson.loads(line)
    assert rec["msg"] == d.message and rec["level"] == "info"
    assert {k: rec[k] for k in ("uid", "namespace", "pod", "vmi", "node", "requester", "user", "decision", "reason",
                                "dry_run", "cooldown_s", "migrations_in_window", "remaining_s")} == {
        "uid": "7f1c-uid", "namespace": NS, "pod": POD, "vmi": "db", "node": "node-b", "requester": DESCHEDULER,
        "user": DESCHEDULER_USER, "decision": "denied", "reason": "cooldown", "dry_run": False,
        "cooldown_s": 900, "migrations_in_window": 1, "remaining_s": 600}
    assert rec["eviction_reason"] == EVICTION_REASON


def test_no_request_body_and_no_credentials_in_the_line(capture):
    out = capture(JSONFormatter())
    review, d = decided(cooldown_store(), POD)
    log_decision(review, d)
    text = out.getvalue()
    for leaked in ("managedFields", "deleteOptions", "AdmissionReview", "groups", "system:authenticated", "token"):
        assert leaked not in text


def test_text_format_for_humans(capture):
    out = capture(TextFormatter())
    review, d = decided(cooldown_store(), POD, dry_run=True)
    log_decision(review, d)
    line = out.getvalue().strip()
    assert "is in migration cooldown" in line
    for kv in (f"pod={POD}", "vmi=db", "decision=denied", "reason=cooldown", "dry_run=True", "remaining_s=600"):
        assert kv in line


def test_every_decision_is_logged_once_by_the_hook(capture):
    out = capture(JSONFormatter())
    store = cooldown_store()
    fx = Effects(store, RecordingApi(), Metrics())
    for pod in (POD, "virt-launcher-unknown-zzzzz"):
        fx.on_decision(*decided(store, pod))
    lines = [orjson.loads(x) for x in out.getvalue().splitlines()]
    assert [(x["pod"], x["decision"], x["reason"]) for x in lines] == [
        (POD, "denied", "cooldown"), ("virt-launcher-unknown-zzzzz", "allowed", "not_a_vm_pod")]


FORGED_USER = 'mallory\n12:00:00 INFO    allowed user=admin\x1b[2J\x1b[31m\u2028\u202e'


@pytest.mark.parametrize("formatter", [TextFormatter(), JSONFormatter()], ids=["text", "json"])
def test_what_a_client_sends_cannot_forge_a_line_or_reach_a_terminal_and_is_cut(capture, formatter):
    out = capture(formatter)
    pod = "virt-launcher-" + "p" * 100_000  # not a VM's: the message quotes it
    for review, d in (decided(cooldown_store(), POD, username=FORGED_USER, reason="r\n" * 50_000),
                      decided(cooldown_store(), pod, username=FORGED_USER)):
        log_decision(review, d)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # one per decision: the newlines in the user name did not start a line
    for line in lines:
        assert line.isprintable(), repr(line)  # no newline, escape, line separator or bidi override
        assert len(line) < 16384
    escaped = "mallory\\x0a12:00:00 INFO    allowed user=admin\\x1b[2J\\x1b[31m\\u2028\\u202e"
    if isinstance(formatter, TextFormatter):  # a field that is not one plain word is quoted, as JSON would
        assert all(f"user={orjson.dumps(escaped).decode()}" in line for line in lines)
    else:
        assert [orjson.loads(line)["user"] for line in lines] == [escaped, escaped]
        reason = orjson.loads(lines[0])["eviction_reason"]
        assert len(reason) == 200 and reason.startswith("r\\x0ar\\x0a") and reason.endswith("...")


def test_text_lines_escape_messages_like_json(capture):
    out = capture(TextFormatter())
    logging.getLogger("kubevirt_eviction_guard.decision").info("two\nlines \x1b[31m", extra={"plain": "word", "n": 3})
    [line] = out.getvalue().splitlines()
    assert line.endswith('two\\nlines \\u001b[31m plain=word n=3')
