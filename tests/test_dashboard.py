"""The chart's Grafana dashboard: built by tools/dashboard.py with Grafana's foundation SDK, loaded back through the
SDK's dashboard model (the schema Grafana's dashboards follow), rendered into a ConfigMap for Grafana's sidecar only
when asked, every query valid PromQL (promtool) over metrics the guard exports, each panel explained in
docs/operations.md. `make e2e` runs every query against a real Prometheus scraping a live guard."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from tests.prometheus_support import PROMTOOL
from tests.test_chart import guard_metric_names, render
from tools import dashboard

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


def shipped() -> dict:
    return json.loads(dashboard.OUT.read_text())


def test_the_shipped_json_is_what_the_builder_makes():
    assert dashboard.main(["--check"]) == 0


def test_the_dashboard_loads_through_grafanas_schema_and_round_trips():
    model = Dashboard.from_json(shipped())
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert again == shipped()
    assert model.uid == dashboard.UID and len(model.panels) == len(dashboard.PANELS)
    names = [v.name for v in model.templating.list_val]
    assert names == ["datasource", "job"]


def queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in shipped()["panels"] for t in p["targets"]]


def test_every_panel_queries_the_chosen_datasource_and_guard():
    for p in shipped()["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["description"] and p["targets"], p["title"]
    for title, expr in queries():
        assert 'job=~"$job"' in expr, (title, expr)


def test_every_query_reads_metrics_the_guard_exports():
    import re

    exported = guard_metric_names()
    for title, expr in queries():
        used = set(re.findall(r"\b(kubevirt_eviction_guard_[a-z0-9_]+)", expr))
        assert used and used <= exported, (title, used - exported)


@pytest.mark.prometheus
def test_every_query_is_valid_promql(tmp_path):
    """promtool checks each as a recording rule's expression, Grafana's interval variables given values."""
    rules = [{"record": f"dashboard:q{i}", "expr": expr.replace("$__rate_interval", "1m").replace("$job", ".*")}
             for i, (_, expr) in enumerate(queries())]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_chart_renders_the_configmap_only_when_asked():
    assert not [d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    docs = render({"dashboards": {"enabled": True, "annotations": {"grafana_folder": "KubeVirt"}}})
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "KubeVirt"}
    assert json.loads(cm["data"]["kubevirt-eviction-guard.json"]) == shipped()
    other = render({"dashboards": {"enabled": True, "label": "my_dashboards", "labelValue": "yes",
                                   "namespace": "monitoring"}})
    (cm,) = [d for d in other if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["my_dashboards"] == "yes" and cm["metadata"]["namespace"] == "monitoring"


def test_the_operations_page_explains_every_panel():
    section = OPERATIONS[OPERATIONS.index("## The dashboard"):]
    missing = [p["title"] for p in shipped()["panels"] if f"**{p['title']}**" not in section]
    assert missing == []

