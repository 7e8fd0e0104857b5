"""Command line: serve, explain, report, certs, unregister, simulate. Thin wiring; the judgement lives in policy."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence

from app import __version__
from app.config import BOOLS, DURATIONS, POINTS, SETTING_HELP, SETTING_NAMES, SettingsError, by_name, kebab
from app.policy.model import PolicySettings
from app.transport.http import MAX_BODY_BYTES

PROG = "kubevirt-eviction-guard"
FORMATS = ("text", "json", "yaml")  # explain and report: -o
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# serve logs what it does (JSON, for a log pipeline); the other commands log only when something is wrong
DEFAULT_LOG_LEVEL = {"serve": "info"}
DEFAULT_LOG_FORMAT = {"serve": "json"}
EXIT_USAGE = 2
EXIT_INTERNAL = 3  # not 1: explain's 1 means "denied"


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr and exit status 2, like every other refusal."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _ranged_int(low: int, high: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {text!r}")
    return value


def _pattern(regex: str, what: str):
    compiled = re.compile(regex)

    def parse(text: str) -> str:
        if not compiled.fullmatch(text):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return text

    return parse


port = _ranged_int(1, 65535, "a port number from 1 to 65535")
port_or_off = _ranged_int(0, 65535, "a port number from 1 to 65535, or 0 for off")
positive_int = _ranged_int(1, 2**31 - 1, "a positive whole number")
days = _ranged_int(1, 3650, "a number of days from 1 to 3650")
# a Service's name is a DNS-1035 label; a namespace's a DNS-1123 label (Kubernetes' own validation)
service_name = _pattern(r"(?=.{1,63}$)[a-z]([-a-z0-9]*[a-z0-9])?", "a Service name (lowercase letters, digits and '-', "
                                                                 "starting with a letter, at most 63)")
namespace_name = _pattern(r"(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?", "a namespace name (lowercase letters, digits "
                                                                        "and '-', at most 63)")
# a cluster-scoped object's name: a DNS-1123 subdomain
object_name = _pattern(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                       "an object name (lowercase letters, digits, '-' and '.', at most 253)")


def log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return text.lower()


def _logging_flags(p: argparse.ArgumentParser, default) -> None:
    """Accepted before and after the command name (``kubevirt-eviction-guard serve --log-level debug``: the
    container's entrypoint ends in ``serve``); after it wins."""
    g = p.add_argument_group("logging")
    g.add_argument("--log-level", type=log_level, default=default, metavar="LEVEL",
                   help=f"{', '.join(LOG_LEVELS)} (default: info for serve, warning for the other commands)")
    g.add_argument("--log-format", choices=("json", "text"), default=default,
                   help="json: one object per line (default for serve); text: for people (default otherwise)")


def _setting_metavar(name: str) -> str:
    if name in DURATIONS:
        return "GO_DURATION"
    if name in BOOLS:
        return "true|false"
    if name in POINTS:
        return "POINTS"
    return {"cooldownScope": "descheduler|all", "deschedulerUsers": "USER,..."}.get(name, "N")


def _setting_default(name: str) -> str:
    value = by_name(PolicySettings())[name]
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy settings (docs/decisions.md; a flag overrides --config)")
    g.add_argument("--config", metavar="FILE", help="YAML file with the settings below by their camelCase names")
    for name in SETTING_NAMES:
        g.add_argument(f"--{kebab(name)}", dest=name, metavar=_setting_metavar(name), default=None,
                       help=f"{name}: {SETTING_HELP[name]} (default {_setting_default(name)})")
    g.add_argument("--now", metavar="RFC3339",
                   help="decide as of this time instead of the clock, e.g. 2026-11-21T12:00:00Z (what-if on a dump)")


def _source_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snapshot", metavar="FILE",
                   help="cluster state from a file (kubectl get vmi,vmim,pods,nodes -A -o yaml) instead of a cluster")


def _kube_flags(p: argparse.ArgumentParser) -> None:
    """How to reach a live cluster (used when --snapshot is not given)."""
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig for a live cluster (default: in-cluster config when running in a pod, else $KUBECONFIG)")
    p.add_argument("--context", dest="kube_context", metavar="NAME", help="kubeconfig context (default: current)")


