"""``report`` and ``explain`` against a live cluster: one list through the API (the fake, over HTTP)."""

import pytest

from app import cli
from app.cluster import listing
from app.timefmt import format_timestamp
from tests.effects.support import NOW
from tests.fakeapi import FakeApiServer
from tests.fakeapi import objects as o

pytestmark = pytest.mark.timeout(30)
NS = "vms"


@pytest.fixture
def kubeconfig(tmp_path):
    with FakeApiServer() as api:
        api.put(o.node("node-a"))
        api.put(o.node("node-b", unschedulable=True))
        api.put(o.vmi(NS, "cool", node="node-a", created=NOW - 86400,
                      migration=o.migration_state(start=NOW - 900, end=NOW - 300, source_node="node-b",
                                                  target_node="node-a", uid="m1")))
        api.put(o.vmi(NS, "quiet", node="node-b", created=NOW - 86400))
        api.put(o.vmim(NS, "mig-1", "cool", start=NOW - 900, end=NOW - 300, source_node="node-b",
                       target_node="node-a", uid="m1", created=NOW - 950))
        api.put(o.launcher_pod(NS, "cool", "node-a", name="virt-launcher-cool-aaaaa"))
        api.put(o.launcher_pod(NS, "quiet", "node-b", name="virt-launcher-quiet-bbbbb"))
        api.put({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-a-vm", "namespace": NS}, "spec": {}})
        yield api, str(api.write_kubeconfig(tmp_path / "kubeconfig"))


def run(capsys, *argv):
    code = cli.main(["--log-level", "warning", *argv, "--now", format_timestamp(NOW)])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_lists_the_live_cluster_page_by_page(kubeconfig, capsys, monkeypatch):
    api, path = kubeconfig
    monkeypatch.setattr(listing, "PAGE", 1)  # force limit/continue through every kind
    code, out, _ = run(capsys, "report", "--kubeconfig", path)
    assert code == 0
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:] if line.startswith(NS)}
    assert rows["cool"][2:4] == ["node-a", "1"] and rows["cool"][-2:] == ["cooldown", "cooldown"]
    assert rows["quiet"][-2:] == ["movable", "allowed"]
    assert "2 VMIs" in out
    pod_lists = [r for r in api.requests if r.path == "/api/v1/pods"]
    assert len(pod_lists) == 2 and all(r.query.get("labelSelector") == "kubevirt.io=virt-launcher" for r in pod_lists)
    assert any(r.query.get("continue") for r in pod_lists)


def test_explain_says_why_a_vm_was_not_moved(kubeconfig, capsys):
    _, path = kubeconfig
    code, out, _ = run(capsys, "explain", "--kubeconfig", path, "-n", NS, "--pod", "virt-launcher-cool-aaaaa")
    assert code == 1
    assert "decision: DENY (429 TooManyRequests)  reason: cooldown" in out
    assert "retry in 10m0s" in out
    code, out, _ = run(capsys, "explain", "--kubeconfig", path, "-n", NS, "--pod", "virt-launcher-quiet-bbbbb")
    assert "reason: allowed" in out and "being drained (cordoned): drains are never held back" in out


def test_unreachable_cluster_and_missing_kubeconfig_are_clear_errors(kubeconfig, capsys, tmp_path):
    api, path = kubeconfig
    code, _, err = run(capsys, "report", "--kubeconfig", str(tmp_path / "nope"))
    assert code == 2 and "--kubeconfig" in err and "no such file" in err
    api.forbid("vmi", verbs=["list"])
    code, _, err = run(capsys, "report", "--kubeconfig", path)
    assert code == 2 and "listing virtualmachineinstances.kubevirt.io: 403" in err
    api.allow("vmi")
    api.down()
    code, _, err = run(capsys, "report", "--kubeconfig", path)
    assert code == 2 and "listing virtualmachineinstances.kubevirt.io" in err and "Traceback" not in err


