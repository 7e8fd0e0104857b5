"""Inputs and outputs of policy: what an eviction asks, what the guard answers."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.domain.records import LauncherPod, VMIRecord

DESCHEDULER_REQUESTER = "sigs.k8s.io/descheduler"
SCOPE_DESCHEDULER = "descheduler"
SCOPE_ALL = "all"


class Reason:
    """Reason labels of the decision table (docs/decisions.md), in table order."""

    NOT_AN_EVICTION = "not_an_eviction"
    CACHE_NOT_READY = "cache_not_ready"
    CACHE_STALE = "cache_stale"
    NOT_A_VM_POD = "not_a_vm_pod"
    VMI_NOT_FOUND = "vmi_not_found"
    MIGRATION_TARGET = "migration_target"
    EVACUATION_STUCK = "evacuation_stuck"
    MIGRATION_IN_PROGRESS = "migration_in_progress"
    EVACUATION_PENDING = "evacuation_pending"
    NOT_MIGRATABLE = "not_migratable"
    PREFER_NO_EVICTION = "prefer_no_eviction"
    NODE_BUSY = "node_busy"
    NODE_COOLDOWN = "node_cooldown"
    TARGET_NODE_COOLDOWN = "target_node_cooldown"
    COOLDOWN = "cooldown"
    METRICS_UNAVAILABLE = "metrics_unavailable"
    NO_GAIN = "no_gain"
    BETTER_CANDIDATE = "better_candidate"
    ALLOWED = "allowed"


@dataclass(slots=True, frozen=True)
class PolicySettings:
    """Policy settings in seconds (config.py parses and validates the Go-duration spelling)."""

    migration_cooldown: float = 15 * 60
    max_migration_cooldown: float = 6 * 3600
    migration_history_window: float = 48 * 3600
    cooldown_scope: str = SCOPE_DESCHEDULER
    descheduler_users: frozenset[str] = frozenset()
    pending_evacuations_per_node: int = 1
    # a node held by `node_busy` longer than this is shown (Event, gauge, alert); also `evacuation_stuck`'s "stuck by age"
    evacuation_stale_after: float = 3600.0
    # a descheduler-caused evacuation with this many failed attempts is stuck (`evacuation_stuck` and `node_busy`); 0: by age only
    evacuation_stale_after_failures: int = 3
    # steering (only with Prometheus data): score points, 0..100
    steering_min_gain: float = 5.0  # best move must lower the higher of hot/target score by this much
    steering_margin: float = 5.0  # another VM must beat this one by more than this to hold it back
    honor_prefer_no_eviction: bool = True
    refuse_not_migratable: bool = True  # `not_migratable`
    # node cooldowns (0 = off): floor, doubled per descheduler move of the node within
    # node_cooldown_window (0 = never doubled), capped at max_node_cooldown (0 = no cap)
    node_cooldown: float = 0.0
    target_node_cooldown: float = 0.0
    node_cooldown_window: float = 3600.0
    max_node_cooldown: float = 3600.0
    # `target_node_cooldown` only while the node also sent a VM away (descheduler) within its target-node cooldown: churn
    target_node_cooldown_churn_only: bool = False


@dataclass(slots=True, frozen=True)
class EvictionAttempt:
    """One pods/eviction admission request, as policy needs it, already type-checked (not the Kubernetes
    lifecycle.k8s.io EvictionRequest kind: an attempt is one imperative eviction call)."""

    operation: str
    resource: str  # request.resource.resource
    subresource: str
    namespace: str  # pod namespace, from the URL
    name: str  # pod name, from the URL
    username: str = ""
    requested_by: str = ""  # Eviction annotation requested-by
    eviction_reason: str = ""  # Eviction annotation reason (descheduler profile/strategy)
    dry_run: bool = False

    @property
    def is_eviction(self) -> bool:
        return self.operation == "CREATE" and self.resource == "pods" and self.subresource == "eviction"


@dataclass(slots=True, frozen=True)
class Review:
    """A decoded AdmissionReview request (``app.admission.review.decode``): its version, uid, and the attempt.
    Here, not in the codec, because the side effects of a decision read it too."""

    api_version: str
    uid: str
    eviction: EvictionAttempt


@dataclass(slots=True, frozen=True)
class Decision:
    allowed: bool
    reason: str
    message: str
    vmi: VMIRecord | None = None
    pod: LauncherPod | None = None
    node: str = ""
    remaining: float | None = None  # seconds left of the cooldown (`cooldown`)
    cooldown: object | None = None  # CooldownState when computed
    leaving: tuple[str, ...] = field(default=())  # `node_busy`: the other VMs leaving, "NS/NAME"
    ranking: object | None = None  # steering: steering.Ranking when computed
    dry_run: bool = False
    # `node_busy` counted this node's leavers and found room: an allow the server confirms with a fresh read
    budget_node: str = ""

    @property
    def denied(self) -> bool:
        return not self.allowed

    @property
    def background(self) -> bool:
        """`migration_in_progress` and `evacuation_pending`: the descheduler should count this eviction as running in the background."""
        return self.reason in (Reason.MIGRATION_IN_PROGRESS, Reason.EVACUATION_PENDING)