def _prometheus_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("steering with Prometheus (docs/steering.md; on wherever the descheduler's Prometheus is "
                             "found, or --prometheus-url)")
    g.add_argument("--steering", choices=("auto", "off"), default="auto",
                   help="auto (default): steer with --prometheus-url, else with the Prometheus the descheduler's "
                        "policy names (live cluster only); off: never")
    g.add_argument("--descheduler-policy", metavar="NS/NAME,...", default=None,
                   help="ConfigMaps holding the descheduler's policy (key policy.yaml), read in order to find its "
                        "Prometheus (default openshift-kube-descheduler-operator/cluster,kube-system/descheduler; "
                        "'' for none)")
    g.add_argument("--prometheus-url", metavar="URL",
                   help="Prometheus or thanos-querier base URL (https://thanos-querier.openshift-monitoring.svc:9091); "
                        "wins over discovery")
    g.add_argument("--prometheus-token-file", metavar="FILE",
                   help="bearer token, re-read every round (a metrics reader's: never the guard's own); also sent to a "
                        "discovered Prometheus whose policy names no authToken Secret")
    g.add_argument("--prometheus-ca", metavar="FILE", help="CA bundle that signed Prometheus' certificate (default for a "
                                                           "discovered one: the pod's ServiceAccount ca.crt, as the "
                                                           "descheduler)")
    g.add_argument("--prometheus-interval", metavar="GO_DURATION", default=None, help="query interval (default 30s)")
    g.add_argument("--prometheus-max-age", metavar="GO_DURATION", default=None,
                   help="older data fails open with reason metrics_unavailable (default 3 x the interval)")
    g.add_argument("--prometheus-timeout", metavar="GO_DURATION", default=None, help="per query (default 5s)")


def _output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=FORMATS, default="text",
                   help="text (default), or json / yaml for scripts (durations in seconds, times in RFC 3339)")


