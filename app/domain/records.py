"""Slim, immutable records holding only what policy reads.

A VMI as the API server sends it is 5 to 30 KB of JSON; policy needs a dozen
fields. Projecting each object once, when it arrives, keeps the stores small
(100,000 VMIs fit in tens of MB) and makes every decision a few dict lookups.
Strings that repeat across objects (namespaces, node names, phases, VMI names)
are interned so that 100,000 records share one copy of each.

The ``*_from_object`` functions take the decoded JSON of one object and raise
``RecordError`` when it lacks what identifies it (a name); anything else that
is missing or malformed becomes ``None``/empty, and policy fails open on it.
The ``*_from_wire`` functions build the same records from the typed views in
``wire.py`` (the watch's fast path); the two must agree on every object both
can read, which tests/test_wire_records.py checks.

Records are msgspec Structs (frozen, ``gc=False``) rather than frozen
dataclasses: a frozen dataclass sets each field through
``object.__setattr__``, which made building a VMIM record cost more than
decoding it, and half a million long-lived records tracked by the cyclic
collector make every full collection walk all of them. A record holds strings,
numbers and tuples of other records, never anything that refers back to it, so
it cannot be part of a cycle.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import msgspec
from msgspec import UNSET

from app.domain import wire
from app.domain.history import HISTORY_ANNOTATION, HistoryEntry, parse_history
from app.timefmt import parse_duration, parse_timestamp

LAUNCHER_LABEL = "kubevirt.io"
LAUNCHER_VALUE = "virt-launcher"
DOMAIN_ANNOTATION = "kubevirt.io/domain"
MIGRATION_JOB_LABEL = "kubevirt.io/migrationJobUID"
EVICTION_IN_PROGRESS = "descheduler.alpha.kubernetes.io/eviction-in-progress"
EVACUATION_MIGRATION = "kubevirt.io/evacuationMigration"
# KubeVirt copies it from the VM to the VMI and the launcher pod; the descheduler reads its presence
PREFER_NO_EVICTION = wire.PREFER_NO_EVICTION
# the guard's own per-VM overrides, read from the VMI
COOLDOWN_OVERRIDE = "kubevirt-eviction-guard.io/migration-cooldown"
EXEMPT_OVERRIDE = "kubevirt-eviction-guard.io/exempt"
WORKLOAD_UPDATE_MIGRATION = "kubevirt.io/workloadUpdateMigration"
# KubeVirt writes it on the VMI when the descheduler's eviction marked it (removed once the migration completes)
EVICTION_SOURCE = "kubevirt.io/eviction-source"
DESCHEDULER_SOURCE = "descheduler"
CAUSE_ANNOTATION = "kubevirt-eviction-guard.io/cause"  # the guard's record of who caused an evacuation VMIM
DESCHEDULER_PRIORITY = "system-maintenance"  # VMIM spec.priority of descheduler-caused evacuations (MigrationPriorityQueue)
DRAIN_PRIORITY = "system-critical"  # VMIM spec.priority of any other evacuation: a drain
FINAL_PHASES = frozenset({"Succeeded", "Failed"})
# VMI condition: the VM can live-migrate now (KubeVirt's IsMigratable reads status True only)
LIVE_MIGRATABLE = "LiveMigratable"
# spec.evictionStrategy values (VMI, or the KubeVirt CR's spec.configuration.evictionStrategy)
LIVE_MIGRATE, LIVE_MIGRATE_IF_POSSIBLE, EXTERNAL, STRATEGY_NONE = "LiveMigrate", "LiveMigrateIfPossible", "External", "None"
# VMIM conditions (KubeVirt 1.9) under which a migration waits instead of failing
BLOCKING_CONDITIONS = ("migrationBlockedByBackup", "migrationRejectedByResourceQuota", "decentralizedMigrationBlocked",
                       "migrationBlockedByUtilityVolumes")
# decentralized live migration (KubeVirt 1.9): the VMIM's spec.sendTo (source side) or spec.receive (target side)
SEND_TO, RECEIVE = "sendTo", "receive"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# KubeVirt's defaults when the KubeVirt CR leaves them unset (pkg/virt-config)
DEFAULT_PARALLEL_OUTBOUND_PER_NODE, DEFAULT_PARALLEL_PER_CLUSTER = 2, 5
DEFAULT_EVICTION_STRATEGY = STRATEGY_NONE
MAX_SHOWN = 200  # condition messages kept for people: enough to name the cause
AUTOSCALER_DRAIN_TAINT = "ToBeDeletedByClusterAutoscaler"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
KUBEVIRT_DRAIN_TAINT = "kubevirt.io/drain"  # KubeVirt's default nodeDrainTaintKey: virt-controller evacuates the node
DRAIN_TAINTS = frozenset({AUTOSCALER_DRAIN_TAINT, UNSCHEDULABLE_TAINT, KUBEVIRT_DRAIN_TAINT})

_intern = sys.intern


class RecordError(ValueError):
    """An object that cannot be identified (no name, not a mapping)."""


def _own(value: str) -> str:
    """A fresh copy of ``value``. A string taken straight from a decoded document pins
    the memory around it: CPython returns its allocator's arenas to the OS only when
    every object in them is gone, so records holding the document's own strings keep
    most of the document resident (measured with 100,000 VMIs from one snapshot:
    1.25 GB resident instead of 0.3 GB). ``surrogatepass``: JSON may carry lone
    surrogates, and a copy must never fail."""
    return value.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _s(value: Any) -> str:
    """A value that repeats across objects (namespace, node, phase, VMI name): one shared copy."""
    return _intern(_own(value)) if isinstance(value, str) else ""


def _u(value: Any) -> str:
    """A value unique to one object (uid, resourceVersion): our own copy, not interned."""
    return _own(value) if isinstance(value, str) else ""


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _meta(obj: Any) -> tuple[dict, str, str]:
    if not isinstance(obj, dict):
        raise RecordError("object is not a mapping")
    meta = _d(obj.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError("object has no metadata.name")
    return meta, _s(meta.get("namespace")), name


class MigrationState(msgspec.Struct, frozen=True, gc=False):
    """``status.migrationState`` of a VMI or VMIM: the latest attempt only."""

    started: bool  # startTimestamp present (even if unparsable)
    start: float | None  # epoch seconds, None when absent or malformed
    ended: bool  # endTimestamp present
    end: float | None
    uid: str  # migrationUid, the VMIM's uid
    source_node: str
    target_node: str
    failed: bool
    # sourceState.virtualMachineInstanceUID (KubeVirt >= 1.7): the source VMI's uid; a VMI that arrived by a
    # decentralized migration has a new uid, so a value other than its own marks the migration as an arrival
    source_vmi_uid: str = ""

    @property
    def in_flight(self) -> bool:
        return self.started and not self.ended


def migration_state_from(raw: Any) -> MigrationState | None:
    """None when absent or empty ({}): an empty state says nothing about a migration."""
    if not isinstance(raw, dict) or not raw:
        return None
    start_raw = raw.get("startTimestamp")
    end_raw = raw.get("endTimestamp")
    return MigrationState(
        started=start_raw not in (None, ""),
        start=parse_timestamp(start_raw),
        ended=end_raw not in (None, ""),
        end=parse_timestamp(end_raw),
        uid=_u(raw.get("migrationUid")),
        source_node=_s(raw.get("sourceNode")),
        target_node=_s(raw.get("targetNode")),
        failed=raw.get("failed") is True,
        source_vmi_uid=_u(_d(raw.get("sourceState")).get("virtualMachineInstanceUID")),
    )


class VMOverrides(msgspec.Struct, frozen=True, gc=False):
    """The guard's per-VM annotations on a VMI, parsed. A value that does not parse is
    kept (``*_ignored``) to be shown, and has no effect: a malformed override never
    makes the guard deny."""

    exempt: bool = False  # exempt: "true" (any case)
    exempt_ignored: str = ""  # a value other than "true"/"false"
    cooldown: float | None = None  # migration-cooldown, seconds
    cooldown_ignored: str = ""  # not a non-negative Go duration


def overrides_from(annotations: dict) -> VMOverrides | None:
    return _overrides(annotations.get(EXEMPT_OVERRIDE), annotations.get(COOLDOWN_OVERRIDE))


def _overrides(exempt_raw: Any, cooldown_raw: Any) -> VMOverrides | None:
    if exempt_raw is None and cooldown_raw is None:
        return None
    exempt_word = exempt_raw.strip().lower() if isinstance(exempt_raw, str) else None
    exempt = exempt_word == "true"
    exempt_ignored = "" if exempt_raw is None or exempt_word in ("true", "false") else _shown(exempt_raw)
    cooldown: float | None = None
    cooldown_ignored = ""
    if cooldown_raw is not None:
        try:
            cooldown = parse_duration(cooldown_raw)
        except ValueError:
            cooldown = None
        if cooldown is None or cooldown < 0:
            cooldown, cooldown_ignored = None, _shown(cooldown_raw)
    return VMOverrides(exempt, exempt_ignored, cooldown, cooldown_ignored)


def _shown(raw: Any) -> str:
    """An ignored annotation value, short enough to print; never repr() of what is not a string."""
    if not isinstance(raw, str):
        return f"<{type(raw).__name__}>"
    return _own(raw[:64]) or '""'


class VMIRecord(msgspec.Struct, frozen=True, gc=False):
    namespace: str
    name: str
    uid: str
    created: float | None
    node: str  # status.nodeName: where the VM runs now
    evacuation_node: str  # status.evacuationNodeName: "" when not marked
    migration: MigrationState | None
    prefer_no_eviction: bool = False  # annotation present (any value)
    overrides: VMOverrides | None = None  # None when the VMI carries none of the guard's annotations
    history: tuple[HistoryEntry, ...] = ()  # annotation kubevirt-eviction-guard.io/migration-history
    eviction_source: str = ""  # annotation kubevirt.io/eviction-source ("descheduler")
    eviction_strategy: str = ""  # spec.evictionStrategy; "" when unset (the KubeVirt CR's default applies)
    migratable: str = ""  # status of the LiveMigratable condition: "True", "False", "Unknown"; "" when absent
    migratable_reason: str = ""  # its reason (DisksNotLiveMigratable, ...), and a short message after ": "

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)



def arrived_by_state(vmi: VMIRecord, migrations) -> bool:
    """The VMI's ``migrationState`` describes an arrival (the receiving side of a decentralized
    migration): its source VMI had another uid, or it is the migration of a VMIM with ``spec.receive``."""
    m = vmi.migration
    if m is None:
        return False
    if m.source_vmi_uid and vmi.uid and m.source_vmi_uid != vmi.uid:
        return True
    return bool(m.uid) and any(x.uid == m.uid and x.arriving for x in migrations)


def _condition(conditions: Any, kind: str) -> dict | None:
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, dict) and c.get("type") == kind:
            return c
    return None


def _reason_text(c: dict) -> str:
    return _short_reason(c.get("reason"), c.get("message"))


def _short_reason(reason: Any, message: Any) -> str:
    """A condition's reason and message, short: "Reason: message"."""
    parts = [x for x in (reason, message) if isinstance(x, str) and x]
    text = ": ".join(parts)
    return _s(text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "...")


