"""Typed views of the API objects the watch reads the most, declaring only the fields the guard uses.

A list of 100,000 VMIs is hundreds of MB of JSON of which the records keep a
dozen fields per object. Decoding it into dicts (orjson) builds every field of
every object, then throws nearly all of it away. ``msgspec`` decodes straight
into these Structs instead: fields not declared here are skipped while
parsing, never built, so decoding a VMI costs about what decoding a third of it
would, and far fewer objects are allocated (which is also what keeps Python's
cyclic collector from running dozens of full collections during a list).

The types are strict on purpose. A field of the wrong type (``nodeName: 5``, a
null where the API server always writes a string) fails the decoding of the
whole page or event, and the caller then decodes the same bytes with orjson and
projects them with the lenient ``*_from_object`` functions in ``records.py``,
which turn anything malformed into an empty value. So what the API server sends
in the documented shapes takes the fast path, anything else the careful one, and
both give the same record (tests/test_wire_records.py checks it on the real
objects in tests/fixtures and on generated variants).

Annotation and label maps are Structs too, one field per key the guard reads,
renamed to the key: the rest of the map is skipped like any unknown field.
``UNSET`` tells an absent annotation from an empty one, where presence is what
counts (``prefer-no-eviction``).

Only VMIs, VMIMs and launcher pods come this way: nodes and the KubeVirt CR are
a few hundred objects at most and take the dict path.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

PREFER_NO_EVICTION = "descheduler.alpha.kubernetes.io/prefer-no-eviction"


class _Wire(Struct, frozen=True, gc=False):
    """Decoded, read once to build a record, then dropped: immutable and invisible to the cyclic collector."""


class Condition(_Wire):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


class SourceState(_Wire):
    virtualMachineInstanceUID: str = ""


class MigrationStateWire(_Wire):
    startTimestamp: str | None = None
    endTimestamp: str | None = None
    migrationUid: str = ""
    sourceNode: str = ""
    targetNode: str = ""
    failed: bool = False
    sourceState: SourceState | None = None


# ---- VirtualMachineInstance --------------------------------------------------------------------------


class VMIAnnotations(_Wire):
    prefer_no_eviction: str | UnsetType = field(default=UNSET, name=PREFER_NO_EVICTION)
    exempt: str | None = field(default=None, name="kubevirt-eviction-guard.io/exempt")
    cooldown: str | None = field(default=None, name="kubevirt-eviction-guard.io/migration-cooldown")
    history: str | None = field(default=None, name="kubevirt-eviction-guard.io/migration-history")
    eviction_source: str = field(default="", name="kubevirt.io/eviction-source")


class VMIMeta(_Wire):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    creationTimestamp: str | None = None
    annotations: VMIAnnotations | None = None


class VMISpec(_Wire):
    evictionStrategy: str = ""


class VMIStatus(_Wire):
    nodeName: str = ""
    evacuationNodeName: str = ""
    # raw: null and an empty object read as no migration state at all (records.migration_state_from)
    migrationState: msgspec.Raw = msgspec.Raw()  # empty when absent
    conditions: tuple[Condition, ...] = ()


class VMI(_Wire):
    metadata: VMIMeta = VMIMeta()
    spec: VMISpec = VMISpec()
    status: VMIStatus = VMIStatus()


# ---- VirtualMachineInstanceMigration ----------------------------------------------------------------


class VMIMAnnotations(_Wire):
    evacuation: str = field(default="", name="kubevirt.io/evacuationMigration")
    workload_update: str | UnsetType = field(default=UNSET, name="kubevirt.io/workloadUpdateMigration")
    cause: str = field(default="", name="kubevirt-eviction-guard.io/cause")


class VMIMMeta(_Wire):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    creationTimestamp: str | None = None
    annotations: VMIMAnnotations | None = None


class VMIMSpec(_Wire):
    vmiName: str = ""
    priority: str = ""
    sendTo: Any = None  # only whether it is set is read
    receive: Any = None


class PhaseTransition(_Wire):
    phase: str = ""
    phaseTransitionTimestamp: str | None = None


class VMIMStatus(_Wire):
    phase: str = ""
    migrationState: msgspec.Raw = msgspec.Raw()  # empty when absent
    phaseTransitionTimestamps: tuple[PhaseTransition, ...] = ()
    conditions: tuple[Condition, ...] = ()


class VMIM(_Wire):
    metadata: VMIMMeta = VMIMMeta()
    spec: VMIMSpec = VMIMSpec()
    status: VMIMStatus = VMIMStatus()


# ---- virt-launcher Pod ----------------------------------------------------------------------------------


class PodLabels(_Wire):
    launcher: str = field(default="", name="kubevirt.io")
    migration_job_uid: str = field(default="", name="kubevirt.io/migrationJobUID")


class PodAnnotations(_Wire):
    domain: str = field(default="", name="kubevirt.io/domain")
    eviction_in_progress: str | UnsetType = field(default=UNSET,
                                                  name="descheduler.alpha.kubernetes.io/eviction-in-progress")
    prefer_no_eviction: str | UnsetType = field(default=UNSET, name=PREFER_NO_EVICTION)


class PodMeta(_Wire):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: PodLabels | None = None
    annotations: PodAnnotations | None = None


class NodeSelector(_Wire):
    hostname: str = field(default="", name="kubernetes.io/hostname")


class PodSpec(_Wire):
    nodeName: str = ""
    nodeSelector: NodeSelector | None = None
    affinity: Any = None  # rare on launcher pods; read by records.pinned_node when present


class PodStatus(_Wire):
    phase: str = ""
    conditions: tuple[Condition, ...] = ()


class Pod(_Wire):
    metadata: PodMeta = PodMeta()
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()


# ---- lists and watch events ----------------------------------------------------------------------------


class ListMeta(_Wire):
    resourceVersion: str = ""
    continue_: str = field(default="", name="continue")


class VMIList(_Wire):
    metadata: ListMeta = ListMeta()
    items: tuple[VMI, ...] = ()


class VMIMList(_Wire):
    metadata: ListMeta = ListMeta()
    items: tuple[VMIM, ...] = ()


class PodList(_Wire):
    metadata: ListMeta = ListMeta()
    items: tuple[Pod, ...] = ()


class VMIEvent(_Wire):
    type: str = ""
    object: VMI | None = None


class VMIMEvent(_Wire):
    type: str = ""
    object: VMIM | None = None


class PodEvent(_Wire):
    type: str = ""
    object: Pod | None = None


# what does not fit the types above; the caller falls back to the lenient path
NotTheShape = (msgspec.ValidationError, msgspec.DecodeError)