def _serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="run the HTTPS admission webhook", description="Run the HTTPS admission "
                           "webhook on a live cluster (--kubeconfig, or in a pod) or on a --snapshot.")
    _logging_flags(serve, argparse.SUPPRESS)
    net = serve.add_argument_group("HTTPS")
    net.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0: every IPv4 address)")
    net.add_argument("--port", type=port, default=8443, help="HTTPS port of the webhook (default 8443)")
    net.add_argument("--tls-cert", required=True, metavar="FILE",
                     help="serving certificate (PEM), with its chain; re-read when it changes")
    net.add_argument("--tls-key", required=True, metavar="FILE", help="private key of --tls-cert (PEM)")
    net.add_argument("--client-ca", metavar="FILE", help="require client certificates signed by this CA (PEM)")
    net.add_argument("--tls-reload-interval", type=_non_negative_float, default=5.0, metavar="SECONDS",
                     help="how often to look for a rotated certificate/key (default 5; 0: never reload)")
    net.add_argument("--metrics-port", type=port_or_off, default=0, metavar="PORT",
                     help="serve /metrics (then only here), /healthz and /readyz over plain HTTP on this port "
                          "(default 0: off, /metrics on the HTTPS port)")
    bounds = serve.add_argument_group("bounds on clients (both ports)")
    bounds.add_argument("--max-body-bytes", type=positive_int, default=MAX_BODY_BYTES, metavar="N",
                        help="larger request bodies get 413 and the connection is closed (default 65536)")
    bounds.add_argument("--max-header-bytes", type=positive_int, default=16 * 1024, metavar="N",
                        help="request line and headers of one request; past it 431 and close (default 16384)")
    bounds.add_argument("--max-headers", type=positive_int, default=100, metavar="N",
                        help="headers in one request; past it 431 and close (default 100)")
    bounds.add_argument("--max-connections", type=positive_int, default=512, metavar="N",
                        help="open connections per port, counted before TLS; a new one past it closes the one "
                             "whose handshake, request or idle wait began longest ago (default 512)")
    bounds.add_argument("--tls-handshake-timeout", default="10s", metavar="GO_DURATION",
                        help="close connections that have not finished TLS within this (default 10s)")
    bounds.add_argument("--request-timeout", default="10s", metavar="GO_DURATION",
                        help="a request must arrive whole within this (slow clients; default 10s)")
    bounds.add_argument("--idle-timeout", default="30s", metavar="GO_DURATION",
                        help="close connections idle this long (default 30s)")
    net.add_argument("--graceful-timeout", default="20s", metavar="GO_DURATION",
                     help="on SIGTERM, wait this long for in-flight requests (default 20s)")
    net.add_argument("--shutdown-drain", default="3s", metavar="GO_DURATION",
                     help="on SIGTERM, report not ready and keep serving this long first (endpoint removal lag; "
                          "default 3s)")
    fx = serve.add_argument_group("side effects (Events, eviction-in-progress annotation, migration history)")
    fx.add_argument("--event-interval", metavar="GO_DURATION", default="1m",
                    help="at most one Event write per VMI and reason per interval (default 1m)")
    fx.add_argument("--side-effect-queue", metavar="N", type=positive_int, default=1000,
                    help="pending Event writes held at most (the oldest is dropped when full); annotation and history "
                         "jobs have a lane of their own, ten times as large (default 1000)")
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
    live = serve.add_argument_group("cluster state")
    _source_flags(live)
    _kube_flags(live)
    live.add_argument("--stale-after", metavar="GO_DURATION", default=None,
                      help="presume an open watch dead after this long without a word from the API server (which "
                           "sends a bookmark about every minute); a broken watch fails open at once (default 2m; "
                           "also staleAfter in --config)")
    live.add_argument("--descheduler-check", action=argparse.BooleanOptionalAction, default=True,
                      help="in live mode, export whether the KubeDescheduler enables background evictions")
    live.add_argument("--descheduler-namespace", default="openshift-kube-descheduler-operator", metavar="NS",
                      help="namespace of the KubeDescheduler object (default openshift-kube-descheduler-operator)")
    _policy_flags(serve)
    _prometheus_flags(serve)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="An admission webhook that keeps rebalancers from churning KubeVirt VMs "
                    "with live migrations; and its tools. Exit status 2: a usage or input error (one line on stderr).")
    parser.add_argument("--version", action="version", version=__version__, help="print the version and exit")
    _logging_flags(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _serve_parser(sub)

    explain = sub.add_parser("explain", help="the decision for one pod, with the reasoning",
                             description="The decision for one eviction of one pod, and what it was made from. "
                                         "Exit status: 0 allowed, 1 denied, 2 usage or input error.")
    _logging_flags(explain, argparse.SUPPRESS)
    explain.add_argument("--namespace", "-n", required=True, type=namespace_name, help="the pod's namespace")
    explain.add_argument("--pod", required=True, help="the pod's name (a virt-launcher pod)")
    explain.add_argument("--requester", default="descheduler",
                         help="who evicts: descheduler (default), or user:NAME for anyone else")
    _output_flag(explain)
    _source_flags(explain)
    _kube_flags(explain)  # without --snapshot: one list of the live cluster
    _policy_flags(explain)
    _prometheus_flags(explain)

    report = sub.add_parser("report", help="every VMI's state (the decision for a descheduler eviction of its pod), "
                                           "cooldown and migration history",
                            description="Every VMI's state: the decision for a descheduler eviction of its launcher "
                                        "pod, its cooldown numbers, the nodes in cooldown and the last migrations.")
    _logging_flags(report, argparse.SUPPRESS)
    _output_flag(report)
    _source_flags(report)
    _kube_flags(report)
    _policy_flags(report)
    _prometheus_flags(report)

    certs = sub.add_parser("certs", help="CA and serving certificate for a Service, and the caBundle",
                           description="Write a CA (ca.crt) and a serving certificate (tls.crt, tls.key) for a "
                                       "Service into --out, and print the caBundle (base64 of ca.crt). For "
                                       "development and self-managed clusters; ECDSA P-256.")
    _logging_flags(certs, argparse.SUPPRESS)
    certs.add_argument("--service", required=True, type=service_name,
                       help="the webhook's Service name (the certificate names SERVICE, SERVICE.NS, SERVICE.NS.svc, "
                            "SERVICE.NS.svc.cluster.local, localhost, 127.0.0.1)")
    certs.add_argument("--namespace", required=True, type=namespace_name, help="the Service's namespace")
    certs.add_argument("--out", required=True, metavar="DIR", help="folder for ca.crt, tls.crt, tls.key (created)")
    certs.add_argument("--days", type=days, default=365,
                       help="validity of the serving certificate in days, 1 to 3650 (default 365; the CA: 10 times)")
    certs.add_argument("--force", action="store_true", help="replace ca.crt, tls.crt and tls.key if they exist")

    unregister = sub.add_parser(
        "unregister", help="delete the guard's webhook configuration (the chart's uninstall hook)",
        description="Delete one MutatingWebhookConfiguration or ValidatingWebhookConfiguration by name, so that "
                    "the API server stops calling the guard before its pods and Service go (the chart runs this as "
                    "a pre-delete hook). Retries 403, 429, 5xx and connection errors until --timeout; a webhook "
                    "configuration already gone is success. Exit status: 0 deleted or absent, 1 not deleted.")
    _logging_flags(unregister, argparse.SUPPRESS)
    unregister.add_argument("--kind", required=True, choices=("mutating", "validating"),
                            help="the webhook configuration's kind (the chart's webhook.type)")
    unregister.add_argument("--name", required=True, type=object_name, help="the webhook configuration's name")
    unregister.add_argument("--timeout", type=_ranged_int(1, 3600, "a number of seconds from 1 to 3600"), default=30,
                            metavar="SECONDS", help="give up after this long (default 30)")
    _kube_flags(unregister)

    from app.sim.options import add_arguments as simulate_arguments

    simulate = sub.add_parser("simulate", help="simulate KubeVirt and the descheduler with and without the guard",
                              description="Simulate KubeVirt and the descheduler with and without the guard "
                                          "(docs/simulator.md).")
    _logging_flags(simulate, argparse.SUPPRESS)
    simulate_arguments(simulate)
    return parser


def configure_logging(args: argparse.Namespace) -> None:
    from app.logs import configure

    configure(args.log_format or DEFAULT_LOG_FORMAT.get(args.command, "text"),
              args.log_level or DEFAULT_LOG_LEVEL.get(args.command, "warning"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `report | head`: the reader has gone, nothing more to say
        sys.stderr.close()
        return 0
    except Exception as e:
        if isinstance(e, refusals()):
            print(f"{PROG}: {e}", file=sys.stderr)
            return EXIT_USAGE
        if logging.getLogger().isEnabledFor(logging.DEBUG):  # the last resort: one line, the traceback at debug
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (--log-level debug shows where)", file=sys.stderr)
        return EXIT_INTERNAL


def refusals() -> tuple[type[Exception], ...]:
    """What a command raises for input it cannot use (imported here: --help and usage errors stay quick)."""
    from app.cluster.kube import KubeConfigError
    from app.cluster.snapshot import SnapshotError
    from app.startup import UsageError
    from app.transport.tls import TLSError

    return SettingsError, KubeConfigError, SnapshotError, TLSError, UsageError


def run(args: argparse.Namespace) -> int:
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
        from app.transport.tls import issue_certs, write_certs

        issued = issue_certs(args.service, args.namespace, days=args.days)
        paths = write_certs(issued, args.out, force=args.force)
        print(f"wrote {paths['ca']}, {paths['cert']}, {paths['key']}", file=sys.stderr)
        print(issued.ca_bundle)
        return 0
    if args.command == "unregister":
        from app.cluster.kube import api_client
        from app.cluster.unregister import KINDS, UnregisterError, delete_webhook_configuration

        try:
            done = delete_webhook_configuration(api_client(args.kubeconfig, args.kube_context), args.kind, args.name,
                                                timeout=args.timeout)
        except UnregisterError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 1
        print(f"{KINDS[args.kind]} {args.name}: " + ("deleted" if done == "deleted" else "already gone"))
        return 0
    raise ValueError(f"unknown command {args.command!r}")
