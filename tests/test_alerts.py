"""Every alert of the chart's PrometheusRule, in promtool's rule unit tests (Debian's prometheus package; marker
``prometheus``): each fires on the series it is about, and none fires over 24 hours of a healthy install.

The healthy day is two replicas as they run: scraped, synced, each of the five watches ending normally every 4 to 5
minutes (``cause="timeout"``), now and then a 410 and a relist, a refused eviction or a cooldown here and there,
the descheduler configured as the guard wants it, a certificate far from expiry. The guard's own ``namespace`` label
(the VM's, on ``blocks_total``) arrives as ``exported_namespace``: the scrape's ``namespace`` wins, as a
ServiceMonitor without ``honorLabels`` has it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from app.domain.kinds import KINDS, OPTIONAL_KINDS
from tests.prometheus_support import PROMTOOL
from tests.test_chart import FULLNAME, MONITORING, NS, one, render

WEBHOOK = f"{FULLNAME}.{NS}.svc"
SEL = f'job="{FULLNAME}", namespace="{NS}"'
REPLICAS = ("guard-a", "guard-b")
WATCHED = KINDS + OPTIONAL_KINDS
P = "kubevirt_eviction_guard_"
DAY = 24 * 60  # minutes


def groups() -> list[dict]:
    return one(render(MONITORING), "PrometheusRule")["spec"]["groups"]


def rules() -> dict[str, dict]:
    return {r["alert"]: r for g in groups() for r in g["rules"]}


def expand(text: str, labels: dict[str, str], value: str) -> str:
    """An annotation as Prometheus fills it in (only the two forms the chart's templates use)."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
    return text.replace("{{ $value }}", value)


def promtool(tmp_path: Path, series: list[dict], checks: list[tuple[str, str, list[dict]]],
             values: dict[str, str] | None = None, rule_groups: list[dict] | None = None) -> None:
    """``checks``: (eval time, alert, the labels of each firing alert). Annotations are checked too, filled in with
    the alert's labels and ``values[alert]`` as ``$value``."""
    rule_groups = rule_groups or groups()
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups}))
    by_name = {r["alert"]: r for g in rule_groups for r in g["rules"]}
    cases = []
    for at, alert, firing in checks:
        exp = []
        for labels in firing:
            full = {**labels, "severity": by_name[alert]["labels"]["severity"]}
            notes = {k: expand(v, full, (values or {}).get(alert, "")) for k, v in by_name[alert]["annotations"].items()}
            exp.append({"exp_labels": full, "exp_annotations": notes})
        cases.append({"eval_time": at, "alertname": alert, "exp_alerts": exp})
    test = {"rule_files": [str(path)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False, width=1 << 20))
    r = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "test.yaml")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]


def s(name: str, labels: str, values: str) -> dict:
    return {"series": f"{name}{{{labels}}}", "values": values}


def counter(steps: list[int], minutes: int = DAY) -> str:
    """A counter over ``minutes`` one-minute samples that goes up by one at each minute in ``steps``."""
    marks, value, out = set(steps), 0, []
    for minute in range(minutes + 1):
        value += minute in marks
        out.append(str(value))
    return " ".join(out)


def every(first: int, gaps: tuple[int, ...], minutes: int = DAY) -> list[int]:
    """Minutes from ``first`` on, the gaps between them taken in turn."""
    out, at, i = [], first, 0
    while at <= minutes:
        out.append(at)
        at += gaps[i % len(gaps)]
        i += 1
    return out


def ready(pod: str, minutes: int = DAY) -> list[dict]:
    """A replica that is scraped and has synced every kind."""
    labels = f'{SEL}, pod="{pod}"'
    return [s("up", labels, f"1+0x{minutes}")] + [s(P + "cache_synced", f'{labels}, kind="{k}"', f"1+0x{minutes}")
                                                 for k in KINDS]