def vmi_from_object(obj: Any) -> VMIRecord:
    meta, ns, name = _meta(obj)
    status = _d(obj.get("status"))
    annotations = _d(meta.get("annotations"))
    migratable = _condition(status.get("conditions"), LIVE_MIGRATABLE)
    return VMIRecord(
        namespace=ns,
        name=_s(name),
        uid=_u(meta.get("uid")),
        created=parse_timestamp(meta.get("creationTimestamp")),
        node=_s(status.get("nodeName")),
        evacuation_node=_s(status.get("evacuationNodeName")),
        migration=migration_state_from(status.get("migrationState")),
        prefer_no_eviction=PREFER_NO_EVICTION in annotations,
        overrides=overrides_from(annotations) if annotations else None,
        history=parse_history(annotations.get(HISTORY_ANNOTATION)) if annotations else (),
        eviction_source=_s(annotations.get(EVICTION_SOURCE)) if annotations else "",
        eviction_strategy=_s(_d(obj.get("spec")).get("evictionStrategy")),
        migratable=_s(migratable.get("status")) if migratable else "",
        migratable_reason=_reason_text(migratable) if migratable else "",
    )


class MigrationRecord(msgspec.Struct, frozen=True, gc=False):
    """A VirtualMachineInstanceMigration (VMIM): one attempt to move a VMI."""

    namespace: str
    name: str
    uid: str
    vmi_name: str
    phase: str  # "" when unset
    created: float | None
    start: float | None
    end: float | None  # migrationState.endTimestamp, else the final phase's transition time
    source_node: str
    evacuation_node: str  # annotation kubevirt.io/evacuationMigration
    priority: str = ""  # spec.priority (1.9, or the gate on): system-critical | system-maintenance | user-triggered
    workload_update: str = ""  # annotation kubevirt.io/workloadUpdateMigration ("" when absent)
    target_node: str = ""  # migrationState.targetNode
    decentralized: str = ""  # SEND_TO or RECEIVE: one side of a migration across namespaces or clusters
    blocked: str = ""  # the first BLOCKING_CONDITIONS type with status True: the migration waits
    blocked_reason: str = ""  # that condition's reason and message, short
    recorded_cause: str = ""  # annotation kubevirt-eviction-guard.io/cause (app/effects/cause.py)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def finished(self) -> bool:
        return self.phase in FINAL_PHASES

    @property
    def moved(self) -> bool:
        """Succeeded with a known end and route within this cluster: the VM left ``source_node`` for
        ``target_node``. A decentralized migration's other end is in another namespace or cluster (its node
        names are not ours), so it moved nothing between two nodes here."""
        return (self.phase == "Succeeded" and self.end is not None and bool(self.source_node or self.target_node)
                and not self.decentralized)

    @property
    def arriving(self) -> bool:
        """The receiving side of a decentralized migration: the VM comes here, it leaves no node of ours."""
        return self.decentralized == RECEIVE


