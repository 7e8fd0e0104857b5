"""Command line: serve, explain, report, certs, simulate. Thin wiring; the judgement lives in policy."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app import __version__
from app.cluster.kube import KubeConfigError
from app.cluster.snapshot import SnapshotError
from app.config import BOOLS, DURATIONS, SETTING_NAMES, SettingsError, kebab
from app.startup import UsageError
from app.tls import TLSError

FORMATS = ("text", "json", "yaml")  # explain and report: -o


def _policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy settings (override --config)")
    g.add_argument("--config", metavar="FILE", help="YAML file with policy settings (names as in docs/decisions.md)")
    for name in SETTING_NAMES:
        kind = "Go duration" if name in DURATIONS else ("comma-separated" if name == "deschedulerUsers" else
                                                        "true|false" if name in BOOLS else "")
        g.add_argument(f"--{kebab(name)}", dest=name, metavar=kind.upper().replace(" ", "_") or "VALUE", default=None)
    g.add_argument("--now", metavar="RFC3339", help="decide as of this time instead of the clock (what-if on a dump)")


def _source_flags(p: argparse.ArgumentParser, snapshot_required: bool = False) -> None:
    p.add_argument("--snapshot", metavar="FILE", required=snapshot_required,
                   help="cluster state from a file (kubectl get vmi,vmim,pods,nodes -A -o yaml)")


def _kube_flags(p: argparse.ArgumentParser) -> None:
    """How to reach a live cluster (used when --snapshot is not given)."""
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig for a live cluster (default: in-cluster config when running in a pod, else $KUBECONFIG)")
    p.add_argument("--context", dest="kube_context", metavar="NAME", help="kubeconfig context (default: current)")


def _prometheus_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("steering with Prometheus (rule 10; off unless --prometheus-url is given)")
    g.add_argument("--prometheus-url", metavar="URL",
                   help="Prometheus or thanos-querier base URL (https://thanos-querier.openshift-monitoring.svc:9091)")
    g.add_argument("--prometheus-token-file", metavar="FILE",
                   help="bearer token, re-read every round (/var/run/secrets/kubernetes.io/serviceaccount/token)")
    g.add_argument("--prometheus-ca", metavar="FILE", help="CA bundle that signed Prometheus' certificate")
    g.add_argument("--prometheus-interval", metavar="GO_DURATION", default=None, help="query interval (default 30s)")
    g.add_argument("--prometheus-max-age", metavar="GO_DURATION", default=None,
                   help="older data fails open with reason metrics_unavailable (default 3 x the interval)")
    g.add_argument("--prometheus-timeout", metavar="GO_DURATION", default=None, help="per query (default 5s)")


def _output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=FORMATS, default="text",
                   help="text (default), or json / yaml for scripts (durations in seconds, times in RFC 3339)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubevirt-eviction-guard", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTPS admission webhook")
    # also accepted after `serve`, because the container's entrypoint is `kubevirt-eviction-guard serve`
    serve.add_argument("--log-format", choices=("json", "text"), default=argparse.SUPPRESS)
    serve.add_argument("--log-level", default=argparse.SUPPRESS)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8443)
    serve.add_argument("--tls-cert", required=True, metavar="FILE")
    serve.add_argument("--tls-key", required=True, metavar="FILE")
    serve.add_argument("--client-ca", metavar="FILE", help="require client certificates signed by this CA")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20)
    serve.add_argument("--request-timeout", default="10s", help="a request must arrive whole within this (slow clients)")
    serve.add_argument("--idle-timeout", default="30s", help="close connections idle this long")
    serve.add_argument("--graceful-timeout", default="20s", help="on SIGTERM, wait this long for in-flight requests")
    serve.add_argument("--shutdown-drain", default="3s",
                       help="on SIGTERM, report not ready and keep serving this long first (endpoint removal lag)")
    fx = serve.add_argument_group("side effects (Events, eviction-in-progress annotation, migration history)")
    fx.add_argument("--event-interval", metavar="GO_DURATION", default="1m",
                    help="at most one Event write per VMI and reason per interval (default 1m)")
    fx.add_argument("--side-effect-queue", metavar="N", type=int, default=1000,
                    help="bounded queue of pending side effects; the oldest is dropped when full")
    fx.add_argument("--no-side-effects", action="store_true",
                    help="log decisions only: no Events, no annotation, no migration history")
    fx.add_argument("--no-history-annotation", action="store_true",
                    help="do not keep the VMIs' migration history annotation (cooldown counts only what KubeVirt keeps)")
    fx.add_argument("--cancel-stuck-evacuations", action=argparse.BooleanOptionalAction, default=True,
                    help="cancel stuck descheduler-caused evacuations through KubeVirt's evacuate/cancel, never a "
                         "drain's; on by default, it runs once KubeVirt serves evacuate/cancel (v1.8+) and RBAC lets "
                         "the guard call it (evacuation_canceller_info says why not)")
    fx.add_argument("--cancel-interval", metavar="GO_DURATION", default="30s",
                    help="how often the canceller looks for stuck evacuations (default 30s)")
    serve.add_argument("--stale-after", metavar="GO_DURATION", default=None,
                       help="fail open for a kind whose watch has been broken this long (default 2m; also staleAfter in --config)")
    serve.add_argument("--tls-reload-interval", type=float, default=5.0, metavar="SECONDS",
                       help="how often to look for a rotated certificate/key (0: never reload)")
    serve.add_argument("--metrics-port", type=int, default=0,
                       help="also serve /metrics, /healthz, /readyz over plain HTTP on this port (0: off)")
    serve.add_argument("--descheduler-check", action=argparse.BooleanOptionalAction, default=True,
                       help="in live mode, export whether the KubeDescheduler enables background evictions")
    serve.add_argument("--descheduler-namespace", default="openshift-kube-descheduler-operator")
    _source_flags(serve)
    _kube_flags(serve)
    _policy_flags(serve)
    _prometheus_flags(serve)

    explain = sub.add_parser("explain", help="the decision for one pod, with the reasoning")
    explain.add_argument("--namespace", "-n", required=True)
    explain.add_argument("--pod", required=True)
    explain.add_argument("--requester", default="descheduler", help="descheduler | user:NAME")
    _output_flag(explain)
    _source_flags(explain)
    _kube_flags(explain)  # without --snapshot: one list of the live cluster
    _policy_flags(explain)
    _prometheus_flags(explain)

    report = sub.add_parser("report", help="every VMI's state (the decision for a descheduler eviction of its pod), "
                                           "cooldown and migration history")
    _output_flag(report)
    _source_flags(report)
    _kube_flags(report)
    _policy_flags(report)

    certs = sub.add_parser("certs", help="CA and serving certificate for a Service, and the caBundle")
    certs.add_argument("--service", required=True)
    certs.add_argument("--namespace", required=True)
    certs.add_argument("--out", required=True, metavar="DIR")
    certs.add_argument("--days", type=int, default=365)

    from app.sim.run import add_arguments as simulate_arguments

    simulate = sub.add_parser("simulate", help="simulate KubeVirt and the descheduler with and without the guard")
    simulate_arguments(simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from app.logs import configure

    configure(args.log_format, args.log_level)
    try:
        if args.command == "serve":
            from app.serve import serve

            return serve(args)
        if args.command == "explain":
            from app.inspect import explain

            return explain(args)
        if args.command == "report":
            from app.inspect import report

            return report(args)
        if args.command == "simulate":
            from app.sim.run import main as simulate_main

            return simulate_main(args)
        if args.command == "certs":
            from app.tls import issue_certs, write_certs

            issued = issue_certs(args.service, args.namespace, days=args.days)
            paths = write_certs(issued, args.out)
            print(f"wrote {paths['ca']}, {paths['cert']}, {paths['key']}", file=sys.stderr)
            print(issued.ca_bundle)
            return 0
    except (SettingsError, KubeConfigError, SnapshotError, TLSError, UsageError) as e:
        print(f"kubevirt-eviction-guard: {e}", file=sys.stderr)
        return 2
    return 1
