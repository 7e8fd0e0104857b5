"""The decision table of docs/decisions.md, rule by rule, first match wins.

``decide`` reads like the table; each rule's judgement is a small function
below it. Nothing here does I/O or reads a clock: the cluster view, the time
and the settings are parameters, so the same inputs give the same decision in
every replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.kinds import NODE, POD, VMI, VMIM
from app.domain.records import (
    DESCHEDULER_PRIORITY,
    DESCHEDULER_SOURCE,
    DRAIN_PRIORITY,
    EXEMPT_OVERRIDE,
    EXTERNAL,
    LIVE_MIGRATE_IF_POSSIBLE,
    PREFER_NO_EVICTION,
    RECEIVE,
    SEND_TO,
    STRATEGY_NONE,
    KubeVirtRecord,
    LauncherPod,
    MigrationRecord,
    NodeRecord,
    VMIRecord,
    arrived_by_state,
)
from app.domain.usage import UsageSnapshot
from app.domain.view import HEALTHY, CacheHealth, ClusterView
from app.policy.cause import DRAIN
from app.policy.cooldown import cooldown_state, relevant_migrations
from app.policy.model import DESCHEDULER_REQUESTER, SCOPE_ALL, Decision, EvictionAttempt, PolicySettings, Reason
from app.policy.nodecool import ARRIVED, LEFT, NodeCooldown, descheduler_caused, node_cooldown
from app.policy.steering import Ranking, rank
from app.timefmt import format_duration

COMPLETED_PHASES = ("Succeeded", "Failed")
BACKGROUND_TEXT = 'Evacuation in progress: Eviction triggered evacuation of VMI "{ns}/{name}"'
MAX_NAMES = 5


def decide(
    req: EvictionAttempt,
    view: ClusterView,
    now: float,
    settings: PolicySettings,
    health: CacheHealth = HEALTHY,
    usage: UsageSnapshot | None = None,
) -> Decision:
    """``usage`` None: steering is off; a snapshot (even an empty one) turns it on."""
    dry = req.dry_run
    # 1. not a CREATE of pods/eviction
    if not req.is_eviction:
        return _allow(Reason.NOT_AN_EVICTION, "not a CREATE of pods/eviction; the guard only judges evictions", dry)
    # 2. state not yet synced (and, for the kinds a rule reads, not stale)
    if not health.ready:
        kinds = ", ".join(sorted(health.not_synced))
        return _allow(Reason.CACHE_NOT_READY, f"cluster state not synced yet ({kinds}); failing open", dry)
    if POD in health.stale:
        return _stale(health, dry)
    # 3. not a VM's launcher pod, or completed
    pod = view.pod(req.namespace, req.name)
    if not is_vm_pod(pod):
        return _allow(Reason.NOT_A_VM_POD, f"pod {req.namespace}/{req.name} is not a running virt-launcher pod", dry)
    assert pod is not None
    if VMI in health.stale or VMIM in health.stale:
        return _stale(health, dry, pod=pod)
    # 4. VMI unknown
    vmi = view.vmi(pod.namespace, pod.vmi_name)
    if vmi is None:
        return _allow(Reason.VMI_NOT_FOUND, f'VMI "{pod.namespace}/{pod.vmi_name}" not found; failing open', dry, pod=pod)
    migrations = relevant_migrations(vmi, view.migrations(vmi.namespace, vmi.name))
    # 5. the pod is the target of a migration
    if is_migration_target(pod, vmi, view):
        msg = f'Eviction request for target Pod of VMI "{vmi.namespace}/{vmi.name}": a live migration to this pod is in flight'
        return _deny(Reason.MIGRATION_TARGET, msg, dry, vmi, pod)
    # 5a. the VM's descheduler-caused evacuation is stuck: a plain 429, so the descheduler stops counting it in flight
    if is_descheduler(req, settings) and NODE not in health.stale:
        stuck = stuck_evacuation(vmi, migrations, view.node(pod.node), now, settings)
        if stuck is not None and stuck.node == pod.node:
            msg = (f'the evacuation of VMI "{vmi.namespace}/{vmi.name}" from node "{pod.node}" is stuck ({stuck.why});'
                   " KubeVirt keeps retrying it, the descheduler should choose another candidate")
            return _deny(Reason.EVACUATION_STUCK, msg, dry, vmi, pod)
    # 6. a migration of this VMI is in flight
    in_flight = describe_in_flight(vmi, migrations, now)
    if in_flight:
        return _deny(Reason.MIGRATION_IN_PROGRESS, f"{_background(vmi)}: {in_flight}", dry, vmi, pod)
    # 7. the VMI is marked for evacuation from this pod's node
    if vmi.evacuation_node and vmi.evacuation_node == pod.node:
        msg = f'{_background(vmi)}: VMI is marked for evacuation from node "{pod.node}", its migration is pending'
        return _deny(Reason.EVACUATION_PENDING, msg, dry, vmi, pod)
    # exemptions from `prefer_no_eviction`, `node_busy` and `cooldown`: the VM's own annotation, scope and drains
    if vmi.overrides is not None and vmi.overrides.exempt:
        return _allow(Reason.ALLOWED, f'VMI is exempt ({EXEMPT_OVERRIDE}: "true"): only the in-flight rules apply',
                      dry, vmi, pod)
    descheduler = is_descheduler(req, settings)
    if not descheduler and settings.cooldown_scope != SCOPE_ALL:
        return _allow(Reason.ALLOWED, "not a descheduler eviction: cooldown and node budget do not apply", dry, vmi, pod)
    if NODE in health.stale:
        return _stale(health, dry, vmi=vmi, pod=pod)
    node = view.node(pod.node)
    if node is not None and node.draining:
        return _allow(Reason.ALLOWED, f'node "{pod.node}" is being drained ({node.drain}): drains are never held back',
                      dry, vmi, pod)
    # 7n. the VM cannot live-migrate: KubeVirt would let the eviction through and the VM would stop
    if descheduler and settings.refuse_not_migratable:
        why = not_migratable(vmi, view.kubevirt())
        if why is not None:
            msg = (f'VMI "{vmi.namespace}/{vmi.name}" cannot live-migrate ({why}): KubeVirt would let this eviction '
                   "through and the VM would be shut down, not moved; choose another candidate")
            return _deny(Reason.NOT_MIGRATABLE, msg, dry, vmi, pod)
    # 7a. the VM prefers not to be evicted by the descheduler
    if descheduler and settings.honor_prefer_no_eviction and (vmi.prefer_no_eviction or pod.prefer_no_eviction):
        msg = (f'VMI "{vmi.namespace}/{vmi.name}" prefers not to be evicted by the descheduler ({PREFER_NO_EVICTION});'
               " choose another candidate")
        return _deny(Reason.PREFER_NO_EVICTION, msg, dry, vmi, pod)
    # 8. the node already has VMs leaving (until each departure ends: stuck and waiting ones too)
    budget = settings.pending_evacuations_per_node
    counted = ""  # the node whose leavers were counted and found under budget
    if budget > 0:
        counted = pod.node
        leaving = others_leaving(pod.node, vmi, view)
        if len(leaving) >= budget:
            shown = [describe_leaver(key, view, pod.node, now, settings) for key in leaving[:MAX_NAMES]]
            names = ", ".join(shown) + (", ..." if len(leaving) > MAX_NAMES else "")
            msg = f'node "{pod.node}" already has {len(leaving)} VM(s) leaving ({names}); retry after they finish'
            return _deny(Reason.NODE_BUSY, msg, dry, vmi, pod, leaving=tuple(f"{ns}/{n}" for ns, n in leaving))
    # 8b. the descheduler moved a VM off this node a short while ago
    rest = source_cooldown(pod.node, view, now, settings)
    if rest is not None and rest.active:
        return _deny(Reason.NODE_COOLDOWN, _node_rest_text(rest, settings), dry, vmi, pod, remaining=rest.remaining,
                     cooldown=rest)
    # 8c. the descheduler moved a VM onto this node a short while ago
    rest = target_cooldown(pod.node, view, now, settings)
    if rest is not None and rest.active:
        return _deny(Reason.TARGET_NODE_COOLDOWN, _node_rest_text(rest, settings), dry, vmi, pod,
                     remaining=rest.remaining, cooldown=rest)
    # 9. cooldown
    state = cooldown_state(vmi, migrations, now, settings)
    if state is not None and state.active:
        plural = "migration" if state.count == 1 else "migrations"
        msg = (
            f'VMI "{vmi.namespace}/{vmi.name}" is in migration cooldown: last migration finished '
            f"{format_duration(now - state.last_end)} ago, cooldown {format_duration(state.cooldown)} "
            f"({state.count} {plural} in the last {format_duration(settings.migration_history_window)}), "
            f"retry in {format_duration(state.remaining)}"
        )
        return _deny(Reason.COOLDOWN, msg, dry, vmi, pod, remaining=state.remaining, cooldown=state)
    # 10. steering: another VM on this node would help more, or no move helps enough
    ranking = None
    if usage is not None and descheduler:
        if not usage.usable(now):
            return _allow(Reason.METRICS_UNAVAILABLE, f"{_usage_problem(usage, now)}; failing open", dry, vmi, pod,
                          cooldown=state, budget_node=counted)
        ranking = steering_ranking(pod.node, vmi, view, now, settings, usage)
        mine = ranking.of(vmi.key) if ranking is not None else None
        if ranking is None or mine is None:
            what = "this VMI" if ranking is not None else f'node "{pod.node}" or a target node'
            return _allow(Reason.METRICS_UNAVAILABLE, f"no usage data for {what} in Prometheus; failing open", dry, vmi,
                          pod, cooldown=state, budget_node=counted)
        best = ranking.best
        assert best is not None
        if best.gain < settings.steering_min_gain:
            msg = (f'no VM on node "{pod.node}" would lower its score ({ranking.hot_score:.0f}) by '
                   f"{settings.steering_min_gain:g} points or more: the best, {best.name}, "
                   f"{_gain(best.gain)} (target {ranking.target}); the move would not help")
            return _deny(Reason.NO_GAIN, msg, dry, vmi, pod, cooldown=state, ranking=ranking)
        if best.key != mine.key and mine.gain < best.gain - settings.steering_margin:
            msg = (f'moving {best.name} would help node "{pod.node}" more: {_gain(best.gain)} against '
                   f"{_gain(mine.gain)} for this VMI (score {ranking.hot_score:.0f}, target {ranking.target}); "
                   "waiting for the descheduler to pick it")
            return _deny(Reason.BETTER_CANDIDATE, msg, dry, vmi, pod, cooldown=state, ranking=ranking)
    # 11. otherwise
    return _allow(Reason.ALLOWED, "no migration in flight, node not busy, not in cooldown", dry, vmi, pod, cooldown=state,
                  ranking=ranking, budget_node=counted)


# ---- rule judgements ---------------------------------------------------------


def source_cooldown(node: str, view: ClusterView, now: float, settings: PolicySettings) -> NodeCooldown | None:
    """`node_cooldown`: the node's rest after the descheduler's last move off it (None: off, or no such move)."""
    return node_cooldown(node, LEFT, view.moves_from(node), view, now, settings.node_cooldown,
                         settings.node_cooldown_window, settings.max_node_cooldown)


def target_cooldown(node: str, view: ClusterView, now: float, settings: PolicySettings) -> NodeCooldown | None:
    """`target_node_cooldown`: the node's rest after the descheduler's last move onto it: evicting from it now is ping-pong.
    With ``targetNodeCooldownChurnOnly`` only while the node also sent a VM away within that rest (it both
    receives and sends: churn); a node that only receives, or only sends, is left to the descheduler."""
    rest = node_cooldown(node, ARRIVED, view.moves_to(node), view, now, settings.target_node_cooldown,
                         settings.node_cooldown_window, settings.max_node_cooldown)
    if rest is None or not rest.active or not settings.target_node_cooldown_churn_only:
        return rest
    since = now - rest.cooldown
    sent = any(m.end is not None and since < m.end <= now and descheduler_caused(m, view) for m in view.moves_from(node))
    return rest if sent else None


def steering_ranking(node: str, vmi: VMIRecord, view: ClusterView, now: float, settings: PolicySettings,
                     usage: UsageSnapshot) -> Ranking | None:
    """Steering: the VMs on ``node`` that the descheduler could still move (this one, and
    those not leaving, not migrating, not in cooldown), ranked by predicted gain.
    Targets exclude nodes being drained."""
    movable = []
    for key, vm in usage.vms_on(node):
        if key != vmi.key and not is_movable(view, key, node, now, settings):
            continue
        movable.append((key, vm))
    excluded = {n for n in usage.nodes if (rec := view.node(n)) is not None and rec.draining}
    return rank(usage.nodes, usage.averages, node, movable, excluded)


def is_movable(view: ClusterView, key: tuple[str, str], node: str, now: float, settings: PolicySettings) -> bool:
    other = view.vmi(*key)
    if other is None or other.node != node or other.evacuation_node:
        return False
    if settings.honor_prefer_no_eviction and other.prefer_no_eviction:
        return False  # `prefer_no_eviction` refuses it: holding the others back for it would hold the node for ever
    if settings.refuse_not_migratable and not_migratable(other, view.kubevirt()) is not None:
        return False  # `not_migratable` refuses it, likewise
    migrations = relevant_migrations(other, view.migrations(other.namespace, other.name))
    if describe_in_flight(other, migrations, now):
        return False
    state = cooldown_state(other, migrations, now, settings)
    return state is None or not state.active


def is_vm_pod(pod: LauncherPod | None) -> bool:
    """`not_a_vm_pod`: a launcher pod of a VM that is not completed."""
    return pod is not None and pod.is_launcher and bool(pod.vmi_name) and pod.phase not in COMPLETED_PHASES


def is_migration_target(pod: LauncherPod, vmi: VMIRecord, view: ClusterView) -> bool:
    """`migration_target`: the VM runs elsewhere, or the pod belongs to an unfinished migration."""
    if vmi.node and pod.node != vmi.node:
        return True
    job = pod.migration_job_uid
    if not job:
        return False
    state = vmi.migration
    if state is not None and state.uid == job and state.in_flight:
        return True
    return view.unfinished_migration(job) is not None


def describe_in_flight(vmi: VMIRecord, migrations: Sequence[MigrationRecord], now: float) -> str:
    """`migration_in_progress`: what is in flight for this VMI ("" when nothing): its ``migrationState``
    started and not ended, or a VMIM in a non-final phase (queued or running, which
    KubeVirt shows on the VMIM before the VMI's ``migrationState`` has it)."""
    state = vmi.migration
    blocked = blocking_migration(migrations)
    waiting = f"; waiting: {blocked_text(blocked)}" if blocked is not None else ""
    if state is not None and state.in_flight:
        since = f" {format_duration(now - state.start)} ago" if state.start is not None else ""
        route = f" from {state.source_node or '?'} to {state.target_node or '?'}"
        return f"live migration{route} started{since} is in flight{waiting}"
    pending = [m for m in migrations if not m.finished]
    if pending:
        m = blocked if blocked is not None else min(pending, key=lambda m: m.created or 0.0)
        kind = {SEND_TO: "decentralized migration (sendTo: leaving for another namespace or cluster) ",
                RECEIVE: "decentralized migration (receive: arriving from another namespace or cluster) "}.get(
                    m.decentralized, "migration ")
        return f"{kind}{m.namespace}/{m.name} is {m.phase or 'queued'}{waiting}"
    return ""


def is_descheduler(req: EvictionAttempt, settings: PolicySettings) -> bool:
    """The eviction comes from the descheduler: its requested-by annotation, or a user in ``deschedulerUsers``."""
    return req.requested_by == DESCHEDULER_REQUESTER or req.username in settings.descheduler_users


def in_scope(req: EvictionAttempt, settings: PolicySettings) -> bool:
    """Cooldown and node budget apply to descheduler evictions (or to all, by setting)."""
    return settings.cooldown_scope == SCOPE_ALL or is_descheduler(req, settings)


def others_leaving(node: str, vmi: VMIRecord, view: ClusterView) -> list[tuple[str, str]]:
    """`node_busy`: the other VMs leaving ``node``, sorted (namespace, name). Every departure counts until it
    ends: the VM left, or it is no longer marked and has no unfinished VMIM. A stuck or a waiting one
    counts too: letting a second VM go beside it is the second retry loop the budget exists to prevent."""
    out = []
    key = vmi.key
    kubevirt = view.kubevirt()
    for other in view.leaving_candidates(node):
        if other.key == key:
            continue
        migrations = relevant_migrations(other, view.migrations(other.namespace, other.name))
        if is_leaving(other, migrations, node) and not awaits_external_controller(other, migrations, kubevirt):
            out.append(other.key)
    out.sort()
    return out


def eviction_strategy(vmi: VMIRecord, kubevirt: KubeVirtRecord | None) -> str:
    """The VMI's ``spec.evictionStrategy``, else the KubeVirt CR's (KubeVirt's default when it sets none); "" when
    neither is known."""
    if vmi.eviction_strategy:
        return vmi.eviction_strategy
    return kubevirt.effective_eviction_strategy if kubevirt is not None else ""


def awaits_external_controller(vmi: VMIRecord, migrations: Sequence[MigrationRecord],
                               kubevirt: KubeVirtRecord | None) -> bool:
    """Marked for evacuation with ``evictionStrategy: External`` and nothing migrating it: it waits for its
    external controller, not for KubeVirt. virt-api marks such a VM, and KubeVirt's evacuation controller never
    migrates it (``VMIMigratableOnEviction`` is false for External). The controllers that use it replace the VM
    rather than move it (the KubeVirt cloud provider deletes the tenant cluster's Machine; cluster-api-provider-
    kubevirt reports the Machine failed for its MachineHealthCheck to replace), on their own schedule, however
    long the mark stays. So it is no live migration leaving the node: `node_busy` (``node_busy``) does not count it,
    and it holds no node. Once a migration of it runs (a VMIM its controller created), it counts as any other."""
    if not vmi.evacuation_node or eviction_strategy(vmi, kubevirt) != EXTERNAL:
        return False
    if vmi.migration is not None and vmi.migration.in_flight:
        return False
    return all(m.finished for m in migrations)


def is_leaving(vmi: VMIRecord, migrations: Sequence[MigrationRecord], node: str) -> bool:
    """Marked for evacuation from ``node``, or migrating away from it (its in-flight ``migrationState``, or
    an unfinished VMIM while it runs there). The receiving side of a decentralized migration leaves nothing."""
    if vmi.evacuation_node == node:
        return True
    state = vmi.migration
    if state is not None and state.in_flight and (state.source_node or vmi.node) == node \
            and not arrived_by_state(vmi, migrations):
        return True
    return vmi.node == node and any(not m.finished and m.decentralized != RECEIVE for m in migrations)


@dataclass(slots=True, frozen=True)
class Leaver:
    """One VM leaving a node, as people need to see it: how long, and whether it is stuck or waiting."""

    namespace: str
    name: str
    age: float | None  # seconds since its departure began; None if unknown
    stuck: StuckEvacuation | None = None
    blocked: MigrationRecord | None = None  # its unfinished VMIM that a KubeVirt condition holds back

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def state(self) -> str:
        """"" for an ordinary departure, else "stuck: WHY" or "waiting: CONDITION: REASON"."""
        if self.blocked is not None:
            return f"waiting: {blocked_text(self.blocked)}"
        if self.stuck is not None:
            return f"stuck: {self.stuck.why}"
        return ""


def leaver(vmi: VMIRecord, migrations: Sequence[MigrationRecord], node: str, node_rec: NodeRecord | None, now: float,
           settings: PolicySettings) -> Leaver:
    age = leaving_age(vmi, migrations, node, now)
    blocked = blocking_migration(migrations)
    stuck = None if blocked is not None else stuck_evacuation(vmi, migrations, node_rec, now, settings, age=age)
    return Leaver(vmi.namespace, vmi.name, age, stuck, blocked)


def describe_leaver(key: tuple[str, str], view: ClusterView, node: str, now: float, settings: PolicySettings) -> str:
    """ "NS/NAME", with "(stuck: ...)" or "(waiting: ...)" when its departure is not an ordinary one."""
    other = view.vmi(*key)
    if other is None:
        return "/".join(key)
    migrations = relevant_migrations(other, view.migrations(*key))
    one = leaver(other, migrations, node, view.node(node), now, settings)
    return f"{one.ref} ({one.state})" if one.state else one.ref


def leavers(node: str, view: ClusterView, now: float, settings: PolicySettings) -> list[Leaver]:
    """Every VM leaving ``node`` (`node_busy`'s count), oldest departure first (unknown ages last)."""
    node_rec = view.node(node)
    kubevirt = view.kubevirt()
    out = []
    for vmi in view.leaving_candidates(node):
        migrations = relevant_migrations(vmi, view.migrations(vmi.namespace, vmi.name))
        if is_leaving(vmi, migrations, node) and not awaits_external_controller(vmi, migrations, kubevirt):
            out.append(leaver(vmi, migrations, node, node_rec, now, settings))
    out.sort(key=lambda x: (x.age is None, -(x.age or 0.0), x.namespace, x.name))
    return out


@dataclass(slots=True, frozen=True)
class HeldNode:
    """A node `node_busy` holds (its leavers fill the budget) for longer than ``evacuationStaleAfter``."""

    node: str
    held_for: float  # seconds since the budget filled: the age of the budget-th oldest departure
    holders: tuple[Leaver, ...]  # the oldest departures, the ones that fill the budget


def held_node(node: NodeRecord, view: ClusterView, now: float, settings: PolicySettings) -> HeldNode | None:
    """The node as `node_busy` sees it: held for longer than ``evacuationStaleAfter`` (None otherwise, and for a
    node being drained, which `node_busy` never holds)."""
    budget = settings.pending_evacuations_per_node
    if budget <= 0 or node.draining:
        return None
    out = leavers(node.name, view, now, settings)
    if len(out) < budget:
        return None
    holders = tuple(out[:budget])
    held_for = holders[-1].age
    if held_for is None or held_for <= settings.evacuation_stale_after:
        return None
    return HeldNode(node.name, held_for, holders)


def fix_for(one: Leaver) -> str:
    """What an admin can do about a departure that holds a node."""
    ref = f"virtctl evacuate-cancel vmi {one.name} -n {one.namespace}"
    if one.blocked is not None:
        return (f"it waits for KubeVirt ({one.blocked.blocked}); resolve that, or stop the evacuation "
                f"({ref}); the guard never cancels a waiting evacuation")
    if one.stuck is not None:
        return (f"{ref} (KubeVirt then creates no new migration), or let the guard's canceller do it "
                "(--cancel-stuck-evacuations, on by default where KubeVirt serves evacuate/cancel)")
    return f"wait for its migration, or stop KubeVirt's retries with {ref}"


def blocking_migration(migrations: Sequence[MigrationRecord]) -> MigrationRecord | None:
    """An unfinished VMIM that a KubeVirt condition holds back (a backup, a quota, ...): the migration
    waits, it is not failing."""
    return next((m for m in migrations if m.blocked and not m.finished), None)


def blocked_text(m: MigrationRecord) -> str:
    return f"{m.blocked}" + (f" ({m.blocked_reason})" if m.blocked_reason else "")


def not_migratable(vmi: VMIRecord, kubevirt: KubeVirtRecord | None) -> str | None:
    """`not_migratable`: why an eviction would shut the VM down instead of moving it, as KubeVirt's eviction
    admitter decides (``VMIMigratableOnEviction``); None when it would move it, or when we cannot tell
    (no strategy on the VMI and no KubeVirt CR known; a LiveMigratable condition that is absent)."""
    if vmi.eviction_strategy:
        strategy, where = vmi.eviction_strategy, "spec.evictionStrategy"
    elif kubevirt is not None:
        strategy = kubevirt.effective_eviction_strategy
        where = ("the KubeVirt CR's evictionStrategy" if kubevirt.eviction_strategy
                 else "KubeVirt's default: the KubeVirt CR sets no evictionStrategy")
    else:
        return None
    if strategy == STRATEGY_NONE:
        return f"evictionStrategy {STRATEGY_NONE}, from {where}"
    if strategy == LIVE_MIGRATE_IF_POSSIBLE and vmi.migratable and vmi.migratable != "True":
        because = vmi.migratable_reason or "no reason given"
        return f"LiveMigratable {vmi.migratable}: {because}; evictionStrategy {strategy}, from {where}"
    return None


def leaving_age(vmi: VMIRecord, migrations: Sequence[MigrationRecord], node: str, now: float) -> float | None:
    """How long the VM has been leaving ``node``, from the earliest evidence; None if unknown.

    Evidence: the in-flight migration's start; the oldest unfinished VMIM; and the
    first evacuation VMIM for ``node`` since the VM's last successful migration (the
    start of the current evacuation episode, so that a VM whose migrations keep
    failing ages and stops freezing its node after ``evacuationStaleAfter``).
    """
    # Plain loops, no intermediate lists: this runs for every VM leaving the node, per request.
    earliest: float | None = None
    state = vmi.migration
    if state is not None and state.in_flight and state.start is not None:
        earliest = state.start
    last_success: float | None = None
    for m in migrations:
        if m.phase == "Succeeded" and m.created is not None and (last_success is None or m.created > last_success):
            last_success = m.created
    for m in migrations:
        created = m.created
        if created is None:
            continue
        unfinished = not m.finished
        episode = m.evacuation_node == node and (last_success is None or created >= last_success)
        if (unfinished or episode) and (earliest is None or created < earliest):
            earliest = created
    return None if earliest is None else now - earliest


@dataclass(slots=True, frozen=True)
class StuckEvacuation:
    """A descheduler-caused evacuation that keeps failing (`evacuation_stuck` and `node_busy`, and the canceller)."""

    namespace: str
    name: str
    node: str  # status.evacuationNodeName
    failures: int  # failed attempts in this evacuation episode (KubeVirt keeps the last 5 VMIMs)
    age: float | None  # seconds since the episode began; None if unknown
    why: str
    running: bool  # an attempt is queued or running now (cancel does not abort it)


def evacuation_episode(vmi: VMIRecord, migrations: Sequence[MigrationRecord], node: str) -> list[MigrationRecord]:
    """The VMIMs of the current evacuation from ``node``: created since the VMI's last
    successful migration (oldest first)."""
    last_success: float | None = None
    for m in migrations:
        if m.phase == "Succeeded" and m.created is not None and (last_success is None or m.created > last_success):
            last_success = m.created
    episode = [m for m in migrations if m.evacuation_node == node and m.created is not None
               and (last_success is None or m.created >= last_success)]
    episode.sort(key=lambda m: m.created or 0.0)
    return episode


def is_descheduler_caused(vmi: VMIRecord, episode: Sequence[MigrationRecord]) -> bool:
    """The descheduler's eviction marked the VM: VMI annotation ``kubevirt.io/eviction-source:
    descheduler`` or a ``system-maintenance`` VMIM, and no ``system-critical`` one (a drain's) nor one the guard
    recorded as a drain's (``policy.cause``). A VMIM recorded as the descheduler's is no evidence for the episode:
    after a cancel the episode keeps the cancelled VMIMs, and a later eviction by someone else continues it."""
    if any(m.priority == DRAIN_PRIORITY or (not m.priority and m.evacuation_node and m.recorded_cause == DRAIN)
           for m in episode):
        return False
    return vmi.eviction_source == DESCHEDULER_SOURCE or any(m.priority == DESCHEDULER_PRIORITY for m in episode)


def stuck_evacuation(vmi: VMIRecord, migrations: Sequence[MigrationRecord], node: NodeRecord | None, now: float,
                     settings: PolicySettings, age: float | None = None) -> StuckEvacuation | None:
    """The VM's evacuation is stuck: caused by the descheduler, not part of a drain, not waiting on a
    KubeVirt condition (``blocking_migration``), and ``evacuationStaleAfterFailures`` failed attempts or
    older than ``evacuationStaleAfter``.

    ``node`` is the node being left (None: unknown, taken as not draining); ``age`` saves
    recomputing it when the caller has it. The VM is leaving when it is marked, or when a
    retry VMIM of the evacuation is still queued (KubeVirt creates it held back by its
    backoff; a cancel clears the mark but does not remove it)."""
    source = vmi.evacuation_node or next((m.evacuation_node for m in migrations if not m.finished and m.evacuation_node), "")
    if not source or (node is not None and node.draining):
        return None
    if blocking_migration(migrations) is not None:
        return None  # waiting for KubeVirt (a backup, a quota, ...): blocked is not stuck
    episode = evacuation_episode(vmi, migrations, source)
    if not is_descheduler_caused(vmi, episode):
        return None
    failures = sum(1 for m in episode if m.phase == "Failed")
    if age is None:
        age = leaving_age(vmi, migrations, source, now)
    limit = settings.evacuation_stale_after_failures
    if limit > 0 and failures >= limit:
        why = f"{failures} failed attempts" + (f" in {format_duration(age)}" if age is not None else "")
    elif age is not None and age > settings.evacuation_stale_after:
        why = f"leaving for {format_duration(age)}, {failures} failed attempts"
    else:
        return None
    running = any(not m.finished for m in migrations) or (vmi.migration is not None and vmi.migration.in_flight)
    return StuckEvacuation(vmi.namespace, vmi.name, source, failures, age, why, running)


# ---- helpers -----------------------------------------------------------------


def _background(vmi: VMIRecord) -> str:
    return BACKGROUND_TEXT.format(ns=vmi.namespace, name=vmi.name)


def _usage_problem(usage: UsageSnapshot, now: float) -> str:
    age = usage.age(now)
    if age is None:
        detail = f": {usage.error}" if usage.error else ""
        return f"no usage data from Prometheus yet{detail}"
    if not usage.nodes:
        return "Prometheus returned no node scores"
    return (f"usage data from Prometheus is {format_duration(age)} old (limit {format_duration(usage.max_age)})"
            + (f"; last error: {usage.error}" if usage.error else ""))


def _node_rest_text(rest: NodeCooldown, settings: PolicySettings) -> str:
    m = rest.last
    assert m.end is not None
    moved = (f"VMI {m.namespace}/{m.vmi_name} left it for {m.target_node or '?'}" if rest.direction == LEFT
             else f"VMI {m.namespace}/{m.vmi_name} arrived from {m.source_node or '?'}")
    what = "node cooldown" if rest.direction == LEFT else (
        "target-node cooldown" if not settings.target_node_cooldown_churn_only
        else "target-node cooldown (it also sent a VM away: churn)")
    moves = "move" if rest.count == 1 else "moves"
    window = (f" ({rest.count} descheduler {moves} in the last {format_duration(settings.node_cooldown_window)})"
              if settings.node_cooldown_window > 0 else "")
    return (f'node "{rest.node}" is in {what}: {moved} {format_duration(rest.cooldown - rest.remaining)} ago '
            f"(descheduler), cooldown {format_duration(rest.cooldown)}{window}, {format_duration(rest.remaining)} left; "
            "choose a VM on another node")


def _gain(points: float) -> str:
    return f"lowers it by {points:.1f} points" if points >= 0 else f"raises it by {-points:.1f} points"


def _stale(health: CacheHealth, dry: bool, vmi: VMIRecord | None = None, pod: LauncherPod | None = None) -> Decision:
    kinds = ", ".join(sorted(health.stale))
    msg = f"watch of {kinds} broken for longer than the staleness threshold; failing open"
    return _allow(Reason.CACHE_STALE, msg, dry, vmi, pod)


def _allow(reason: str, message: str, dry: bool, vmi=None, pod=None, cooldown=None, ranking=None,
           budget_node: str = "") -> Decision:
    return Decision(
        allowed=True, reason=reason, message=message, vmi=vmi, pod=pod, node=pod.node if pod else "",
        cooldown=cooldown, dry_run=dry, ranking=ranking, budget_node=budget_node,
    )


def _deny(reason: str, message: str, dry: bool, vmi, pod, remaining=None, cooldown=None, leaving=(),
          ranking=None) -> Decision:
    return Decision(
        allowed=False, reason=reason, message=message, vmi=vmi, pod=pod, node=pod.node,
        remaining=remaining, cooldown=cooldown, leaving=leaving, dry_run=dry, ranking=ranking,
    )