def migration_from_object(obj: Any) -> MigrationRecord:
    meta, ns, name = _meta(obj)
    spec = _d(obj.get("spec"))
    status = _d(obj.get("status"))
    phase = _s(status.get("phase"))
    state = migration_state_from(status.get("migrationState"))
    end = state.end if state else None
    if end is None and phase in FINAL_PHASES:
        transitions = status.get("phaseTransitionTimestamps")
        if isinstance(transitions, list):
            for t in transitions:
                if isinstance(t, dict) and t.get("phase") == phase:
                    end = parse_timestamp(t.get("phaseTransitionTimestamp"))
    conditions = status.get("conditions")
    blocking = next((c for k in BLOCKING_CONDITIONS if (c := _condition(conditions, k)) is not None
                     and c.get("status") == "True"), None) if conditions else None
    return MigrationRecord(
        namespace=ns,
        name=_u(name),
        uid=_u(meta.get("uid")),
        vmi_name=_s(spec.get("vmiName")),
        phase=phase,
        created=parse_timestamp(meta.get("creationTimestamp")),
        start=state.start if state else None,
        end=end,
        source_node=state.source_node if state else "",
        evacuation_node=_s(_d(meta.get("annotations")).get(EVACUATION_MIGRATION)),
        priority=_s(spec.get("priority")),
        workload_update=_workload_update(_d(meta.get("annotations"))),
        target_node=state.target_node if state else "",
        decentralized=_decentralized(spec),
        blocked=_s(blocking.get("type")) if blocking else "",
        blocked_reason=_reason_text(blocking) if blocking else "",
        recorded_cause=_s(_d(meta.get("annotations")).get(CAUSE_ANNOTATION)),
    )