def healthy_day() -> list[dict]:
    series: list[dict] = []
    for r, pod in enumerate(REPLICAS):
        labels = f'{SEL}, pod="{pod}"'
        series += ready(pod)
        for k, kind in enumerate(WATCHED):
            # the server ends each watch after its timeoutSeconds: every 4 to 5 minutes, per watch, per replica
            series.append(s(P + "watch_restarts_total", f'{labels}, kind="{kind}", cause="timeout"',
                            counter(every(1 + r + k, (4, 5, 5, 4, 5)))))
            # and now and then its resourceVersion is compacted away: 410, relist
            series.append(s(P + "watch_restarts_total", f'{labels}, kind="{kind}", cause="expired"',
                            counter(every(37 + 11 * k + 5 * r, (180, 240)))))
        # the descheduler meets a cooldown or a busy node now and then
        for node in ("worker-1", "worker-2"):
            series.append(s(P + "blocks_total", f'{labels}, reason="cooldown", node="{node}", exported_namespace="vms"',
                            counter(every(3 + 7 * r, (20, 25, 30)))))
        evaluations = counter(every(3 + 7 * r, (20, 25, 30)))
        for le in ("900.0", "1800.0", "3600.0", "7200.0", "14400.0", "21600.0", "+Inf"):
            series.append(s(P + "effective_cooldown_seconds_bucket", f'{labels}, le="{le}"', evaluations))
        series.append(s(P + "effective_cooldown_seconds_count", labels, evaluations))
        series.append(s(P + "descheduler_background_evictions", f'{labels}, state="enabled"', f"1+0x{DAY}"))
        series.append(s(P + "descheduler_background_evictions", f'{labels}, state="disabled"', f"0+0x{DAY}"))
        series.append(s(P + "descheduler_config_info", f'{labels}, node_limit_above_kubevirt="false"', f"1+0x{DAY}"))
        series.append(s(P + "held_nodes", labels, f"0+0x{DAY}"))
        for cause in ("descheduler", "evacuation", "user"):
            series.append(s(P + "failing_evacuations", f'{labels}, cause="{cause}"', f"0+0x{DAY}"))
        # a cert-manager certificate renewed 30 days before its 90 days end
        series.append(s(P + "tls_certificate_expiry_timestamp_seconds", labels, f"{60 * 86400}+0x{DAY}"))
    series.append(s("apiserver_admission_webhook_fail_open_count", f'name="{WEBHOOK}", type="admit"', f"0+0x{DAY}"))
    return series


@pytest.mark.prometheus
def test_no_alert_fires_over_24_hours_of_two_healthy_replicas(tmp_path) -> None:
    names = sorted(rules())
    checks = [(f"{m}m", name, []) for m in range(15, DAY + 1, 15) for name in names]
    promtool(tmp_path, healthy_day(), checks)


@pytest.mark.prometheus
def test_the_healthy_day_would_fire_the_old_watch_restarts_rule(tmp_path) -> None:
    """The day above is not too quiet to matter: summing every cause over both replicas, as the rule once did,
    fires on it within the hour."""
    rendered = groups()
    for rule in rendered[0]["rules"]:
        if rule["alert"] == "KubevirtEvictionGuardWatchRestartsClimbing":
            rule["expr"] = "sum by (kind) (increase(%swatch_restarts_total{%s}[15m])) > 5" % (P, SEL)
    with pytest.raises(AssertionError, match="KubevirtEvictionGuardWatchRestartsClimbing"):
        promtool(tmp_path, healthy_day(), [("60m", "KubevirtEvictionGuardWatchRestartsClimbing", [])],
                 rule_groups=rendered)


# ---- each alert fires on what it is about ------------------------------------------------------------------


def restarts(pod: str, kind: str, cause: str, steps: list[int], minutes: int) -> dict:
    return s(P + "watch_restarts_total", f'{SEL}, pod="{pod}", kind="{kind}", cause="{cause}"', counter(steps, minutes))


def test_every_alert_has_a_firing_case() -> None:
    assert set(FIRING) == set(rules())


