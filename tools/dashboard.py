"""The chart's Grafana dashboard, built with Grafana's own foundation SDK (``grafana-foundation-sdk``, its types
generated from Grafana's dashboard schema) and written as the JSON the chart ships
(``charts/kubevirt-eviction-guard/dashboards/kubevirt-eviction-guard.json``; ``make dashboard``).

Each panel answers one question an operator asks (docs/operations.md, "The dashboard", says which and which alert
it sits beside). Every query selects the guard's series by ``job`` (the release's full name, as the chart's
ServiceMonitor labels them) and counts each replica once where replicas see the same cluster (``max``).
Usage: ``python -m tools.dashboard [--check]``: write the file, or fail when it differs from what is built.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef, GridPos

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "charts" / "kubevirt-eviction-guard" / "dashboards" / "kubevirt-eviction-guard.json"
UID = "kubevirt-eviction-guard"
P = "kubevirt_eviction_guard_"
SEL = 'job=~"$job"'
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# (title, what it answers, unit, kind, [(expr, legend)], width); kind "ts" a time series, "stat" one number
PANELS: list[tuple[str, str, str, str, list[tuple[str, str]], int]] = [
    ("Decisions by reason", "What the guard answered, per reason: allowed, and each reason it refused or failed open.",
     "reqps", "ts", [(f"sum by (decision, reason) (rate({P}decisions_total{{{SEL}}}[$__rate_interval]))",
                      "{{decision}} {{reason}}")], 12),
    ("Refusals by node", "Which nodes' evictions keep being refused (alert KubevirtEvictionGuardNodeBlockingSustained).",
     "reqps", "ts", [(f"sum by (node, reason) (rate({P}blocks_total{{{SEL}}}[$__rate_interval]))",
                      "{{node}} {{reason}}")], 12),
    ("VMs in cooldown", "How many VMs the guard keeps from the descheduler right now because they moved recently "
     "(rule cooldown); alert KubevirtEvictionGuardCooldownPinnedAtMaximum when they sit at the cap.",
     "short", "ts", [(f"max({P}vms_in_cooldown{{{SEL}}})", "in cooldown")], 8),
    ("Nodes held", "Nodes whose leaving VMs have filled the node budget for longer than evacuationStaleAfter, and "
     "for how long the oldest has been held (alert KubevirtEvictionGuardNodeHeld).",
     "short", "ts", [(f"max({P}held_nodes{{{SEL}}})", "held nodes"),
                     (f"max({P}held_node_oldest_seconds{{{SEL}}}) / 60", "oldest held (minutes)")], 8),
    ("Evacuations failing", "Evacuations KubeVirt keeps retrying after evacuationStaleAfterFailures failed attempts, "
     "by cause (alert KubevirtEvictionGuardEvacuationFailing).",
     "short", "ts", [(f"max by (cause) ({P}failing_evacuations{{{SEL}}})", "{{cause}}")], 8),
    ("Migrations by cause", "Finished migrations per hour and who caused them: descheduler, evacuation (a drain or "
     "another eviction), user, workload-update.",
     "short", "ts", [(f"max by (cause, outcome) (increase({P}migrations_total{{{SEL}}}[1h]))",
                      "{{cause}} {{outcome}}")], 12),
    ("Stuck evacuations cancelled", "Descheduler evacuations the guard's canceller ended (evacuate/cancel), and "
     "whether it runs.",
     "short", "ts", [(f"sum by (outcome) (increase({P}evacuation_cancels_total{{{SEL}}}[1h])) or "
                      f"max by (enabled, reason) ({P}evacuation_canceller_info{{{SEL}}}) * 0", "{{outcome}}")], 12),
    ("Answer latency", "How long the guard takes to answer the API server (p50, p99); the webhook's timeout is "
     "10 s, and a failing call fails open (alert KubevirtEvictionGuardFailingOpen).",
     "s", "ts", [(f"histogram_quantile(0.5, sum by (le) (rate({P}admission_duration_seconds_bucket{{{SEL}}}"
                  "[$__rate_interval])))", "p50"),
                 (f"histogram_quantile(0.99, sum by (le) (rate({P}admission_duration_seconds_bucket{{{SEL}}}"
                  "[$__rate_interval])))", "p99")], 8),
    ("Watch staleness", "Whether the guard's view of the cluster is current: kinds not synced, watch restarts other "
     "than a watch's normal end, and decisions that failed open on stale state (alerts "
     "KubevirtEvictionGuardNotReady, KubevirtEvictionGuardWatchRestartsClimbing).",
     "short", "ts", [(f"count({P}cache_synced{{{SEL}}} == 0) or vector(0)", "kinds not synced"),
                     (f'sum(increase({P}watch_restarts_total{{{SEL}, cause!="timeout"}}[10m])) or vector(0)',
                      "watch restarts (10m)"),
                     (f'sum(increase({P}decisions_total{{{SEL}, reason=~"cache_stale|cache_not_ready"}}[10m])) '
                      "or vector(0)", "failed open on stale state (10m)")], 8),
    ("Side effects dropped or failing", "Events, annotations and history writes the guard could not make: dropped "
     "because its queue was full, or failed against the API server; and the queue's depth.",
     "short", "ts", [(f"sum(increase({P}side_effects_dropped_total{{{SEL}}}[10m])) or vector(0)", "dropped (10m)"),
                     (f"sum(increase({P}side_effect_errors_total{{{SEL}}}[10m])) or vector(0)", "API errors (10m)"),
                     (f"max({P}side_effect_queue_depth{{{SEL}}})", "queue depth")], 8),
    ("Replicas ready", "Guard replicas scraped and synced (alert KubevirtEvictionGuardDown when none is).",
     "short", "stat", [(f"count(min by (pod) ({P}cache_synced{{{SEL}}}) == 1) or vector(0)", "ready")], 4),
]


def build() -> dict:
    d = (db.Dashboard("KubeVirt eviction guard")
         .uid(UID)
         .description("What the KubeVirt eviction guard decided, which VMs and nodes it holds, which evacuations "
                      "keep failing, why VMs moved, and its own health.")
         .tags(["kubevirt", "descheduler", "kubevirt-eviction-guard"])
         .time("now-6h", "now")
         .refresh("1m")
         .timezone("browser")
         .tooltip(DashboardCursorSync.CROSSHAIR)
         .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
         .with_variable(db.QueryVariable("job").label("Guard").datasource(DS)
                        .query(f"label_values({P}decisions_total, job)").include_all(True).all_value(".*")))
    x = y = 0
    for title, answers, unit, kind, queries, width in PANELS:
        if x + width > 24:
            x, y = 0, y + 8
        panel = (timeseries.Panel() if kind == "ts" else stat.Panel()).title(title).description(answers).unit(unit)
        panel = panel.datasource(DS).grid_pos(GridPos(h=8, w=width, x=x, y=y))
        for i, (expr, legend) in enumerate(queries):
            panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id("ABCDEFGH"[i]))
        d = d.with_panel(panel)
        x += width
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def text() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail when the chart's file differs from what is built")
    args = ap.parse_args(argv)
    want = text()
    if args.check:
        if not OUT.exists() or OUT.read_text() != want:
            print(f"{OUT.relative_to(ROOT)} is not what tools/dashboard.py builds: run make dashboard", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(want)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(build()['panels'])} panels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