def _decentralized(spec: dict) -> str:
    """KubeVirt's IsDecentralized: exactly one of sendTo and receive is set (both is a local migration)."""
    send, receive = spec.get("sendTo") is not None, spec.get("receive") is not None
    return SEND_TO if send and not receive else RECEIVE if receive and not send else ""


def _workload_update(annotations: dict) -> str:
    """The annotation's value, or "true" when it is present with an empty or non-string value."""
    if WORKLOAD_UPDATE_MIGRATION not in annotations:
        return ""
    return _s(annotations[WORKLOAD_UPDATE_MIGRATION]) or "true"


class LauncherPod(msgspec.Struct, frozen=True, gc=False):
    """A pod as far as the guard cares: is it a VM's launcher, where, for which VMI."""

    namespace: str
    name: str
    uid: str
    node: str  # spec.nodeName
    phase: str
    is_launcher: bool  # label kubevirt.io=virt-launcher
    vmi_name: str  # annotation kubevirt.io/domain, "" when absent
    migration_job_uid: str  # label kubevirt.io/migrationJobUID (target pods)
    eviction_in_progress: bool
    prefer_no_eviction: bool  # annotation present (any value), as the descheduler reads it
    has_annotations: bool  # metadata.annotations exists (JSON patch must add the map otherwise)
    resource_version: str
    ready: bool = False  # condition Ready is True (KubeVirt keeps eviction-in-progress on the ready source pod only)
    pinned_to: str = ""  # the one node its nodeSelector or required node affinity allows ("" when not pinned)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def pod_from_object(obj: Any) -> LauncherPod:
    meta, ns, name = _meta(obj)
    labels = _d(meta.get("labels"))
    raw_annotations = meta.get("annotations")
    annotations = _d(raw_annotations)
    return LauncherPod(
        namespace=ns,
        name=_u(name),
        uid=_u(meta.get("uid")),
        node=_s(_d(obj.get("spec")).get("nodeName")),
        phase=_s(_d(obj.get("status")).get("phase")),
        is_launcher=labels.get(LAUNCHER_LABEL) == LAUNCHER_VALUE,
        vmi_name=_s(annotations.get(DOMAIN_ANNOTATION)),
        migration_job_uid=_u(labels.get(MIGRATION_JOB_LABEL)),
        eviction_in_progress=EVICTION_IN_PROGRESS in annotations,
        prefer_no_eviction=PREFER_NO_EVICTION in annotations,
        has_annotations=isinstance(raw_annotations, dict),
        resource_version=_u(meta.get("resourceVersion")),
        ready=_condition_true(_d(obj.get("status")).get("conditions"), "Ready"),
        pinned_to=pinned_node(_d(obj.get("spec"))),
    )


