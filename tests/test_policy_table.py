"""The decision table of docs/decisions.md, one row per situation, checkable line by line.

Each row: the cluster objects, who evicts which pod, the settings, and the
expected (allowed, reason, text in the message). Times are minutes before NOW.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from app.domain.usage import UsageSnapshot
from app.domain.view import CacheHealth
from app.policy import EvictionAttempt, PolicySettings, decide
from tests.builders import (
    MIN,
    NOW,
    condition,
    failing_evacuation,
    kubevirt_cr,
    mstate,
    node,
    pod,
    six_short_migrations,
    store_of,
    usage_snapshot,
    vmi,
    vmim,
)

NODES = [node("worker-a"), node("worker-b"), node("worker-c", cordoned=True),
         node("worker-d", taints=("ToBeDeletedByClusterAutoscaler",)), node("worker-e", taints=("node.kubernetes.io/unschedulable",)),
         node("worker-f", taints=("node-role.kubernetes.io/infra",)), node("worker-g", taints=("kubevirt.io/drain",))]
P = "virt-launcher-db-abcde"  # the pod evicted in most rows: VMI "db"
BG = 'Evacuation in progress: Eviction triggered evacuation of VMI "vms/db"'


def desched(name: str = P, **kw) -> EvictionAttempt:
    return EvictionAttempt("CREATE", "pods", "eviction", "vms", name, username="system:serviceaccount:kube-system:descheduler-sa",
                           requested_by="sigs.k8s.io/descheduler", **kw)


def user(name: str = P, username: str = "kubernetes-admin", **kw) -> EvictionAttempt:
    return EvictionAttempt("CREATE", "pods", "eviction", "vms", name, username=username, **kw)


@dataclass
class Row:
    id: str
    objects: list
    req: EvictionAttempt
    allowed: bool
    reason: str
    text: str = ""
    settings: PolicySettings = field(default_factory=PolicySettings)
    health: CacheHealth = field(default_factory=CacheHealth)
    usage: UsageSnapshot | None = None  # rule 10 on when given


DB = vmi("db", "worker-a")
DB_POD = pod("db", "worker-a")
RECENT = mstate("m1", "worker-b", "worker-a", start=7, end=5)  # ended 5 min ago after 2 min
DB_RECENT = vmi("db", "worker-a", migration=RECENT)
WEB_LEAVING = [vmi("web", "worker-a", evacuation="worker-a"), pod("web", "worker-a")]
P_WEB, P_BIG = "virt-launcher-web-abcde", "virt-launcher-big-abcde"
STEER = [DB, DB_POD, vmi("web", "worker-a"), pod("web", "worker-a"), vmi("big", "worker-a"), pod("big", "worker-a")]
USAGE = usage_snapshot()
PNE = "descheduler.alpha.kubernetes.io/prefer-no-eviction"
EX = "kubevirt-eviction-guard.io/exempt"
CD = "kubevirt-eviction-guard.io/migration-cooldown"
EXEMPT = {EX: "true"}
DB_PNE = vmi("db", "worker-a", annotations={PNE: ""})
DB_POD_PNE = pod("db", "worker-a", annotations={PNE: ""})
MAINT = "system-maintenance"
NODE_CD = PolicySettings(node_cooldown=15 * MIN)
TARGET_CD = PolicySettings(target_node_cooldown=15 * MIN)
# vms/web left worker-a for worker-b, the descheduler's move, ended 5 min ago after 2 min
LEFT_A = [vmi("web", "worker-b"), vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-a", "worker-b", 7, 5), priority=MAINT)]
ARRIVED_A = [vmi("web", "worker-a"), vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-b", "worker-a", 7, 5), priority=MAINT)]
WEB2_LEAVING = [vmi("web2", "worker-a", evacuation="worker-a"), pod("web2", "worker-a")]
UIDLESS = {k: v for k, v in RECENT.items() if k != "migrationUid"}
SRC = {"kubevirt.io/eviction-source": "descheduler"}
DB_MARKED = vmi("db", "worker-a", evacuation="worker-a", annotations=SRC)
# KubeVirt 1.9's VMIM conditions that hold a migration back (virt-controller's texts)
BACKUP = condition("migrationBlockedByBackup", "BackupInProgress", "Waiting for backup nightly-db to complete")
QUOTA = condition("migrationRejectedByResourceQuota")
DISKS = ("False", "DisksNotLiveMigratable", ("cannot migrate VMI: PVC db-disk is not shared, live migration requires "
                                             "that all PVCs must be shared (using ReadWriteMany access mode)"))
NOT_MIGRATABLE = vmi("db", "worker-a", strategy="LiveMigrateIfPossible", migratable=DISKS)
KV_NONE, KV_UNSET = kubevirt_cr("None"), kubevirt_cr()

ROWS = [
    # 1. not a CREATE of pods/eviction
    Row("1 delete of a pod", [DB, DB_POD], EvictionAttempt("DELETE", "pods", "", "vms", P), True, "not_an_eviction"),
    Row("1 create of pods/binding", [DB, DB_POD], EvictionAttempt("CREATE", "pods", "binding", "vms", P), True, "not_an_eviction"),
    # 2. state not synced / stale: fail open
    Row("2 not synced", [DB_RECENT, DB_POD], desched(), True, "cache_not_ready", "vmi",
        health=CacheHealth(not_synced=frozenset({"vmi"}))),
    Row("2 pods stale", [DB_RECENT, DB_POD], desched(), True, "cache_stale", health=CacheHealth(stale=frozenset({"pod"}))),
    Row("2 vmims stale, would be in flight", [DB, DB_POD, vmim("m9", "db", "Running", 1)], desched(), True, "cache_stale",
        "vmim", health=CacheHealth(stale=frozenset({"vmim"}))),
    Row("2 nodes stale, descheduler", [DB_RECENT, DB_POD], desched(), True, "cache_stale", health=CacheHealth(stale=frozenset({"node"}))),
    Row("2 nodes stale, not in scope: nodes not needed", [DB_RECENT, DB_POD], user(), True, "allowed",
        health=CacheHealth(stale=frozenset({"node"}))),
    # 3. not a VM pod
    Row("3 pod unknown", [DB], desched(), True, "not_a_vm_pod"),
    Row("3 not labelled virt-launcher", [DB_RECENT, pod("db", "worker-a", launcher=False)], desched(), True, "not_a_vm_pod"),
    Row("3 no kubevirt.io/domain", [DB_RECENT, pod("db", "worker-a", domain=False)], desched(), True, "not_a_vm_pod"),
    Row("3 phase Succeeded", [DB_RECENT, pod("db", "worker-a", phase="Succeeded")], desched(), True, "not_a_vm_pod"),
    Row("3 phase Failed", [DB_RECENT, pod("db", "worker-a", phase="Failed")], desched(), True, "not_a_vm_pod"),
    Row("3 phase Pending is a VM's pod: the rules apply", [DB_RECENT, pod("db", "worker-a", phase="Pending")], desched(),
        False, "cooldown", 'VMI "vms/db" is in migration cooldown'),
    Row("3 no phase yet is a VM's pod: the rules apply", [DB_RECENT, pod("db", "worker-a", phase=None)], desched(), False,
        "cooldown", 'VMI "vms/db" is in migration cooldown'),
    # 4. VMI unknown
    Row("4 VMI unknown", [DB_POD], desched(), True, "vmi_not_found"),
    # 5. migration target
    Row("5 VMI runs on another node", [vmi("db", "worker-b"), DB_POD], user(), False, "migration_target",
        'Eviction request for target Pod of VMI "vms/db"'),
    Row("5 labelled with an unfinished VMIM", [DB, pod("db", "worker-a", job="m2"), vmim("m2", "db", "Scheduling", 1, uid="m2")],
        user(), False, "migration_target", 'Eviction request for target Pod of VMI "vms/db": a live migration to this pod is in flight'),
    Row("5 a Pending target pod on the target node", [DB, pod("db", "worker-b", name="virt-launcher-db-xyz12", phase="Pending",
        job="m2"), vmim("m2", "db", "Scheduling", 1, uid="m2")], user("virt-launcher-db-xyz12"), False, "migration_target",
        'Eviction request for target Pod of VMI "vms/db"'),
    Row("5 a target pod without a phase yet", [DB, pod("db", "worker-b", name="virt-launcher-db-xyz12", phase=None, job="m2"),
        vmim("m2", "db", "Pending", 1, uid="m2")], desched("virt-launcher-db-xyz12"), False, "migration_target",
        'Eviction request for target Pod of VMI "vms/db"'),
    Row("5 a Pending target pod on the VM's own node, labelled with the unfinished VMIM", [DB,
        pod("db", "worker-a", phase="Pending", job="m2"), vmim("m2", "db", "Scheduling", 1, uid="m2")], desched(), False,
        "migration_target", "a live migration to this pod is in flight"),
    Row("5 labelled with a finished VMIM: not a target", [DB, pod("db", "worker-a", job="m1"),
        vmim("m1", "db", "Succeeded", 600, mstate("m1", "worker-b", "worker-a", 599, 598))], desched(), True, "allowed"),
    Row("5 labelled with the job of the VMI's own ended migration (its VMIM gone): not a target", [
        vmi("db", "worker-a", migration=mstate("m1", "worker-b", "worker-a", 300, 290)), pod("db", "worker-a", job="m1")],
        desched(), True, "allowed"),
    # 5a. a stuck descheduler-caused evacuation: plain 429 for the descheduler (no background text)
    Row("5a three failed descheduler attempts: stuck", [DB_MARKED, DB_POD, *failing_evacuation("db", "worker-a", 3)], desched(),
        False, "evacuation_stuck", 'the evacuation of VMI "vms/db" from node "worker-a" is stuck (3 failed attempts in 15m0s)'),
    Row("5a two failed attempts: not yet, background text", [DB_MARKED, DB_POD, *failing_evacuation("db", "worker-a", 2)],
        desched(), False, "evacuation_pending", BG),
    Row("5a older than evacuationStaleAfter with one failure: stuck", [DB_MARKED, DB_POD,
        *failing_evacuation("db", "worker-a", 1, first=70)], desched(), False, "evacuation_stuck", "leaving for 1h10m0s"),
    Row("5a a retry queued: still stuck (it would fail like the others)", [DB_MARKED, DB_POD,
        *failing_evacuation("db", "worker-a", 3, running=True)], desched(), False, "evacuation_stuck", "is stuck (3 failed attempts in 15m0s); KubeVirt keeps retrying it, the descheduler should choose another candidate"),
    Row("5a descheduler-caused by VMIM priority alone", [vmi("db", "worker-a", evacuation="worker-a"), DB_POD,
        *failing_evacuation("db", "worker-a", 3)], desched(), False, "evacuation_stuck", 'the evacuation of VMI "vms/db" from node "worker-a" is stuck (3 failed attempts'),
    Row("5a descheduler-caused by the VMI annotation alone (KubeVirt < 1.7: no priority)", [DB_MARKED, DB_POD,
        *failing_evacuation("db", "worker-a", 3, priority=None)], desched(), False, "evacuation_stuck", 'the evacuation of VMI "vms/db" from node "worker-a" is stuck (3 failed attempts'),
    Row("5a cause unknown: never stuck", [vmi("db", "worker-a", evacuation="worker-a"), DB_POD,
        *failing_evacuation("db", "worker-a", 3, priority=None)], desched(), False, "evacuation_pending", BG),
    Row("5a a drain's evacuation (system-critical) is never stuck", [DB_MARKED, DB_POD,
        *failing_evacuation("db", "worker-a", 3, priority="system-critical")], desched(), False, "evacuation_pending", BG),
    Row("5a node being drained: background text", [vmi("db", "worker-c", evacuation="worker-c", annotations=SRC),
        pod("db", "worker-c"), *failing_evacuation("db", "worker-c", 3)], desched(), False, "evacuation_pending", BG),
    Row("5a admin eviction of a stuck VM keeps the background text", [DB_MARKED, DB_POD,
        *failing_evacuation("db", "worker-a", 3)], user(), False, "evacuation_pending", BG),
    Row("5a evacuationStaleAfterFailures 0: by age only", [DB_MARKED, DB_POD, *failing_evacuation("db", "worker-a", 3)],
        desched(), False, "evacuation_pending", BG + ': VMI is marked for evacuation from node "worker-a", its migration is pending', settings=PolicySettings(evacuation_stale_after_failures=0)),
    Row("5a blocked by a backup is never stuck, however many earlier failures", [DB_MARKED, DB_POD,
        *failing_evacuation("db", "worker-a", 3), vmim("db-b", "db", "Pending", 1, evacuation="worker-a", priority=MAINT,
        conditions=[BACKUP])], desched(), False, "migration_in_progress", "waiting: migrationBlockedByBackup"),
    Row("5a rejected by resource quota and waiting past evacuationStaleAfter: not stuck", [DB_MARKED, DB_POD,
        vmim("db-q", "db", "Pending", 90, evacuation="worker-a", priority=MAINT, conditions=[QUOTA])], desched(), False,
        "migration_in_progress", "waiting: migrationRejectedByResourceQuota"),
    Row("5a failures before the last success belong to an earlier episode", [DB_MARKED, DB_POD,
        *failing_evacuation("db", "worker-a", 2, first=40),
        vmim("ok", "db", "Succeeded", 30, mstate("ok", "worker-b", "worker-a", 29, 28)),
        vmim("e9", "db", "Failed", 10, mstate("e9", "worker-a", "worker-b", 9, 8, failed=True), evacuation="worker-a",
             priority="system-maintenance")], desched(), False, "evacuation_pending", BG + ': VMI is marked for evacuation from node "worker-a"'),
    # 6. migration in flight
    Row("6 VMI migrationState started, not ended", [vmi("db", "worker-a", migration=mstate("m3", "worker-a", "worker-b", 2)), DB_POD],
        desched(), False, "migration_in_progress", BG + ": live migration from worker-a to worker-b started 2m0s ago"),
    Row("6 in flight also blocks kubectl drain", [vmi("db", "worker-a", migration=mstate("m3", "worker-a", "worker-b", 2)), DB_POD],
        user(), False, "migration_in_progress", BG),
    Row("6 VMIM queued before migrationState shows it", [DB, DB_POD, vmim("m4", "db", "Scheduling", 1)], desched(), False,
        "migration_in_progress", BG + ": migration vms/m4 is Scheduling"),
    Row("6 VMIM with phase unset", [DB, DB_POD, vmim("m4", "db", "", 1)], desched(), False, "migration_in_progress", BG),
    Row("6 decentralized source (sendTo) not finished: in flight", [DB, DB_POD, vmim("d1", "db", "Synchronizing", 1,
        send_to=True)], desched(), False, "migration_in_progress",
        BG + ": decentralized migration (sendTo: leaving for another namespace or cluster) vms/d1 is Synchronizing"),
    Row("6 decentralized target (receive) not finished: in flight on the receiving side", [DB, DB_POD,
        vmim("d2", "db", "WaitingForSync", 1, receive=True)], desched(), False, "migration_in_progress",
        "decentralized migration (receive: arriving from another namespace or cluster) vms/d2 is WaitingForSync"),
    Row("6 a finished decentralized migration is not in flight", [DB, DB_POD, vmim("d3", "db", "Succeeded", 600,
        mstate("d3", "other-cluster-node", "worker-a", 599, 598), receive=True)], desched(), True, "allowed"),
    Row("6 blocked by a backup: in flight, the message names the condition", [DB_MARKED, DB_POD,
        vmim("b1", "db", "Pending", 2, evacuation="worker-a", priority=MAINT, conditions=[BACKUP])], desched(), False,
        "migration_in_progress", BG + ": migration vms/b1 is Pending; waiting: migrationBlockedByBackup "
        "(BackupInProgress: Waiting for backup nightly-db to complete)"),
    Row("6 a condition with status False does not hold it back", [DB, DB_POD, vmim("b2", "db", "Pending", 2,
        conditions=[condition("migrationBlockedByBackup", status="False")])], desched(), False, "migration_in_progress",
        BG + ": migration vms/b2 is Pending"),
    Row("6 unfinished VMIM older than the VMI is ignored", [vmi("db", "worker-a", created=30), DB_POD, vmim("m5", "db", "Running", 60)],
        desched(), True, "allowed"),
    # 7. marked for evacuation from this node
    Row("7 evacuation pending", [vmi("db", "worker-a", evacuation="worker-a"), DB_POD], desched(), False, "evacuation_pending",
        BG + ': VMI is marked for evacuation from node "worker-a"'),
    Row("7 evacuation pending also blocks drains", [vmi("db", "worker-c", evacuation="worker-c"), pod("db", "worker-c")], user(),
        False, "evacuation_pending", BG + ': VMI is marked for evacuation from node "worker-c"'),
    # 7n. not_migratable: KubeVirt would let the eviction through and stop the VM (descheduler evictions only)
    Row("7n LiveMigratable False with LiveMigrateIfPossible: refused, naming the condition's reason",
        [NOT_MIGRATABLE, DB_POD], desched(), False, "not_migratable",
        'VMI "vms/db" cannot live-migrate (LiveMigratable False: DisksNotLiveMigratable: cannot migrate VMI: PVC db-disk '
        "is not shared"),
    Row("7n the VM's own evictionStrategy None", [vmi("db", "worker-a", strategy="None"), DB_POD], desched(), False,
        "not_migratable", "(evictionStrategy None, from spec.evictionStrategy)"),
    Row("7n the KubeVirt CR's default None", [KV_NONE, DB, DB_POD], desched(), False, "not_migratable",
        "evictionStrategy None, from the KubeVirt CR's evictionStrategy"),
    Row("7n the KubeVirt CR sets no evictionStrategy: KubeVirt's default None", [KV_UNSET, DB, DB_POD], desched(),
        False, "not_migratable", "KubeVirt's default: the KubeVirt CR sets no evictionStrategy"),
    Row("7n the VM's LiveMigrate overrides the CR's None", [KV_NONE, vmi("db", "worker-a", strategy="LiveMigrate"), DB_POD],
        desched(), True, "allowed"),
    Row("7n the CR's LiveMigrateIfPossible with LiveMigratable False", [kubevirt_cr("LiveMigrateIfPossible"),
        vmi("db", "worker-a", migratable=DISKS), DB_POD], desched(), False, "not_migratable", "DisksNotLiveMigratable"),
    Row("7n LiveMigratable True with LiveMigrateIfPossible: movable", [vmi("db", "worker-a", strategy="LiveMigrateIfPossible",
        migratable=("True", "", "")), DB_POD], desched(), True, "allowed"),
    Row("7n LiveMigratable absent: unknown, fails open", [vmi("db", "worker-a", strategy="LiveMigrateIfPossible"), DB_POD],
        desched(), True, "allowed"),
    Row("7n no strategy on the VMI and no KubeVirt CR known: fails open", [DB, DB_POD], desched(), True, "allowed"),
    Row("7n LiveMigrate and not migratable: KubeVirt refuses it itself, not ours", [vmi("db", "worker-a",
        strategy="LiveMigrate", migratable=DISKS), DB_POD], desched(), True, "allowed"),
    Row("7n a drain's eviction is never held", [vmi("db", "worker-c", strategy="LiveMigrateIfPossible", migratable=DISKS),
        pod("db", "worker-c")], desched(), True, "allowed", "being drained"),
    Row("7n an admin's eviction is not touched", [NOT_MIGRATABLE, DB_POD], user(), True, "allowed"),
    Row("7n an admin's eviction is not touched, even with cooldownScope all", [NOT_MIGRATABLE, DB_POD], user(), True,
        "allowed", settings=PolicySettings(cooldown_scope="all")),
    Row("7n refuseNotMigratable false", [NOT_MIGRATABLE, DB_POD], desched(), True, "allowed",
        settings=PolicySettings(refuse_not_migratable=False)),
    Row("7n exempt wins", [vmi("db", "worker-a", strategy="None", annotations=EXEMPT), DB_POD], desched(), True,
        "allowed", "exempt"),
    Row("7n before 7a", [vmi("db", "worker-a", strategy="None", annotations={PNE: ""}), DB_POD_PNE], desched(), False,
        "not_migratable", "(evictionStrategy None, from spec.evictionStrategy): KubeVirt would let this eviction through and the VM would be shut down, not moved"),
    Row("7n after the in-flight rules", [vmi("db", "worker-a", strategy="None", evacuation="worker-a"), DB_POD], desched(),
        False, "evacuation_pending", BG),
    # 7a. prefer-no-eviction (descheduler evictions only; presence of the annotation is what counts)
    Row("7a prefer-no-eviction on the launcher pod", [DB, pod("db", "worker-a", annotations={PNE: ""}), *WEB_LEAVING], desched(),
        False, "prefer_no_eviction", 'VMI "vms/db" prefers not to be evicted by the descheduler'),
    Row("7a prefer-no-eviction on the VMI only", [vmi("db", "worker-a", annotations={PNE: "true"}), DB_POD], desched(), False,
        "prefer_no_eviction", 'VMI "vms/db" prefers not to be evicted by the descheduler (descheduler.alpha.kubernetes.io/prefer-no-eviction)'),
    Row("7a deschedulerUsers count as the descheduler", [DB, pod("db", "worker-a", annotations={PNE: ""})],
        user(username="ops:rebalancer"), False, "prefer_no_eviction", "prefers not to be evicted by the descheduler", settings=PolicySettings(descheduler_users=frozenset({"ops:rebalancer"}))),
    Row("7a not for an admin eviction", [DB_PNE, DB_POD_PNE], user(), True, "allowed"),
    Row("7a not for an admin eviction, even with cooldownScope all", [DB_PNE, DB_POD_PNE], user(), True, "allowed",
        settings=PolicySettings(cooldown_scope="all")),
    Row("7a not on a node being drained", [vmi("db", "worker-c", annotations={PNE: ""}), pod("db", "worker-c", annotations={PNE: ""})],
        desched(), True, "allowed", "being drained"),
    Row("7a honorPreferNoEviction false", [DB_PNE, DB_POD_PNE], desched(), True, "allowed",
        settings=PolicySettings(honor_prefer_no_eviction=False)),
    Row("7a in-flight rules come first", [vmi("db", "worker-a", migration=mstate("m3", "worker-a", "worker-b", 2), annotations={PNE: ""}),
        DB_POD_PNE], desched(), False, "migration_in_progress", BG),
    # exempt: "true" skips 7a, 8 and 9, never 5 to 7; a malformed override is ignored
    Row("exempt VM in cooldown", [vmi("db", "worker-a", migration=RECENT, annotations=EXEMPT), DB_POD], desched(), True, "allowed",
        "exempt"),
    Row("exempt VM on a busy node", [vmi("db", "worker-a", annotations={EX: "True"}), DB_POD, *WEB_LEAVING], desched(), True,
        "allowed", "exempt"),
    Row("exempt VM that prefers no eviction", [vmi("db", "worker-a", annotations={**EXEMPT, PNE: ""}), DB_POD_PNE], desched(), True,
        "allowed", "exempt"),
    Row("exempt VM still held while migrating", [vmi("db", "worker-a", migration=mstate("m3", "worker-a", "worker-b", 2),
        annotations=EXEMPT), DB_POD], desched(), False, "migration_in_progress", BG + ": live migration from worker-a to worker-b started 2m0s ago is in flight"),
    Row("exempt VM still held while marked for evacuation", [vmi("db", "worker-a", evacuation="worker-a", annotations=EXEMPT),
        DB_POD], user(), False, "evacuation_pending", BG + ': VMI is marked for evacuation from node "worker-a"'),
    Row("exempt VM's target pod still held", [vmi("db", "worker-b", annotations=EXEMPT), DB_POD], user(), False, "migration_target", 'Eviction request for target Pod of VMI "vms/db"'),
    Row("exempt: a value other than true is ignored", [vmi("db", "worker-a", migration=RECENT, annotations={EX: "yes"}), DB_POD],
        desched(), False, "cooldown", 'VMI "vms/db" is in migration cooldown: last migration finished 5m0s ago'),
    # 8. node budget
    Row("8 another VM leaving the node", [DB, DB_POD, *WEB_LEAVING], desched(), False, "node_busy",
        'node "worker-a" already has 1 VM(s) leaving (vms/web); retry after they finish'),
    Row("8 leaving by migration in flight from the node", [DB, DB_POD, vmi("web", "worker-a", migration=mstate("w1", "worker-a", "worker-b", 3))],
        desched(), False, "node_busy", "1 VM(s) leaving (vms/web); retry after they finish"),
    Row("8 leaving by unfinished VMIM", [DB, DB_POD, vmi("web", "worker-a"), vmim("w2", "web", "Pending", 3)], desched(), False, "node_busy", "1 VM(s) leaving (vms/web); retry after they finish"),
    Row("8 a decentralized migration away (sendTo) leaves the node: counts", [DB, DB_POD, vmi("web", "worker-a"),
        vmim("w3", "web", "Synchronizing", 3, send_to=True)], desched(), False, "node_busy", "(vms/web)"),
    Row("8 a VM arriving (receive VMIM, not finished) leaves no node of ours", [DB, DB_POD, vmi("web", "worker-a"),
        vmim("w3", "web", "Running", 3, receive=True)], desched(), True, "allowed"),
    Row("8 an arriving VM's in-flight migrationState (a new uid) leaves no node of ours", [DB, DB_POD,
        vmi("web", "worker-a", migration={**mstate("w4", "worker-a", "worker-a", 2), "sourceState": {
            "virtualMachineInstanceUID": "uid-web-in-the-other-cluster", "node": "worker-a"}})], desched(), True, "allowed"),
    Row("8 a VM leaving another node does not count", [DB, DB_POD, vmi("web", "worker-b", evacuation="worker-b")], desched(), True, "allowed"),
    Row("8 not in scope: admin eviction", [DB, DB_POD, *WEB_LEAVING], user(), True, "allowed"),
    Row("8 scope all: admin eviction held", [DB, DB_POD, *WEB_LEAVING], user(), False, "node_busy", "1 VM(s) leaving (vms/web); retry after they finish",
        settings=PolicySettings(cooldown_scope="all")),
    Row("8 budget 2, one leaving", [DB, DB_POD, *WEB_LEAVING], desched(), True, "allowed",
        settings=PolicySettings(pending_evacuations_per_node=2)),
    Row("8 budget 2, two leaving", [DB, DB_POD, *WEB_LEAVING, vmi("app", "worker-a", evacuation="worker-a")], desched(), False,
        "node_busy", "2 VM(s) leaving (vms/app, vms/web)", settings=PolicySettings(pending_evacuations_per_node=2)),
    Row("8 budget 0 disables the rule", [DB, DB_POD, *WEB_LEAVING], desched(), True, "allowed",
        settings=PolicySettings(pending_evacuations_per_node=0)),
    Row("8 a leaver failing for 90 min still counts (no stale exit: the budget holds until it ends)",
        [DB, DB_POD, vmi("web", "worker-a", evacuation="worker-a"),
         vmim("e1", "web", "Failed", 90, mstate("e1", "worker-a", "worker-b", 89, 80, failed=True), evacuation="worker-a"),
         vmim("e2", "web", "Failed", 10, mstate("e2", "worker-a", "worker-b", 9, 5, failed=True), evacuation="worker-a")],
        desched(), False, "node_busy", 'node "worker-a" already has 1 VM(s) leaving (vms/web); retry after they finish'),
    Row("8 evacuation VMIMs before the last success belong to an earlier episode",
        [DB, DB_POD, vmi("web", "worker-a", evacuation="worker-a"),
         vmim("e1", "web", "Failed", 200, mstate("e1", "worker-a", "worker-b", 199, 190, failed=True), evacuation="worker-a"),
         vmim("ok", "web", "Succeeded", 150, mstate("ok", "worker-b", "worker-a", 149, 140)),
         vmim("e2", "web", "Failed", 20, mstate("e2", "worker-a", "worker-b", 19, 15, failed=True), evacuation="worker-a")],
        desched(), False, "node_busy", "1 VM(s) leaving (vms/web); retry"),
    Row("8 a VM beside a stuck descheduler evacuation (3 failures in 15 min) is refused",
        [DB, DB_POD, vmi("web", "worker-a", evacuation="worker-a", annotations=SRC), *failing_evacuation("web", "worker-a", 3)],
        desched(), False, "node_busy", "1 VM(s) leaving (vms/web (stuck: 3 failed attempts in 15m0s))"),
    Row("8 a VM beside a stuck evacuation whose mark was cancelled, a retry still queued, is refused",
        [DB, DB_POD, vmi("web", "worker-a", annotations=SRC), *failing_evacuation("web", "worker-a", 3, running=True)],
        desched(), False, "node_busy", "(vms/web (stuck: 3 failed attempts"),
    Row("8 a VM beside an evacuation waiting for a backup is refused, the message names the backup",
        [DB, DB_POD, vmi("web", "worker-a", evacuation="worker-a", annotations=SRC),
         *failing_evacuation("web", "worker-a", 3),
         vmim("web-b", "web", "Pending", 1, evacuation="worker-a", priority=MAINT, conditions=[BACKUP])],
        desched(), False, "node_busy",
        "(vms/web (waiting: migrationBlockedByBackup (BackupInProgress: Waiting for backup nightly-db to complete)))"),
    Row("8 a drain's failing evacuation still counts (not stale yet)",
        [DB, DB_POD, vmi("web", "worker-a", evacuation="worker-a"),
         *failing_evacuation("web", "worker-a", 3, priority="system-critical")], desched(), False, "node_busy", "1 VM(s) leaving (vms/web); retry"),
    Row("8 two failures: still counts", [DB, DB_POD, vmi("web", "worker-a", evacuation="worker-a", annotations=SRC),
        *failing_evacuation("web", "worker-a", 2)], desched(), False, "node_busy", "1 VM(s) leaving (vms/web); retry"),
    Row("8 leaver of unknown age counts", [DB, DB_POD, *WEB_LEAVING], desched(), False, "node_busy", "1 VM(s) leaving (vms/web); retry",
        settings=PolicySettings(evacuation_stale_after=60)),
    Row("8 a migration in flight longer than evacuationStaleAfter still counts",
        [DB, DB_POD, vmi("web", "worker-a", migration=mstate("w1", "worker-a", "worker-b", 3))],
        desched(), False, "node_busy", "(vms/web)", settings=PolicySettings(evacuation_stale_after=60)),
    Row("8 drain exemption: cordoned node", [vmi("db", "worker-c"), pod("db", "worker-c"), vmi("web", "worker-c", evacuation="worker-c")],
        desched(), True, "allowed", "cordoned"),
    Row("8 drain exemption: autoscaler taint, not cordoned",
        [vmi("db", "worker-d"), pod("db", "worker-d"), vmi("web", "worker-d", evacuation="worker-d")],
        desched(), True, "allowed", "ToBeDeletedByClusterAutoscaler"),
    # 8b. node cooldown: the descheduler moved a VM off this node a short while ago
    Row("8b node cooldown, exact text", [DB, DB_POD, *LEFT_A], desched(), False, "node_cooldown",
        'node "worker-a" is in node cooldown: VMI vms/web left it for worker-b 5m0s ago (descheduler), cooldown 15m0s '
        "(1 descheduler move in the last 1h0m0s), 10m0s left; choose a VM on another node", settings=NODE_CD),
    Row("8b off by default", [DB, DB_POD, *LEFT_A], desched(), True, "allowed"),
    Row("8b the instant the node cooldown ends (left exactly 15m0s ago): allowed", [DB, DB_POD, vmi("web", "worker-b"),
        vmim("w1", "web", "Succeeded", 18, mstate("w1", "worker-a", "worker-b", 17, 15), priority=MAINT)],
        desched(), True, "allowed", settings=NODE_CD),
    Row("8b one second before it ends: refused", [DB, DB_POD, vmi("web", "worker-b"),
        vmim("w1", "web", "Succeeded", 18, mstate("w1", "worker-a", "worker-b", 17, 15 - 1 / 60), priority=MAINT)],
        desched(), False, "node_cooldown", "1s left", settings=NODE_CD),
    Row("8b a decentralized migration away (sendTo) is no move between our nodes", [DB, DB_POD,
        vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-a", "worker-b", 7, 5), priority=MAINT, send_to=True)],
        desched(), True, "allowed", settings=NODE_CD),
    Row("8b over: the departure ended 20 min ago", [DB, DB_POD, vmi("web", "worker-b"),
        vmim("w1", "web", "Succeeded", 25, mstate("w1", "worker-a", "worker-b", 22, 20), priority=MAINT)],
        desched(), True, "allowed", settings=NODE_CD),
    Row("8b doubles: 2 departures within the window", [DB, DB_POD, *LEFT_A, vmi("app", "worker-c"),
        vmim("a1", "app", "Succeeded", 40, mstate("a1", "worker-a", "worker-c", 38, 30), priority=MAINT)],
        desched(), False, "node_cooldown", "cooldown 30m0s (2 descheduler moves", settings=NODE_CD),
    Row("8b a drain's migration (system-critical) does not count", [DB, DB_POD, vmi("web", "worker-b"),
        vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-a", "worker-b", 7, 5), priority="system-critical")],
        desched(), True, "allowed", settings=NODE_CD),
    Row("8b no priority (KubeVirt without its priority gate): the VMI's live eviction-source says descheduler",
        [DB, DB_POD, vmi("web", "worker-b", evacuation="worker-b",
                         annotations={"kubevirt.io/eviction-source": "descheduler"}),
         vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-a", "worker-b", 7, 5))],
        desched(), False, "node_cooldown", "VMI vms/web left it for worker-b 5m0s ago (descheduler)", settings=NODE_CD),
    Row("8b no priority: a stale eviction-source (left by a cancel, the VMI not marked) does not count",
        [DB, DB_POD, vmi("web", "worker-b", annotations={"kubevirt.io/eviction-source": "descheduler"}),
         vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-a", "worker-b", 7, 5))],
        desched(), True, "allowed", settings=NODE_CD),
    Row("8b no priority, no eviction-source: not counted", [DB, DB_POD, vmi("web", "worker-b"),
        vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-a", "worker-b", 7, 5))],
        desched(), True, "allowed", settings=NODE_CD),
    Row("8b a failed migration did not leave", [DB, DB_POD, vmi("web", "worker-a"),
        vmim("w1", "web", "Failed", 8, mstate("w1", "worker-a", "worker-b", 7, 5, failed=True), priority=MAINT)],
        desched(), True, "allowed", settings=NODE_CD),
    Row("8b a long departure lengthens it (base = its duration)", [DB, DB_POD, vmi("web", "worker-b"),
        vmim("w1", "web", "Succeeded", 31, mstate("w1", "worker-a", "worker-b", 30, 5), priority=MAINT)],
        desched(), False, "node_cooldown", "cooldown 25m0s", settings=NODE_CD),
    Row("8b not in scope: admin eviction", [DB, DB_POD, *LEFT_A], user(), True, "allowed", settings=NODE_CD),
    Row("8b scope all: admin eviction held", [DB, DB_POD, *LEFT_A], user(), False, "node_cooldown", 'node "worker-a" is in node cooldown: VMI vms/web left it for worker-b',
        settings=replace(NODE_CD, cooldown_scope="all")),
    Row("8b drain exemption: cordoned node", [vmi("db", "worker-c"), pod("db", "worker-c"), vmi("web", "worker-b"),
        vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-c", "worker-b", 7, 5), priority=MAINT)],
        desched(), True, "allowed", "cordoned", settings=NODE_CD),
    Row("8b exempt VM", [vmi("db", "worker-a", annotations=EXEMPT), DB_POD, *LEFT_A], desched(), True, "allowed",
        settings=NODE_CD),
    Row("8b a move onto the node is not a departure", [DB, DB_POD, *ARRIVED_A], desched(), True, "allowed",
        settings=NODE_CD),
    # 8c. target-node cooldown: the descheduler moved a VM onto this node a short while ago
    Row("8c target-node cooldown, exact text", [DB, DB_POD, *ARRIVED_A], desched(), False, "target_node_cooldown",
        'node "worker-a" is in target-node cooldown: VMI vms/web arrived from worker-b 5m0s ago (descheduler), '
        "cooldown 15m0s (1 descheduler move in the last 1h0m0s), 10m0s left; choose a VM on another node",
        settings=TARGET_CD),
    Row("8c off by default", [DB, DB_POD, *ARRIVED_A], desched(), True, "allowed"),
    Row("8c the instant the target-node cooldown ends (arrived exactly 15m0s ago): allowed", [DB, DB_POD,
        vmi("web", "worker-a"), vmim("w1", "web", "Succeeded", 18, mstate("w1", "worker-b", "worker-a", 17, 15),
        priority=MAINT)], desched(), True, "allowed", settings=TARGET_CD),
    Row("8c one second before it ends: refused", [DB, DB_POD, vmi("web", "worker-a"), vmim("w1", "web", "Succeeded", 18,
        mstate("w1", "worker-b", "worker-a", 17, 15 - 1 / 60), priority=MAINT)], desched(), False, "target_node_cooldown",
        "1s left", settings=TARGET_CD),
    Row("8c an arrival from another cluster (receive) is no move onto our node", [DB, DB_POD,
        vmi("web", "worker-a", annotations=SRC), vmim("w1", "web", "Succeeded", 8,
        mstate("w1", "worker-b", "worker-a", 7, 5), priority=MAINT, receive=True)], desched(), True, "allowed",
        settings=TARGET_CD),
    Row("8c a drain's arrival does not count", [DB, DB_POD, vmi("web", "worker-a"),
        vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-b", "worker-a", 7, 5), priority="system-critical")],
        desched(), True, "allowed", settings=TARGET_CD),
    Row("8c churn only: a node that only received is left alone", [DB, DB_POD, *ARRIVED_A], desched(), True, "allowed",
        settings=replace(TARGET_CD, target_node_cooldown_churn_only=True)),
    Row("8c churn only: received and sent", [DB, DB_POD, *ARRIVED_A, vmi("app", "worker-c"),
        vmim("a1", "app", "Succeeded", 4, mstate("a1", "worker-a", "worker-c", 3, 2), priority=MAINT)],
        desched(), False, "target_node_cooldown", "(it also sent a VM away: churn)",
        settings=replace(TARGET_CD, target_node_cooldown_churn_only=True)),
    Row("8c drain exemption: autoscaler taint", [vmi("db", "worker-d"), pod("db", "worker-d"), vmi("web", "worker-d"),
        vmim("w1", "web", "Succeeded", 8, mstate("w1", "worker-b", "worker-d", 7, 5), priority=MAINT)],
        desched(), True, "allowed", "ToBeDeletedByClusterAutoscaler", settings=TARGET_CD),
    Row("8c after rule 8: a leaver is node_busy", [DB, DB_POD, *ARRIVED_A, *WEB2_LEAVING], desched(), False, "node_busy", 'node "worker-a" already has 1 VM(s) leaving (vms/web2)',
        settings=TARGET_CD),
    # 9. cooldown
    Row("9 cooldown, exact text", [DB_RECENT, DB_POD], desched(), False, "cooldown",
        'VMI "vms/db" is in migration cooldown: last migration finished 5m0s ago, cooldown 15m0s '
        "(1 migration in the last 48h0m0s), retry in 10m0s"),
    Row("9 not in scope: admin eviction", [DB_RECENT, DB_POD], user(), True, "allowed"),
    Row("9 deschedulerUsers makes a user in scope", [DB_RECENT, DB_POD], user(username="system:serviceaccount:ops:rebalancer"),
        False, "cooldown", "retry in 10m0s", settings=PolicySettings(descheduler_users=frozenset({"system:serviceaccount:ops:rebalancer"}))),
    Row("9 cooldownScope all", [DB_RECENT, DB_POD], user(), False, "cooldown", "retry in 10m0s", settings=PolicySettings(cooldown_scope="all")),
    Row("9 drain exemption: cordoned node", [vmi("db", "worker-c", migration=RECENT), pod("db", "worker-c")], desched(), True, "allowed"),
    Row("9 drain exemption: autoscaler taint, not cordoned", [vmi("db", "worker-d", migration=RECENT), pod("db", "worker-d")],
        desched(), True, "allowed", "tainted ToBeDeletedByClusterAutoscaler"),
    Row("9 drain exemption: unschedulable taint", [vmi("db", "worker-e", migration=RECENT), pod("db", "worker-e")],
        desched(), True, "allowed", "tainted node.kubernetes.io/unschedulable"),
    Row("9 drain exemption: KubeVirt's drain taint", [vmi("db", "worker-g", migration=RECENT), pod("db", "worker-g")],
        desched(), True, "allowed", "tainted kubevirt.io/drain"),
    Row("9 scope all: autoscaler's eviction on its tainted node passes",
        [vmi("db", "worker-d", migration=RECENT), pod("db", "worker-d")], user(username="system:serviceaccount:kube-system:cluster-autoscaler"),
        True, "allowed", "ToBeDeletedByClusterAutoscaler", settings=PolicySettings(cooldown_scope="all")),
    Row("8 scope all: autoscaler's eviction passes the node budget on its tainted node",
        [vmi("db", "worker-d"), pod("db", "worker-d"), vmi("web", "worker-d", evacuation="worker-d")], user(), True, "allowed",
        "being drained", settings=PolicySettings(cooldown_scope="all")),
    Row("9 another taint is no drain", [vmi("db", "worker-f", migration=RECENT), pod("db", "worker-f")],
        desched(), False, "cooldown", 'VMI "vms/db" is in migration cooldown'),
    Row("9 cooldown over", [vmi("db", "worker-a", migration=mstate("m1", "worker-b", "worker-a", 22, 20)), DB_POD], desched(), True, "allowed"),
    Row("9 the instant the cooldown ends (ended exactly 15m0s ago): allowed",
        [vmi("db", "worker-a", migration=mstate("m1", "worker-b", "worker-a", 17, 15)), DB_POD], desched(), True, "allowed"),
    Row("9 one second before it ends: refused", [vmi("db", "worker-a", migration=mstate("m1", "worker-b", "worker-a", 17,
        15 - 1 / 60)), DB_POD], desched(), False, "cooldown", "retry in 1s"),
    Row("9 cooldown 0 means no cooldown", [DB_RECENT, DB_POD], desched(), True, "allowed",
        settings=PolicySettings(migration_cooldown=0, max_migration_cooldown=0)),
    Row("9 failed migration counts", [vmi("db", "worker-a", migration=mstate("m1", "worker-a", "worker-b", 7, 5, failed=True)), DB_POD],
        desched(), False, "cooldown", "last migration finished 5m0s ago, cooldown 15m0s (1 migration"),
    Row("9 history annotation counts past KubeVirt's 5 VMIMs", [*six_short_migrations(), DB_POD], desched(), False,
        "cooldown", "cooldown 6h0m0s (6 migrations in the last 48h0m0s)"),
    Row("9 a migration that ended exactly migrationHistoryWindow ago is not counted (strict, as the plugin)",
        [vmi("db", "worker-a", migration=RECENT), DB_POD, vmim("old", "db", "Succeeded", 48 * 60 + 3,
         mstate("old", "worker-a", "worker-b", 48 * 60 + 2, 48 * 60))], desched(), False, "cooldown",
        "cooldown 15m0s (1 migration in the last 48h0m0s)"),
    Row("9 uid-less migration seen on the VMI and as a VMIM counts once",
        [vmi("db", "worker-a", migration=UIDLESS), DB_POD, vmim("m1", "db", "Succeeded", 8, RECENT)], desched(), False, "cooldown",
        "cooldown 15m0s (1 migration in the last 48h0m0s)"),
    # 9 with the VM's own migration-cooldown (replaces migrationCooldown; a cap below it is raised to it)
    Row("9 per-VM cooldown 1h", [vmi("db", "worker-a", migration=RECENT, annotations={CD: "1h"}), DB_POD], desched(), False,
        "cooldown", "cooldown 1h0m0s (1 migration in the last 48h0m0s), retry in 55m0s"),
    Row("9 per-VM cooldown 0: the last duration (2m) is the base", [vmi("db", "worker-a", migration=RECENT, annotations={CD: "0"}),
        DB_POD], desched(), True, "allowed"),
    Row("9 per-VM cooldown above the cap raises the cap for that VM", [vmi("db", "worker-a", migration=RECENT,
        annotations={CD: "12h"}), DB_POD], desched(), False, "cooldown", "cooldown 12h0m0s"),
    Row("9 per-VM cooldown backs off like the global one", [vmi("db", "worker-a", migration=RECENT, annotations={CD: "5m"}), DB_POD,
        vmim("m0", "db", "Succeeded", 62, mstate("m0", "worker-b", "worker-a", 61, 60))], desched(), False, "cooldown",
        "cooldown 10m0s (2 migrations in the last 48h0m0s), retry in 5m0s"),
    Row("9 per-VM cooldown that is not a Go duration is ignored", [vmi("db", "worker-a", migration=RECENT,
        annotations={CD: "15 minutes"}), DB_POD], desched(), False, "cooldown", "cooldown 15m0s"),
    Row("9 negative per-VM cooldown is ignored", [vmi("db", "worker-a", migration=RECENT, annotations={CD: "-5m"}), DB_POD],
        desched(), False, "cooldown", "cooldown 15m0s"),
    # 10. steering with Prometheus data (hot worker-a: db 2 cores, web 6, big 12; predicted gains 11, 30, 36 points)
    Row("10 another VM on the node helps clearly more", STEER, desched(), False, "better_candidate",
        'moving vms/big would help node "worker-a" more: lowers it by 36', usage=USAGE),
    Row("10 the best move passes", STEER, desched(P_BIG), True, "allowed", usage=USAGE),
    Row("10 within the margin of the best passes", STEER, desched(P_WEB), True, "allowed", usage=USAGE,
        settings=PolicySettings(steering_margin=10)),
    Row("10 just outside the margin is held", STEER, desched(P_WEB), False, "better_candidate", 'moving vms/big would help node "worker-a" more: lowers it by 36.2 points against lowers it by 30.2 points for this VMI', usage=USAGE),
    Row("10 the best VM is in cooldown: the next best is the one to wait for",
        [*STEER[:-2], vmi("big", "worker-a", migration=RECENT), pod("big", "worker-a")], desched(), False,
        "better_candidate", "moving vms/web", usage=USAGE),
    Row("10 a VM already leaving is not a candidate (rule 8 off)",
        [*STEER[:-2], vmi("big", "worker-a", evacuation="worker-a"), pod("big", "worker-a")], desched(), False,
        "better_candidate", "moving vms/web", usage=USAGE, settings=PolicySettings(pending_evacuations_per_node=0)),
    Row("10 no move helps enough", STEER, desched(P_BIG), False, "no_gain",
        'no VM on node "worker-a" would lower its score', usage=USAGE, settings=PolicySettings(steering_min_gain=40)),
    Row("10 data older than the limit fails open", STEER, desched(), True, "metrics_unavailable", "old (limit 1m30s)",
        usage=usage_snapshot(age=300)),
    Row("10 nothing fetched yet fails open", STEER, desched(), True, "metrics_unavailable", "no usage data from Prometheus yet",
        usage=UsageSnapshot()),
    Row("10 no usage for this VMI fails open", [*STEER, vmi("new", "worker-a"), pod("new", "worker-a")],
        desched("virt-launcher-new-abcde"), True, "metrics_unavailable", "this VMI", usage=USAGE),
    Row("10 drains are exempt", [vmi("db", "worker-c"), pod("db", "worker-c")], desched(), True, "allowed", "being drained",
        usage=usage_snapshot(hot="worker-c")),
    Row("10 not a descheduler eviction", STEER, user(), True, "allowed", usage=USAGE),
    Row("10 cooldownScope all still steers descheduler evictions only", STEER, user(), True, "allowed", usage=USAGE,
        settings=PolicySettings(cooldown_scope="all")),
    Row("10 a VM that prefers not to be evicted is no candidate",
        [*STEER[:-2], vmi("big", "worker-a", annotations={PNE: ""}), pod("big", "worker-a")], desched(), False,
        "better_candidate", "moving vms/web", usage=USAGE),
    Row("10 off without Prometheus", STEER, desched(), True, "allowed"),
    # 11. otherwise
    Row("11 quiet VM", [DB, DB_POD], desched(), True, "allowed"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_decision_table(row: Row) -> None:
    d = decide(row.req, store_of(*NODES, *row.objects), NOW, row.settings, row.health, row.usage)
    assert (d.allowed, d.reason) == (row.allowed, row.reason), d.message
    assert row.text in d.message


@pytest.mark.parametrize("row", [r for r in ROWS if not r.allowed], ids=lambda r: r.id)
def test_dry_run_gives_the_same_decision(row: Row) -> None:
    wet = decide(row.req, store_of(*NODES, *row.objects), NOW, row.settings, row.health, row.usage)
    dry = decide(replace(row.req, dry_run=True), store_of(*NODES, *row.objects), NOW, row.settings, row.health, row.usage)
    assert (dry.allowed, dry.reason, dry.message) == (wet.allowed, wet.reason, wet.message)
    assert dry.dry_run and not wet.dry_run


def test_background_text_only_for_rules_6_and_7() -> None:
    for row in ROWS:
        d = decide(row.req, store_of(*NODES, *row.objects), NOW, row.settings, row.health, row.usage)
        has = "Eviction triggered evacuation" in d.message
        assert has == (d.reason in ("migration_in_progress", "evacuation_pending")), row.id
        assert d.background == has


def test_cooldown_remaining_is_reported() -> None:
    d = decide(desched(), store_of(*NODES, DB_RECENT, DB_POD), NOW, PolicySettings())
    assert d.remaining == pytest.approx(10 * MIN)


def test_pod_is_identified_by_request_name_not_vmi() -> None:
    # the request names the pod; a pod with the VMI's name is not the one evicted
    d = decide(desched("db"), store_of(*NODES, DB_RECENT, DB_POD), NOW, PolicySettings())
    assert d.reason == "not_a_vm_pod"


def test_mark_for_another_node_is_not_rule_7() -> None:
    objs = [vmi("db", "worker-a", evacuation="worker-b"), DB_POD]
    d = decide(desched(), store_of(*NODES, *objs), NOW, PolicySettings())
    assert d.reason == "allowed"


def test_every_denial_row_checks_its_message() -> None:
    """A denial's message is what the descheduler logs and an admin reads: each row says what it must contain."""
    assert [r.id for r in ROWS if not r.allowed and not r.text] == []