def watch_breaking() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 90
    series = ready("guard-a", m) + ready("guard-b", m) + [
        # guard-a's vmi watch cannot reach the API server: a restart a minute from minute 10
        restarts("guard-a", "vmi", "connection", every(10, (1,), m), m),
        restarts("guard-a", "vmi", "timeout", every(2, (4, 5), m), m),
        # guard-b: 3 broken pod watches per 15 minutes, and so does guard-a: 6 together, but not more than 5 in
        # either replica
        restarts("guard-b", "pod", "server_error", every(1, (5,), m), m),
        restarts("guard-a", "pod", "server_error", every(3, (5,), m), m),
    ]
    fires = {"namespace": NS, "pod": "guard-a", "kind": "vmi", "alertname": "KubevirtEvictionGuardWatchRestartsClimbing"}
    return series, [("20m", fires["alertname"], []), ("45m", fires["alertname"], [fires])]


def node_blocking() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 120
    # 3 refusals per 15 minutes from worker-1 in each replica: 6 together, and the rule sums replicas
    series = ready("guard-a", m) + ready("guard-b", m) + [
        s(P + "blocks_total", f'{SEL}, pod="{pod}", reason="node_busy", node="worker-1", exported_namespace="vms"',
          counter(every(start, (5,), m), m)) for pod, start in (("guard-a", 1), ("guard-b", 3))
    ] + [s(P + "blocks_total", f'{SEL}, pod="guard-a", reason="cooldown", node="worker-2", exported_namespace="vms"',
           counter(every(1, (4,), m), m))]  # 3-4 per 15 minutes: quiet
    name = "KubevirtEvictionGuardNodeBlockingSustained"
    return series, [("60m", name, []), ("100m", name, [{"alertname": name, "node": "worker-1"}])]


def cooldown_pinned() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 180
    labels = f'{SEL}, pod="guard-a"'
    below, above = counter(every(1, (30,), m), m), counter(every(1, (30,), m) + every(2, (15,), m), m)
    series = ready("guard-a", m) + [s(P + "effective_cooldown_seconds_bucket", f'{labels}, le="{le}"', below)
                                    for le in ("900.0", "1800.0", "3600.0", "7200.0", "14400.0")]
    series += [s(P + "effective_cooldown_seconds_bucket", f'{labels}, le="{le}"', above) for le in ("21600.0", "+Inf")]
    series.append(s(P + "effective_cooldown_seconds_count", labels, above))
    name = "KubevirtEvictionGuardCooldownPinnedAtMaximum"
    return series, [("90m", name, []), ("150m", name, [{"alertname": name}])]


def not_ready() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 40
    labels = f'{SEL}, pod="guard-b"'
    series = ready("guard-a", m) + [s("up", labels, f"1+0x{m}")] + [
        s(P + "cache_synced", f'{labels}, kind="{k}"', "1+0x10 0+0x30" if k == "vmi" else f"1+0x{m}") for k in KINDS]
    name = "KubevirtEvictionGuardNotReady"
    return series, [("15m", name, []), ("30m", name, [{"alertname": name, "namespace": NS, "pod": "guard-b"}])]


def down() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 40
    series = [s("up", f'{SEL}, pod="{p}"', "1+0x10") for p in REPLICAS] + [
        s(P + "cache_synced", f'{SEL}, pod="{p}", kind="{k}"', "1+0x10") for p in REPLICAS for k in KINDS]
    name = "KubevirtEvictionGuardDown"
    return series, [("12m", name, []), (f"{m}m", name, [{"alertname": name}])]


def failing_open() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 30
    series = ready("guard-a", m) + [
        s("apiserver_admission_webhook_fail_open_count", f'name="{WEBHOOK}", type="admit"', "0+0x15 1+1x15")]
    name = "KubevirtEvictionGuardFailingOpen"
    return series, [("14m", name, []), ("25m", name, [{"alertname": name}])]


