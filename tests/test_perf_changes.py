"""Behaviour kept by the performance work: batched log writes, records that own their
strings, and the single-pass ``leaving_age``."""

from __future__ import annotations

import io
import logging
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.records import MigrationRecord, MigrationState, VMIRecord, pod_from_object, vmi_from_object
from app.logs import BatchingStreamHandler, JSONFormatter
from app.policy.decide import leaving_age

# ---- batched log writes -------------------------------------------------------


def handler(interval: float = 60.0) -> tuple[BatchingStreamHandler, io.StringIO, logging.Logger]:
    stream = io.StringIO()
    h = BatchingStreamHandler(stream, interval)
    h.setFormatter(JSONFormatter())
    lg = logging.getLogger(f"test.batching.{id(h)}")
    lg.handlers[:] = [h]
    lg.propagate = False
    lg.setLevel(logging.INFO)
    return h, stream, lg


def wait_for(stream: io.StringIO, text: str) -> None:
    deadline = time.monotonic() + 5
    while text not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_info_lines_wait_for_the_batch_and_warnings_push_it_out() -> None:
    h, stream, lg = handler()  # the timer would take a minute
    lg.info("first", extra={"uid": "u1"})
    lg.info("second")
    time.sleep(0.05)
    assert stream.getvalue() == ""  # batched
    lg.warning("trouble")
    wait_for(stream, "trouble")
    lines = stream.getvalue().splitlines()
    assert [line.split('"msg":"')[1].split('"')[0] for line in lines] == ["first", "second", "trouble"]
    assert '"uid":"u1"' in lines[0]
    h.close()


def test_flush_close_and_the_timer_write_what_is_pending() -> None:
    h, stream, lg = handler(interval=0.05)
    lg.info("by the timer")
    wait_for(stream, "by the timer")
    assert "by the timer" in stream.getvalue()
    lg.info("by flush")
    h.flush()
    assert "by flush" in stream.getvalue()
    h2, stream2, lg2 = handler()
    lg2.info("by close")
    h2.close()
    assert "by close" in stream2.getvalue()
    h.close()


def test_lines_beyond_the_limit_are_dropped_and_counted_not_held(monkeypatch) -> None:
    """The limit is in bytes: one huge line cannot hold a 50,000-line queue's worth of memory, and small
    lines still fit after it is refused."""
    import app.logs

    monkeypatch.setattr(app.logs, "MAX_PENDING_BYTES", 2000)
    h, stream, lg = handler()
    for i in range(3):
        lg.info(f"line {i}")
    lg.info("huge " + "x" * 5000)
    lg.info("line 3")
    for i in range(4, 30):
        lg.info(f"line {i}")
    h.flush()
    text = stream.getvalue()
    assert "huge" not in text
    kept = [i for i in range(30) if f'"line {i}"' in text]
    assert kept == list(range(len(kept))) and 4 <= len(kept) < 30, kept  # in order, as many as fit in 2000
    assert f'"msg":"{30 - len(kept) + 1} log lines dropped: stderr was not being read"' in text
    assert '"level":"warning"' in text
    h.close()


# ---- records own their strings --------------------------------------------------


def test_records_hold_copies_not_the_documents_strings() -> None:
    doc = {"metadata": {"name": "vm-1", "namespace": "ns", "uid": "0e2c-uid-" + "x" * 30, "resourceVersion": "12345"},
           "status": {"nodeName": "node-a", "migrationState": {"migrationUid": "m-" + "y" * 30, "sourceNode": "node-b"}}}
    vmi = vmi_from_object(doc)
    assert vmi.uid == doc["metadata"]["uid"] and vmi.uid is not doc["metadata"]["uid"]
    pod = pod_from_object({**doc, "metadata": {**doc["metadata"], "name": "virt-launcher-vm-1"}})
    assert pod.resource_version == "12345" and pod.resource_version is not doc["metadata"]["resourceVersion"]
    assert vmi.migration is not None and vmi.migration.uid is not doc["status"]["migrationState"]["migrationUid"]
    # repeated values are shared between records
    other = vmi_from_object({"metadata": {"name": "vm-2", "namespace": "n" + "s"}, "status": {"nodeName": "node-" + "a"}})
    assert other.namespace is vmi.namespace and other.node is vmi.node


def test_a_lone_surrogate_is_copied_not_an_error() -> None:
    pod = pod_from_object({"metadata": {"name": "p\ud800", "namespace": "ns", "uid": "\udfff"}})
    assert pod.name == "p\ud800" and pod.uid == "\udfff"


# ---- leaving_age: the single pass gives what the list-based version gave -------


