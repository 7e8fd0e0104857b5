"""The chart refuses at render time what the guard refuses at start (templates/_validate.tpl), and its
PrometheusRule says when no guard answers while the webhook is registered.

Rendered by Helm's own engine (helm-python-sdk). The refusals are checked twice: with the chart as
shipped (values.schema.json may catch a value first) and without its schema, as
``helm install --skip-schema-validation`` renders it, where the template's own check must hold.
Each refusal is compared with the guard's verdict on the same value (app.config, the command line).
The alerts run in promtool's rule unit tests (Debian's prometheus package; marker ``prometheus``).
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from app.cli import build_parser
from app.config import SettingsError, build_settings
from tests.prometheus_support import PROMTOOL
from tests.test_chart import CHART, FULLNAME, MONITORING, NS, RELEASE, one, render
from tests.values import merge

WEBHOOK = f"{FULLNAME}.{NS}.svc"


@pytest.fixture(scope="module")
def charts(tmp_path_factory):
    """The chart as shipped, and a copy without values.schema.json."""
    bare = tmp_path_factory.mktemp("chart") / "kubevirt-eviction-guard"
    shutil.copytree(CHART, bare)
    (bare / "values.schema.json").unlink()
    with helm.Chart.load(CHART) as shipped, helm.Chart.load(bare) as unchecked:
        yield shipped, unchecked


def refusal(chart, values: dict) -> str:
    """The error Helm renders ``values`` with ("" when it renders)."""
    try:
        chart.render(values, name=RELEASE, namespace=NS)
    except (helm.HelmRenderError, helm.HelmValuesError) as e:
        return str(e)
    return ""


def guard_refuses(policy: dict) -> str:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    try:
        build_settings({**defaults, **policy})
    except SettingsError as e:
        return str(e)
    return ""


POLICY_CASES = [
    # (policy values, the words of the refusal; "" when both accept them)
    ({"migrationCooldown": "1h", "maxMigrationCooldown": "30m"}, "maxMigrationCooldown: must be 0 (no cap) or at least"),
    ({"migrationCooldown": "1h30m", "maxMigrationCooldown": "90m"}, ""),  # equal, spelt differently
    ({"migrationCooldown": "1.5h", "maxMigrationCooldown": "5399s"}, "maxMigrationCooldown: must be 0"),
    ({"migrationCooldown": "1.5h", "maxMigrationCooldown": "5400s"}, ""),
    ({"migrationCooldown": "2h", "maxMigrationCooldown": "0"}, ""),  # 0: no cap
    ({"migrationCooldown": "0", "maxMigrationCooldown": "1s"}, ""),
    ({"migrationCooldown": "500ms", "maxMigrationCooldown": "1s"}, ""),
    ({"migrationCooldown": "1001ms", "maxMigrationCooldown": "1s"}, "maxMigrationCooldown: must be 0"),
    ({"migrationCooldown": "-5m"}, "migrationCooldown: must not be negative"),
    ({"nodeCooldown": "-1s"}, "nodeCooldown: must not be negative"),
    ({"evacuationStaleAfter": "an hour"}, "evacuationStaleAfter: not a duration"),
    ({"migrationHistoryWindow": "48"}, "migrationHistoryWindow: not a duration"),
    ({"cooldownScope": "everyone"}, "cooldownScope: must be 'descheduler' or 'all'"),
    ({"pendingEvacuationsPerNode": -1}, "pendingEvacuationsPerNode: must not be negative"),
    ({"evacuationStaleAfterFailures": 6}, "evacuationStaleAfterFailures: must be between 0 (off) and 5"),
    ({"steeringMinGain": 101}, "steeringMinGain: must be between 0 and 100"),
    ({"steeringMargin": -1}, "steeringMargin: must be between 0 and 100"),
]


@pytest.mark.parametrize(("policy", "words"), POLICY_CASES, ids=[str(p) for p, _ in POLICY_CASES])
def test_the_chart_refuses_the_policy_values_the_guard_refuses(charts, policy, words) -> None:
    shipped, unchecked = charts
    guard = guard_refuses(policy)
    assert bool(guard) == bool(words) and words in guard, guard
    template = refusal(unchecked, {"policy": policy})
    assert bool(template) == bool(words)
    if words:
        assert f"policy.{words}" in template, template  # the template's own check, in the guard's words
        assert refusal(shipped, {"policy": policy}), "the shipped chart renders a value the guard refuses"
    else:
        assert not refusal(shipped, {"policy": policy})


def serve_refuses(args: list[str]) -> bool:
    try:
        build_parser().parse_args(["serve", "--tls-cert", "c", "--tls-key", "k", *args])
    except SystemExit:
        return True
    return False


@pytest.mark.parametrize(("values", "words"), [
    ({"server": {"staleAfter": "0s"}}, "server.staleAfter: must be a positive duration"),
    ({"server": {"staleAfter": "-2m"}}, "server.staleAfter: must be a positive duration"),
    ({"server": {"metricsPort": 8443}}, "server.metricsPort: must be a port other than server.port 8443"),
    ({"server": {"port": 70000}}, "server.port: expected a port number"),
    ({"server": {"tlsReloadInterval": -1}}, "server.tlsReloadInterval: expected a number of seconds"),
    ({"server": {"maxBodyBytes": 0}}, "server.maxBodyBytes: expected a positive whole number"),
    ({"prometheus": {"url": "http://prometheus:9090", "interval": "0s"}}, "prometheus.interval: must be a positive"),
    ({"prometheus": {"url": "http://prometheus:9090", "maxAge": "0s"}}, "prometheus.maxAge: must be a positive"),
    ({"prometheus": {"url": "http://prometheus:9090", "timeout": "soon"}}, "prometheus.timeout: not a duration"),
])
def test_the_chart_refuses_the_server_values_the_guard_refuses(charts, values, words) -> None:
    shipped, unchecked = charts
    assert words in refusal(unchecked, values)
    assert refusal(shipped, values)


def test_the_guard_refuses_those_server_values_too(tmp_path) -> None:
    """The same values as flags: the guard stops at start (here: the parts that need no cluster)."""
    from app.serve import stale_after
    from app.startup import prometheus_durations

    for flags in (["--port", "70000"], ["--tls-reload-interval", "-1"], ["--max-body-bytes", "0"]):
        assert serve_refuses(flags), flags
    for raw in ("0s", "-2m"):
        with pytest.raises(SettingsError, match="--stale-after: must be a positive duration"):
            stale_after(build_parser().parse_args(["serve", "--tls-cert", "c", "--tls-key", "k",
                                                   f"--stale-after={raw}"]))
    args = build_parser().parse_args(["serve", "--tls-cert", "c", "--tls-key", "k", "--prometheus-interval", "0s"])
    with pytest.raises(SettingsError, match="--prometheus-interval: must be a positive duration"):
        prometheus_durations(args)


def test_good_values_still_render(charts) -> None:
    shipped, unchecked = charts
    values = {"policy": {"migrationCooldown": "10m", "maxMigrationCooldown": "10m", "nodeCooldown": "5m"},
              "server": {"staleAfter": "90s"}, "prometheus": {"url": "http://prometheus:9090", "maxAge": "2m"}}
    assert not refusal(shipped, values) and not refusal(unchecked, values)


# ---- the alert for a guard that does not answer ----------------------------------------


def alerts(values: dict | None = None) -> dict[str, dict]:
    (group,) = one(render(merge(MONITORING, values or {})), "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_down_and_failing_open_alerts_are_rendered() -> None:
    rules = alerts()
    down = rules["KubevirtEvictionGuardDown"]
    assert down["labels"]["severity"] == "critical" and down["for"] == "5m"
    assert f'job="{FULLNAME}"' in down["expr"] and f'namespace="{NS}"' in down["expr"] and "absent(" in down["expr"]
    assert WEBHOOK in down["annotations"]["description"] and "proceeds unchecked" in down["annotations"]["description"]
    failing = rules["KubevirtEvictionGuardFailingOpen"]
    assert f'apiserver_admission_webhook_fail_open_count{{name="{WEBHOOK}"}}' in failing["expr"]
    fail_closed = alerts({"webhook": {"failurePolicy": "Fail"}})
    assert "KubevirtEvictionGuardFailingOpen" not in fail_closed  # nothing fails open
    assert "every VM eviction fails" in fail_closed["KubevirtEvictionGuardDown"]["annotations"]["description"]


SYNCED = "kubevirt_eviction_guard_cache_synced"


def promtool_test(tmp_path: Path, series: str, expected: dict[str, list[dict]]) -> None:
    """Run promtool's rule unit test: ``series`` over 30 minutes, alerts expected at 25 minutes."""
    rules = tmp_path / "rules.yaml"
    groups = one(render(MONITORING), "PrometheusRule")["spec"]["groups"]
    rules.write_text(yaml.safe_dump({"groups": groups}))
    annotations = {r["alert"]: r["annotations"] for r in groups[0]["rules"]}
    cases = [{"eval_time": "25m", "alertname": name,
              "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations[name]} for labels in firing]}
             for name, firing in expected.items()]
    test = {"rule_files": [str(rules)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": yaml.safe_load(series), "alert_rule_test": cases}]}
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    r = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def guard_series(synced: str, up: str = "1+0x30") -> str:
    """One replica: ``up`` while it is scraped (its pod cache synced meanwhile), ``synced`` for its VMI cache."""
    labels = f'job="{FULLNAME}", namespace="{NS}"'
    return textwrap.dedent(f"""\
        - series: 'up{{{labels}, pod="guard-a"}}'
          values: '{up}'
        - series: '{SYNCED}{{{labels}, pod="guard-a", kind="vmi"}}'
          values: '{synced}'
        - series: '{SYNCED}{{{labels}, pod="guard-a", kind="pod"}}'
          values: '{up}'
        """)


DOWN = {"alertname": "KubevirtEvictionGuardDown", "severity": "critical"}


@pytest.mark.prometheus
def test_down_fires_when_no_replica_answers(tmp_path) -> None:
    # ready all along: quiet
    promtool_test(tmp_path, guard_series("1+0x30"), {"KubevirtEvictionGuardDown": []})
    # up, but its VMI cache not synced for the last 10 minutes: no ready replica
    promtool_test(tmp_path, guard_series("1+0x15 0+0x15"), {"KubevirtEvictionGuardDown": [DOWN]})
    # every replica gone (crash loop, scaled to 0): no series at all after minute 10
    promtool_test(tmp_path, guard_series("1+0x10", up="1+0x10"), {"KubevirtEvictionGuardDown": [DOWN]})
    # briefly unready (a rollout): shorter than `for`, quiet
    promtool_test(tmp_path, guard_series("1+0x22 0 0 1+0x7"), {"KubevirtEvictionGuardDown": []})


@pytest.mark.prometheus
def test_failing_open_fires_on_the_api_servers_count(tmp_path) -> None:
    series = guard_series("1+0x30") + textwrap.dedent(f"""\
        - series: 'apiserver_admission_webhook_fail_open_count{{name="{WEBHOOK}", type="admit", job="apiserver"}}'
          values: '0+0x15 1+1x15'
        - series: 'apiserver_admission_webhook_fail_open_count{{name="other.example.com", type="admit"}}'
          values: '0+5x30'
        """)
    firing = [{"alertname": "KubevirtEvictionGuardFailingOpen", "severity": "warning"}]
    promtool_test(tmp_path, series, {"KubevirtEvictionGuardFailingOpen": firing, "KubevirtEvictionGuardDown": []})
    quiet = guard_series("1+0x30") + textwrap.dedent("""\
        - series: 'apiserver_admission_webhook_fail_open_count{name="other.example.com", type="admit"}'
          values: '0+5x30'
        """)
    promtool_test(tmp_path, quiet, {"KubevirtEvictionGuardFailingOpen": []})
