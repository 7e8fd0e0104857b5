"""The decision table's stuck rows through the real API server, on a played KubeVirt; and the helpers the
real-KubeVirt rows share (tests/e2e/test_real_evictions.py runs every other row, and the drains, against KubeVirt's
own virt-api and virt-controller).

Why these two rows are played: a stuck evacuation (rule 5a) is reached by real KubeVirt after
``evacuationStaleAfterFailures`` failed attempts, and at that same count the guard's own canceller ends it
(tests/e2e/test_real_kubevirt.py shows that), so on the real-KubeVirt control plane the state does not last to be
asked about. Here the VMI, its failed VMIMs and its launcher pod are written through the API server, on a node the
guard does not know (it never cancels there). Evictions are sent as clients send them: client-go's policy/v1
Eviction with the descheduler's ``requested-by`` and ``reason`` annotations, and the body kubectl's drain helper
posts. The API server turns the guard's denial into the client's answer: HTTP 429, ``reason: TooManyRequests``, and
``admission webhook "<name>" denied the request: <the guard's message>``, with the guard's audit annotations in the
API server's audit log and its warning as a ``Warning`` header.

Rows that need what a real server cannot produce here (steering needs Prometheus; stale caches need a broken
watch) are covered elsewhere: tests/e2e/test_watch.py and the fake-API tests of ``make test``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from tests.e2e.cluster import Cluster, eventually
from tests.e2e.objects import migration_state

D = "⟨d⟩"  # a duration in a message: the guard formats it from the real clock
BACKGROUND = 'Evacuation in progress: Eviction triggered evacuation of VMI "{ns}/{vm}"'


def shape(text: str) -> re.Pattern:
    """A message with its durations left open (``D``), everything else literal."""
    return re.compile("^" + re.escape(text).replace(re.escape(D), "[0-9hms.]+") + "$")


@dataclass
class Row:
    """One state of the decision table: the pod to evict, who evicts, and the answer expected."""

    reason: str
    namespace: str
    pod: str
    descheduler: bool  # client-go sends the descheduler's annotations; kubectl never does
    message: str = ""  # the guard's message (with D for durations); "" for allowed rows
    allowed: bool = False
    via: tuple[str, ...] = ("client-go", "kubectl")
    notes: dict = field(default_factory=dict)


def build_rows(cluster: Cluster) -> dict[str, Row]:
    ns = cluster.fresh_namespace("vms")
    o = cluster.objects
    rows: dict[str, Row] = {}
    # rule 5a: a descheduler-caused evacuation whose attempts failed three times; a drain still gets rule 7. Its node
    # has no Node object: the session's guard cancels stuck evacuations (virt-api serves evacuate/cancel here), and
    # never on a node it does not know, so this mark stays for the whole check.
    e, b = cluster.unique("unregistered"), cluster.fresh_node()
    stuck = cluster.vm(ns, "stuck", e, evacuation_node=e, annotations={"kubevirt.io/eviction-source": "descheduler"})
    for i in range(3):
        o.vmim(ns, f"stuck-{i}", "stuck", "Failed", evacuation_node=e, priority="system-maintenance",
               migration=migration_state(e, b, started=9 - 3 * i, ended=8 - 3 * i, failed=True))
    rows["evacuation_stuck"] = Row(
        "evacuation_stuck", ns, stuck.pod_name, True,
        f'the evacuation of VMI "{ns}/stuck" from node "{e}" is stuck (3 failed attempts in {D}); KubeVirt keeps '
        "retrying it, the descheduler should choose another candidate", via=("client-go",))
    rows["evacuation_pending (stuck, not the descheduler)"] = Row(
        "evacuation_pending", ns, stuck.pod_name, False, BACKGROUND.format(ns=ns, vm="stuck") +
        f': VMI is marked for evacuation from node "{e}", its migration is pending', via=("kubectl",))
    cluster.sync()
    return rows


@pytest.fixture(scope="module")
def rows(cluster) -> dict[str, Row]:
    return build_rows(cluster)


def guard_message(guard, namespace: str, pod: str, after: int) -> str:
    """The message of the guard's newest decision about ``namespace/pod`` (its log line), past ``after`` lines."""
    def find():
        lines = [d for d in guard.logs()[after:] if d.get("logger") == "kubevirt_eviction_guard.decision"
                 and d.get("pod") == pod and d.get("namespace") == namespace]
        return lines[-1] if lines else None
    return eventually(find, 10, f"the guard's decision line for {namespace}/{pod}")["msg"]


def send(cluster: Cluster, row: Row, via: str, dry_run: bool) -> tuple[int, dict]:
    if via == "client-go":
        return cluster.evict(row.namespace, row.pod, dry_run=dry_run, descheduler=row.descheduler)
    return cluster.evict_raw(row.namespace, row.pod, dry_run=dry_run)


ROW_NAMES = ["evacuation_stuck", "evacuation_pending (stuck, not the descheduler)"]


@pytest.mark.check("eviction denied through the api server")
@pytest.mark.parametrize("name", ROW_NAMES)
def test_eviction_answer_through_the_api_server(name, rows, cluster, guard, installation, detail):
    row = rows[name]
    hook = installation.webhook_name
    seen = []
    for via in row.via:
        dry_run = row.allowed  # keeps the pod for the next client (no kubelet would ever finish it)
        after = len(guard.logs())
        audited = cluster.evictions_audited(row.namespace, row.pod)
        code, body = send(cluster, row, via, dry_run)
        audit = cluster.audit_of_eviction(row.namespace, row.pod, after=audited)
        annotations = audit.get("annotations", {})
        assert annotations.get(f"{hook}/reason") == row.reason, (via, annotations, body)
        if row.allowed:
            assert code == 201, (via, code, body)
            assert annotations[f"{hook}/decision"] == "allowed"
            seen.append(f"{via} 201")
            continue
        assert code == 429, (via, code, body)
        assert body["reason"] == "TooManyRequests" and body["code"] == 429 and body["status"] == "Failure", body
        assert "retryAfterSeconds" not in body.get("details", {}), body
        message = guard_message(guard, row.namespace, row.pod, after)
        assert shape(row.message).match(message), f"guard said {message!r}, expected {row.message!r}"
        assert body["message"] == f'admission webhook "{hook}" denied the request: {message}', body["message"]
        assert annotations[f"{hook}/decision"] == "denied"
        if via == "kubectl":  # the guard's warning, passed on as a Warning header: kubectl prints it
            quoted = f"kubevirt-eviction-guard: {message}".replace("\\", "\\\\").replace('"', '\\"')
            assert cluster.last_warnings == [f'299 - "{quoted}"'], cluster.last_warnings
        if row.reason == "cooldown":
            assert 0 < int(annotations[f"{hook}/remaining-seconds"]) <= 600, annotations
        seen.append(f"{via} 429")
    assert seen
    detail["detail"] = f"{name}: {', '.join(seen)}"