def leaving_age_reference(vmi, migrations, node, now):
    """The foundation's version, kept as the oracle."""
    anchors = []
    state = vmi.migration
    if state is not None and state.in_flight and state.start is not None:
        anchors.append(state.start)
    anchors.extend(m.created for m in migrations if not m.finished and m.created is not None)
    last_success = max((m.created for m in migrations if m.phase == "Succeeded" and m.created is not None), default=None)
    anchors.extend(m.created for m in migrations
                   if m.evacuation_node == node and m.created is not None and (last_success is None or m.created >= last_success))
    return None if not anchors else now - min(anchors)


times = st.one_of(st.none(), st.integers(0, 20).map(float))
nodes = st.sampled_from(["", "n1", "n2"])
migrations = st.lists(st.builds(
    MigrationRecord, namespace=st.just("ns"), name=st.text("ab", min_size=1, max_size=3), uid=st.just(""),
    vmi_name=st.just("vm"), phase=st.sampled_from(["", "Pending", "Running", "Succeeded", "Failed"]),
    created=times, start=times, end=times, source_node=nodes, evacuation_node=nodes),
    max_size=6)
states = st.one_of(st.none(), st.builds(
    MigrationState, started=st.booleans(), start=times, ended=st.booleans(), end=times, uid=st.just("u"),
    source_node=nodes, target_node=nodes, failed=st.booleans()))


@settings(max_examples=400, deadline=None)
@given(state=states, migs=migrations, node=nodes)
def test_leaving_age_matches_the_reference(state, migs, node) -> None:
    vmi = VMIRecord(namespace="ns", name="vm", uid="", created=None, node="n1", evacuation_node="",
                    migration=state)
    assert leaving_age(vmi, migs, node, 100.0) == leaving_age_reference(vmi, migs, node, 100.0)


# ---- structured(): the direct path writes what logging would have written ------

from app.logs import TextFormatter, structured  # noqa: E402


def test_structured_writes_the_same_line_as_logging(monkeypatch) -> None:
    for formatter in (JSONFormatter(), TextFormatter()):
        h, stream, lg = handler()
        h.setFormatter(formatter)
        monkeypatch.setattr(time, "time", lambda: 1795000000.25)  # one clock for LogRecord and structured()
        monkeypatch.setattr(time, "time_ns", lambda: 1795000000_250000000)  # what LogRecord reads on 3.12+
        fields = {"uid": "u-1", "namespace": "vms", "node": None, "dry_run": False, "cooldown_s": 900}
        lg.info("cooldown: retry in 10m0s", extra=fields)
        structured(lg, logging.INFO, "cooldown: retry in 10m0s", fields)
        structured(lg, logging.DEBUG, "below the level: not written", fields)
        h.flush()
        monkeypatch.undo()
        via_logging, direct = stream.getvalue().splitlines()
        assert direct == via_logging
        h.close()


def test_structured_falls_back_to_logging_for_other_handlers_and_filters() -> None:
    h, stream, lg = handler()
    seen: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    lg.addHandler(Capture())
    structured(lg, logging.INFO, "to both", {"uid": "u-2"})
    assert [r.getMessage() for r in seen] == ["to both"] and seen[0].uid == "u-2"  # type: ignore[attr-defined]
    lg.handlers[:] = [h]
    lg.addFilter(lambda r: r.getMessage() != "filtered")
    structured(lg, logging.INFO, "filtered", {})
    structured(lg, logging.INFO, "kept", {})
    h.flush()
    assert "to both" in stream.getvalue() and "kept" in stream.getvalue() and "filtered" not in stream.getvalue()
    h.close()


# ---- metric label children, looked up once ------------------------------------


def test_kept_label_children_count_into_the_same_series_as_labels() -> None:
    from app.metrics import Metrics

    m = Metrics()
    m.decisions_by("denied", "cooldown").inc()
    m.decisions_by("denied", "cooldown").inc()
    m.decisions.labels("denied", "cooldown").inc()
    m.blocks_by("cooldown", "node-a", "ns").inc()
    assert m.decisions_by("denied", "cooldown") is m.decisions.labels("denied", "cooldown")
    get = m.registry.get_sample_value
    assert get("kubevirt_eviction_guard_decisions_total", {"decision": "denied", "reason": "cooldown"}) == 3
    assert get("kubevirt_eviction_guard_blocks_total", {"reason": "cooldown", "node": "node-a", "namespace": "ns"}) == 1
    assert get("kubevirt_eviction_guard_decisions_total", {"decision": "allowed", "reason": "cooldown"}) is None
