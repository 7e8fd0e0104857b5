"""What the install notes and docs tell a user to run, run (against a stand-in ``kubectl``), and what the chart
renders for the values they name.

The verification step (chart NOTES, docs/install.md, README) must send what the descheduler sends, as a dry run:
its ``pods/eviction`` body, wrapped by the API server into a real AdmissionReview (a captured one, with this body),
is what the guard reads as a descheduler eviction. Whether the real API server then routes it through the guard
is the end-to-end tests' business (tests/e2e/test_chart_install.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import orjson
import pytest

from app.admission import review as rv
from app.policy.model import DESCHEDULER_REQUESTER
from tests.test_chart import FULLNAME, NS, _validate_all, helm_notes, one, render

ROOT = Path(__file__).resolve().parents[1]
POD = "virt-launcher-db-x1y2z"
FIXTURE = ROOT / "tests" / "fixtures" / "admission" / "eviction-dryrun-query.mutating.json"

KUBECTL = r"""#!/bin/sh
# a stand-in: records the eviction it is asked to create, names a launcher pod when asked for one
out="$(dirname "$0")"
prev=""
for a in "$@"; do
  if [ "$prev" = "--raw" ]; then printf '%s' "$a" > "$out/url"; cat > "$out/body"; exit 0; fi
  prev="$a"
done
case " $* " in *" get pod "*) echo "pod/virt-launcher-db-x1y2z" ;; *) echo "unexpected: kubectl $*" >&2; exit 2 ;; esac
"""


def run_step(tmp_path: Path, script: str, env: str = "") -> tuple[str, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(KUBECTL)
    (bin_dir / "kubectl").chmod(0o755)
    r = subprocess.run(["bash", "-c", f"set -e; {env}\n{script}"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=30, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return (bin_dir / "url").read_text(), json.loads((bin_dir / "body").read_text())


def as_the_guard_reads_it(namespace: str, body: dict) -> rv.Review:
    review = json.loads(FIXTURE.read_text())
    review["request"].update(name=body["metadata"]["name"], namespace=namespace, object=body)
    return rv.decode(orjson.dumps(review))


def check_step(url: str, body: dict, namespace: str) -> None:
    assert url == f"/api/v1/namespaces/{namespace}/pods/{POD}/eviction?dryRun=All"
    assert (body["apiVersion"], body["kind"]) == ("policy/v1", "Eviction")
    assert (body["metadata"]["name"], body["metadata"]["namespace"]) == (POD, namespace)
    eviction = as_the_guard_reads_it(namespace, body).eviction
    assert eviction.is_eviction and eviction.dry_run
    assert eviction.requested_by == DESCHEDULER_REQUESTER  # judged as the descheduler's: every rule applies


def test_the_notes_verification_step_sends_a_descheduler_dry_run_eviction(tmp_path) -> None:
    notes = helm_notes({})
    start = notes.index("  POD=$(")
    end = notes.index("-f -\n", start) + len("-f -")
    url, body = run_step(tmp_path, textwrap.dedent(notes[start:end]), env="NS=vms; VM=db")
    check_step(url, body, "vms")
    assert "virtctl -n $NS migrate $VM" in notes and "migration cooldown" in notes
    assert "drain" not in notes  # a drain meets only the rules for everyone: it shows nothing of the guard


@pytest.mark.parametrize("doc", ["README.md", "docs/install.md"])
def test_the_docs_verification_step_sends_a_descheduler_dry_run_eviction(tmp_path, doc) -> None:
    text = (ROOT / doc).read_text()
    (step,) = re.findall(r"^(POD=\$\(.*?\n^JSON$)", text, re.S | re.M)
    url, body = run_step(tmp_path, step)
    check_step(url, body, "vms")


def test_the_certificate_steps_keep_their_files_out_of_the_working_folder() -> None:
    """Mode 3 (README and docs/install.md) and the outside-the-cluster steps keep the key, the CA and the token in
    a folder of their own (``OUT=$(mktemp -d)``), not in the checkout they are typed in. (The README's certs command
    itself runs in tests/test_readme.py.)"""
    for doc in ("README.md", "docs/install.md"):
        text = (ROOT / doc).read_text()
        assert "OUT=$(mktemp -d)" in text
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            here = re.findall(r'(?:^|[\s=])(\./[\w./-]+)', block, re.M)
            here += re.findall(r'>\s*"?((?![$/&])[\w.-]+)', block)
            here += re.findall(r'(?:^|\s)([\w-]+\.(?:b64|kubeconfig|crt|key))\b', block, re.M)
            assert not here, f"{doc}: files in the working folder: {here}"


def test_recreate_renders_without_rolling_update() -> None:
    docs = render({"updateStrategy": {"type": "Recreate"}})
    assert one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    _validate_all(docs)
    rolling = one(render(), "Deployment")["spec"]["strategy"]
    assert rolling == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_the_metrics_port_admits_the_monitoring_namespaces_value_and_the_notes_say_so() -> None:
    policy = one(render(), "NetworkPolicy")
    _, metrics = policy["spec"]["ingress"]
    [peer] = metrics["from"]
    [expr] = peer["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "In"
    assert {"monitoring", "openshift-monitoring", "openshift-user-workload-monitoring"} <= set(expr["values"])
    assert "openshift-monitoring" in helm_notes({}) and "networkPolicy.metrics.namespaces" in helm_notes({})

    values = {"networkPolicy": {"metrics": {"namespaces": ["observability"],
                                            "from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}}}
    docs = render(values)
    _validate_all(docs)
    _, metrics = one(docs, "NetworkPolicy")["spec"]["ingress"]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["observability"]}]}},
        {"ipBlock": {"cidr": "10.1.0.0/16"}}]
    notes = helm_notes(values)
    assert "observability" in notes and "openshift-monitoring" not in notes and "up is 0" in notes

    anyone = {"networkPolicy": {"metrics": {"namespaces": [], "from": []}}}
    _, metrics = one(render(anyone), "NetworkPolicy")["spec"]["ingress"]
    assert "from" not in metrics
    assert "up is 0" not in helm_notes(anyone) and "up is 0" not in helm_notes({"networkPolicy": {"enabled": False}})
    assert f"{FULLNAME}.{NS}.svc:8080/metrics" in helm_notes(anyone)


def test_the_cli_page_shows_the_defaults_serve_and_simulate_have() -> None:
    from app.cli import build_parser
    from app.sim.options import MODES

    text = (ROOT / "docs" / "cli.md").read_text()
    synopsis = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    defaults = vars(build_parser().parse_args(["serve", "--tls-cert", "c", "--tls-key", "k"]))
    checked = 0
    for flag, shown in re.findall(r"\[(--[a-z-]+) ([^\]\s|]+)\]", synopsis):
        default = defaults.get(flag[2:].replace("-", "_"))
        if flag == "--modes":
            assert shown == ",".join(MODES), "docs/cli.md: --modes is not the default comparison"
        elif default not in (None, 0) and not isinstance(default, bool):
            assert str(default) == shown, f"docs/cli.md shows {flag} {shown}; the default is {default}"
            checked += 1
        elif default == 0:
            assert shown.isupper(), f"docs/cli.md shows {flag} {shown}; it is off by default"
            checked += 1
    assert checked >= 3