def pinned_node(spec: dict) -> str:
    """The single node a pod may run on, from a ``kubernetes.io/hostname`` nodeSelector, or from a required
    node affinity whose every term allows one and the same node (by the hostname label with ``In``, or by
    ``metadata.name`` in matchFields); "" when it may run on more than one."""
    selector = _d(spec.get("nodeSelector")).get(HOSTNAME_LABEL)
    if isinstance(selector, str) and selector:
        return _s(selector)
    required = _d(_d(_d(spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        return ""
    nodes = set()
    for term in terms:
        term = _d(term)
        one = {v for r, key in ((term.get("matchExpressions"), HOSTNAME_LABEL), (term.get("matchFields"), "metadata.name"))
               for e in (r if isinstance(r, list) else ()) if _d(e).get("key") == key and _d(e).get("operator") == "In"
               for v in (_one(_d(e).get("values")),) if v}
        if len(one) != 1:
            return ""  # a term that allows several nodes (or none we can read): not pinned
        nodes |= one
    return _s(nodes.pop()) if len(nodes) == 1 else ""


def _one(values: Any) -> str:
    return values[0] if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str) else ""


def _condition_true(conditions: Any, kind: str) -> bool:
    c = _condition(conditions, kind)
    return c is not None and c.get("status") == "True"


class NodeRecord(msgspec.Struct, frozen=True, gc=False):
    name: str
    drain: str = ""  # why the node counts as being drained ("" when it does not): see drain_signal

    @property
    def draining(self) -> bool:
        return bool(self.drain)

    @property
    def key(self) -> str:
        return self.name


def node_from_object(obj: Any) -> NodeRecord:
    _, _, name = _meta(obj)
    return NodeRecord(name=_s(name), drain=drain_signal(_d(obj.get("spec"))))


def drain_signal(spec: dict) -> str:
    """Why a node is being drained, from its spec; "" when it is not.

    ``kubectl drain`` and maintenance operators cordon (``spec.unschedulable``).
    cluster-autoscaler taints the node ``ToBeDeletedByClusterAutoscaler`` and cordons
    only when configured to, so the taint alone means a drain too; so does the
    ``node.kubernetes.io/unschedulable`` taint that accompanies a cordon, and KubeVirt's own
    ``kubevirt.io/drain`` (its default ``nodeDrainTaintKey``): virt-controller evacuates every VM from
    such a node, and virt-api refuses to cancel those evacuations.
    """
    if spec.get("unschedulable") is True:
        return "cordoned"
    taints = spec.get("taints")
    for taint in taints if isinstance(taints, list) else ():
        key = _d(taint).get("key")
        if key in DRAIN_TAINTS:
            return _intern(f"tainted {key}")
    return ""


class KubeVirtRecord(msgspec.Struct, frozen=True, gc=False):
    """The KubeVirt CR (kubevirt.io/v1 KubeVirt): the cluster-wide settings the guard reads.
    ``None`` fields are unset in the CR: KubeVirt's defaults apply (the ``effective_*`` properties)."""

    namespace: str
    name: str
    parallel_outbound_per_node: int | None = None  # spec.configuration.migrations.parallelOutboundMigrationsPerNode
    parallel_per_cluster: int | None = None  # spec.configuration.migrations.parallelMigrationsPerCluster
    eviction_strategy: str = ""  # spec.configuration.evictionStrategy; "" when unset

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def effective_outbound_per_node(self) -> int:
        return DEFAULT_PARALLEL_OUTBOUND_PER_NODE if self.parallel_outbound_per_node is None else self.parallel_outbound_per_node

    @property
    def effective_per_cluster(self) -> int:
        return DEFAULT_PARALLEL_PER_CLUSTER if self.parallel_per_cluster is None else self.parallel_per_cluster

    @property
    def effective_eviction_strategy(self) -> str:
        return self.eviction_strategy or DEFAULT_EVICTION_STRATEGY


def kubevirt_from_object(obj: Any) -> KubeVirtRecord:
    _, ns, name = _meta(obj)
    config = _d(_d(obj.get("spec")).get("configuration"))
    migrations = _d(config.get("migrations"))
    return KubeVirtRecord(
        namespace=ns,
        name=_s(name),
        parallel_outbound_per_node=_count(migrations.get("parallelOutboundMigrationsPerNode")),
        parallel_per_cluster=_count(migrations.get("parallelMigrationsPerCluster")),
        eviction_strategy=_s(config.get("evictionStrategy")),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# ---- the same records from the typed views of wire.py (the watch's fast path) ---------------------------------
# Decoded strings are fresh objects of their own (nothing of the document stays behind them), so they are kept
# as they are; only the ones that repeat across objects are interned.

_EMPTY_OBJECT = re.compile(rb"\{[ \t\n\r]*\}")
_state_decoder = msgspec.json.Decoder(wire.MigrationStateWire)


def _state_from_wire(raw: msgspec.Raw) -> MigrationState | None:
    if not raw or raw == b"null" or _EMPTY_OBJECT.fullmatch(raw):
        return None
    m = _state_decoder.decode(raw)
    start, end = m.startTimestamp, m.endTimestamp
    return MigrationState(
        started=bool(start),
        start=parse_timestamp(start) if start else None,
        ended=bool(end),
        end=parse_timestamp(end) if end else None,
        uid=m.migrationUid,
        source_node=_intern(m.sourceNode),
        target_node=_intern(m.targetNode),
        failed=m.failed,
        source_vmi_uid=m.sourceState.virtualMachineInstanceUID if m.sourceState is not None else "",
    )


def _wire_condition(conditions: tuple[wire.Condition, ...], kind: str) -> wire.Condition | None:
    for c in conditions:
        if c.type == kind:
            return c
    return None


def vmi_from_wire(obj: wire.VMI) -> VMIRecord:
    """``vmi_from_object`` for a VMI decoded as ``wire.VMI``."""
    meta, status = obj.metadata, obj.status
    if not meta.name:
        raise RecordError("object has no metadata.name")
    a = meta.annotations
    migratable = _wire_condition(status.conditions, LIVE_MIGRATABLE) if status.conditions else None
    created = meta.creationTimestamp
    return VMIRecord(
        namespace=_intern(meta.namespace),
        name=_intern(meta.name),
        uid=meta.uid,
        created=parse_timestamp(created) if created else None,
        node=_intern(status.nodeName),
        evacuation_node=_intern(status.evacuationNodeName),
        migration=_state_from_wire(status.migrationState),
        prefer_no_eviction=a is not None and a.prefer_no_eviction is not UNSET,
        overrides=_overrides(a.exempt, a.cooldown) if a is not None else None,
        history=parse_history(a.history) if a is not None and a.history else (),
        eviction_source=_intern(a.eviction_source) if a is not None else "",
        eviction_strategy=_intern(obj.spec.evictionStrategy),
        migratable=_intern(migratable.status) if migratable else "",
        migratable_reason=_short_reason(migratable.reason, migratable.message) if migratable else "",
    )


def migration_from_wire(obj: wire.VMIM) -> MigrationRecord:
    """``migration_from_object`` for a VMIM decoded as ``wire.VMIM``."""
    meta, spec, status = obj.metadata, obj.spec, obj.status
    if not meta.name:
        raise RecordError("object has no metadata.name")
    phase = _intern(status.phase)
    state = _state_from_wire(status.migrationState)
    end = state.end if state else None
    if end is None and phase in FINAL_PHASES:
        for t in status.phaseTransitionTimestamps:
            if t.phase == phase:
                end = parse_timestamp(t.phaseTransitionTimestamp)
    blocked, blocked_reason = "", ""
    if status.conditions:
        for kind in BLOCKING_CONDITIONS:
            c = _wire_condition(status.conditions, kind)
            if c is not None and c.status == "True":
                blocked, blocked_reason = _intern(c.type), _short_reason(c.reason, c.message)
                break
    a = meta.annotations
    send, receive = spec.sendTo is not None, spec.receive is not None
    created = meta.creationTimestamp
    return MigrationRecord(
        namespace=_intern(meta.namespace),
        name=meta.name,
        uid=meta.uid,
        vmi_name=_intern(spec.vmiName),
        phase=phase,
        created=parse_timestamp(created) if created else None,
        start=state.start if state else None,
        end=end,
        source_node=state.source_node if state else "",
        evacuation_node=_intern(a.evacuation) if a is not None else "",
        priority=_intern(spec.priority),
        workload_update=_workload_update_wire(a),
        target_node=state.target_node if state else "",
        decentralized=SEND_TO if send and not receive else RECEIVE if receive and not send else "",
        blocked=blocked,
        blocked_reason=blocked_reason,
        recorded_cause=a.cause if a is not None else "",
    )


def _workload_update_wire(a: wire.VMIMAnnotations | None) -> str:
    if a is None or a.workload_update is UNSET:
        return ""
    return _intern(a.workload_update) or "true"


def pod_from_wire(obj: wire.Pod) -> LauncherPod:
    """``pod_from_object`` for a pod decoded as ``wire.Pod``."""
    meta, spec = obj.metadata, obj.spec
    if not meta.name:
        raise RecordError("object has no metadata.name")
    labels, a = meta.labels, meta.annotations
    ready = _wire_condition(obj.status.conditions, "Ready") if obj.status.conditions else None
    selector = spec.nodeSelector
    if selector is not None and selector.hostname:
        pinned = _intern(selector.hostname)
    else:
        pinned = pinned_node({"affinity": spec.affinity}) if spec.affinity is not None else ""
    return LauncherPod(
        namespace=_intern(meta.namespace),
        name=meta.name,
        uid=meta.uid,
        node=_intern(spec.nodeName),
        phase=_intern(obj.status.phase),
        is_launcher=labels is not None and labels.launcher == LAUNCHER_VALUE,
        vmi_name=_intern(a.domain) if a is not None else "",
        migration_job_uid=labels.migration_job_uid if labels is not None else "",
        eviction_in_progress=a is not None and a.eviction_in_progress is not UNSET,
        prefer_no_eviction=a is not None and a.prefer_no_eviction is not UNSET,
        has_annotations=a is not None,
        resource_version=meta.resourceVersion,
        ready=ready is not None and ready.status == "True",
        pinned_to=pinned,
    )