def descheduler_misconfigured() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 40
    series = ready("guard-a", m) + [s(P + "descheduler_background_evictions", f'{SEL}, pod="guard-a", state="disabled"',
                                      f"1+0x{m}")]
    name = "KubevirtEvictionGuardDeschedulerMisconfigured"
    return series, [("10m", name, []), ("30m", name, [{"alertname": name}])]


def node_held() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 40
    series = ready("guard-a", m) + [s(P + "held_nodes", f'{SEL}, pod="guard-a"', f"0+0x5 2+0x{m - 5}")]
    name = "KubevirtEvictionGuardNodeHeld"
    return series, [("15m", name, []), ("30m", name, [{"alertname": name}])]


def evacuation_failing() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    """A drain's evacuation keeps failing (both replicas see it); the descheduler's count stays 0."""
    m = 30
    series = ready("guard-a", m) + ready("guard-b", m)
    for pod in ("guard-a", "guard-b"):
        series.append(s(P + "failing_evacuations", f'{SEL}, pod="{pod}", cause="evacuation"', f"0+0x5 1+0x{m - 5}"))
        series.append(s(P + "failing_evacuations", f'{SEL}, pod="{pod}", cause="descheduler"', f"0+0x{m}"))
    name = "KubevirtEvictionGuardEvacuationFailing"
    return series, [("8m", name, []), ("15m", name, [{"alertname": name, "cause": "evacuation"}])]


def node_limit_above_kubevirt() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 90
    series = ready("guard-a", m) + [s(P + "descheduler_config_info", f'{SEL}, pod="guard-a", node_limit_above_kubevirt="true"',
                                      f"1+0x{m}")]
    name = "KubevirtEvictionGuardDeschedulerNodeLimitAboveKubeVirt"
    return series, [("50m", name, []), ("70m", name, [{"alertname": name}])]


def certificate_expiring() -> tuple[list[dict], list[tuple[str, str, list[dict]]]]:
    m = 120
    # promtool's clock starts at 0: a certificate that ends on day 10, and one replica still serving one for day 60
    series = ready("guard-a", m) + ready("guard-b", m) + [
        s(P + "tls_certificate_expiry_timestamp_seconds", f'{SEL}, pod="guard-a"', f"{10 * 86400}+0x{m}"),
        s(P + "tls_certificate_expiry_timestamp_seconds", f'{SEL}, pod="guard-b"', f"{60 * 86400}+0x{m}")]
    name = "KubevirtEvictionGuardCertificateExpiring"
    return series, [("50m", name, []), ("90m", name, [{"alertname": name}])]


FIRING = {
    "KubevirtEvictionGuardWatchRestartsClimbing": watch_breaking,
    "KubevirtEvictionGuardNodeBlockingSustained": node_blocking,
    "KubevirtEvictionGuardCooldownPinnedAtMaximum": cooldown_pinned,
    "KubevirtEvictionGuardNotReady": not_ready,
    "KubevirtEvictionGuardDown": down,
    "KubevirtEvictionGuardFailingOpen": failing_open,
    "KubevirtEvictionGuardDeschedulerMisconfigured": descheduler_misconfigured,
    "KubevirtEvictionGuardNodeHeld": node_held,
    "KubevirtEvictionGuardEvacuationFailing": evacuation_failing,
    "KubevirtEvictionGuardDeschedulerNodeLimitAboveKubeVirt": node_limit_above_kubevirt,
    "KubevirtEvictionGuardCertificateExpiring": certificate_expiring,
}


@pytest.mark.prometheus
@pytest.mark.parametrize("alert", sorted(FIRING))
def test_the_alert_fires_on_what_it_is_about(tmp_path, alert) -> None:
    series, checks = FIRING[alert]()
    promtool(tmp_path, series, checks, values={"KubevirtEvictionGuardNodeHeld": "2",
                                               "KubevirtEvictionGuardEvacuationFailing": "1"})
