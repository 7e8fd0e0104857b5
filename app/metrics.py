"""Prometheus metrics (prefix ``kubevirt_eviction_guard_``), one registry per guard.

Labels are bounded: reasons, decisions, kinds, nodes and namespaces; never pod
or VMI names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# ``*_created`` timestamps double the series of every counter and histogram for no alert's benefit
disable_created_metrics()

PREFIX = "kubevirt_eviction_guard_"
COOLDOWN_BUCKETS = (900, 1800, 3600, 7200, 14400, 21600)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Children:
    """``metric.labels(*values)``, looked up once per distinct values and kept: on the request path
    ``labels()`` (validation, a lock, a tuple) costs twice the increment itself. Children are never removed
    from these metrics, so a kept child is the one ``labels()`` would return. The label values are the
    metric's own (bounded) ones, so is this cache."""

    __slots__ = ("children", "metric")

    def __init__(self, metric) -> None:
        self.metric = metric
        self.children: dict[tuple, object] = {}

    def __call__(self, *values: str):
        try:
            return self.children[values]
        except KeyError:
            child = self.children[values] = self.metric.labels(*values)
            return child


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.decisions = Counter(PREFIX + "decisions_total", "Admission decisions", ["decision", "reason"], registry=r)
        self.blocks = Counter(PREFIX + "blocks_total", "Evictions denied", ["reason", "node", "namespace"], registry=r)
        self.effective_cooldown = Histogram(
            PREFIX + "effective_cooldown_seconds", "Effective cooldown of the evictions denied for cooldown (blocks only, as the plugin)",
            buckets=COOLDOWN_BUCKETS, registry=r,
        )
        self.admission_duration = Histogram(
            PREFIX + "admission_duration_seconds", "Time to answer an AdmissionReview", buckets=LATENCY_BUCKETS, registry=r
        )
        self.cache_objects = Gauge(PREFIX + "cache_objects", "Objects in the cluster cache", ["kind"], registry=r)
        self.cache_synced = Gauge(PREFIX + "cache_synced", "1 when the kind has been listed", ["kind"], registry=r)
        self.watch_restarts = Counter(PREFIX + "watch_restarts_total", "Watch restarts", ["kind", "cause"], registry=r)
        self.side_effect_errors = Counter(
            PREFIX + "side_effect_errors_total", "Failed side-effect API calls (each attempt, retried or not)", ["kind"],
            registry=r,
        )
        # side effects (app/effects): outcome is applied | not_needed | failed; kind is annotation | event
        self.side_effects = Counter(PREFIX + "side_effects_total", "Side-effect jobs run, by outcome", ["kind", "outcome"],
                                    registry=r)
        self.side_effects_dropped = Counter(
            PREFIX + "side_effects_dropped_total", "Side-effect jobs dropped because the queue was full", ["kind"], registry=r
        )
        self.side_effect_queue_depth = Gauge(PREFIX + "side_effect_queue_depth", "Side-effect jobs waiting", registry=r)
        self.events_rate_limited = Counter(
            PREFIX + "events_rate_limited_total", "Denials not written at once: held back by the per-VMI rate limit or folded into a pending write",
            ["reason"], registry=r,
        )
        # steering: age of the Prometheus data in use (+Inf before the first answer), query rounds
        self.prometheus_data_age = Gauge(PREFIX + "prometheus_data_age_seconds",
                                         "Age of the usage data from Prometheus that steering decides with", registry=r)
        self.prometheus_queries = Counter(PREFIX + "prometheus_queries_total", "Prometheus query rounds, by outcome",
                                          ["outcome"], registry=r)
        # on | disabled | not_configured | not_found | pending | unreachable | no_data (app/metricsource/steering.py)
        self.steering_state = Gauge(PREFIX + "steering_state", "1 for steering's state: on, or why it is off",
                                    ["state"], registry=r)
        # cause: descheduler | evacuation | user | workload-update | unknown (app/cluster/migrations.py)
        self.migrations = Counter(PREFIX + "migrations_total", "VMIMs seen to finish, by cause and outcome",
                                  ["cause", "outcome"], registry=r)
        # the canceller (--cancel-stuck-evacuations): outcome is cancelled | refused
        self.evacuation_cancels = Counter(PREFIX + "evacuation_cancels_total",
                                          "Stuck descheduler evacuations the guard cancelled (evacuate/cancel), by outcome",
                                          ["outcome", "node", "namespace"], registry=r)
        # loop: history_reconcile | canceller | held_nodes | failing_evacuations: the background loops' finished passes
        self.background_passes = Counter(PREFIX + "background_passes_total",
                                         "Finished passes of the background loops over the cluster state", ["loop"],
                                         registry=r)
        # enabled: "true" | "false"; reason: enabled | disabled | snapshot | no_subresource | forbidden | unknown
        self.canceller_info = Gauge(PREFIX + "evacuation_canceller_info",
                                    "1, labelled with whether the canceller runs and why (not)", ["enabled", "reason"],
                                    registry=r)
        # `node_busy` (node budget): nodes held longer than evacuationStaleAfter (app/effects/held.py)
        self.held_nodes = Gauge(PREFIX + "held_nodes",
                                "Nodes whose leaving VMs have filled the node budget for longer than evacuationStaleAfter",
                                registry=r)
        # evacuations that keep failing, whatever their cause (app/effects/failing.py); cause: app/policy/cause.py
        self.held_node_oldest = Gauge(PREFIX + "held_node_oldest_seconds",
                                      "How long the longest-held of the held nodes has been held (0 when none)",
                                      registry=r)
        # VMs whose cooldown (`cooldown`) runs now, counted every pass of app/effects/failing.py
        self.vms_in_cooldown = Gauge(PREFIX + "vms_in_cooldown", "VMs whose migration cooldown runs now", registry=r)
        self.failing_evacuations = Gauge(PREFIX + "failing_evacuations",
                                         "Evacuations KubeVirt keeps retrying after evacuationStaleAfterFailures failed "
                                         "attempts (or failing for longer than evacuationStaleAfter), by cause",
                                         ["cause"], registry=r)
        self.failing_evacuation_age = Gauge(PREFIX + "failing_evacuation_oldest_seconds",
                                            "Age of the oldest evacuation that keeps failing (0 when none)", registry=r)
        self.pinned_vms = Gauge(PREFIX + "pinned_vms",
                                "VMs whose launcher pod may run on one node only (hostname nodeSelector or required "
                                "node affinity): the descheduler's node-fit check skips them", registry=r)
        self.not_migratable_vms = Gauge(PREFIX + "not_migratable_vms",
                                        "VMs a descheduler eviction would shut down instead of moving (`not_migratable`)",
                                        registry=r)
        # `node_busy` read again before an allow (app/cluster/fresh.py): same | changed (refused after all) | failed
        self.leaver_reads = Counter(PREFIX + "leaver_reads_total",
                                    "Allows confirmed by reading the node's VMIs again, by result", ["result"],
                                    registry=r)
        self.bad_requests = Counter(PREFIX + "bad_requests_total", "Requests answered with a 4xx", ["code"], registry=r)
        # the HTTP bounds (app/transport/http.py); listener is webhook | metrics, reason is capacity |
        # tls_handshake | headers | body | pipelining | upgrade | version | client_certificate | request_timeout
        self.connections_closed = Counter(PREFIX + "connections_closed_total",
                                          "Connections closed by a bound on clients, by listener and reason",
                                          ["listener", "reason"], registry=r)
        self.open_connections = Gauge(PREFIX + "open_connections", "Open connections, counted before TLS",
                                      ["listener"], registry=r)
        # the children counted on the request path (see Children)
        self.decisions_by = Children(self.decisions)
        self.blocks_by = Children(self.blocks)
        self.bad_requests_by = Children(self.bad_requests)
        self.leaver_reads_by = Children(self.leaver_reads)
        self.events_rate_limited_by = Children(self.events_rate_limited)
        self.side_effects_dropped_by = Children(self.side_effects_dropped)

    def set_canceller(self, reason: str) -> None:
        """One series: the canceller's state (``enabled`` is the only reason it runs)."""
        self.canceller_info.clear()
        self.canceller_info.labels("true" if reason == "enabled" else "false", reason).set(1)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
