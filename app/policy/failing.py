"""Evacuations that keep failing, whoever started them: what an operator must be shown.

KubeVirt retries a marked VM without limit (virt-controller's backoff tops out at about 5 minutes), whatever
caused the mark: the descheduler, a drain, an admin's eviction. The guard's canceller ends only the
descheduler's stuck ones (``decide.stuck_evacuation``); a drain's or a user's that keeps failing must still be
seen, with what the operator can do about it. Pure: the effect (``app/effects/failing.py``) asks this for every VMI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.records import MigrationRecord, NodeRecord, VMIRecord
from app.policy.cause import DESCHEDULER, DRAIN, cause_of
from app.policy.decide import blocking_migration, evacuation_episode, is_descheduler_caused, leaving_age
from app.policy.model import PolicySettings
from app.timefmt import format_duration


@dataclass(slots=True, frozen=True)
class FailingEvacuation:
    namespace: str
    name: str
    node: str  # the node being evacuated
    failures: int  # failed attempts since the VM's last successful migration (KubeVirt keeps the last 5 VMIMs)
    age: float | None  # seconds since the evacuation began; None if unknown
    cause: str  # app.policy.cause: descheduler | evacuation | ...
    cancelled_by_guard: bool  # the guard's canceller may end it (descheduler-caused, node not drained)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def message(self) -> str:
        age = format_duration(self.age) if self.age is not None else "an unknown time"
        who = "the descheduler" if self.cause == DESCHEDULER else (
            "a drain or another eviction" if self.cause == DRAIN else self.cause)
        then = ("The guard's canceller ends it where KubeVirt serves evacuate/cancel." if self.cancelled_by_guard
                else "The guard never cancels an evacuation the descheduler did not cause.")
        return (f'The evacuation of this VMI from node "{self.node}" (caused by {who}) has failed {self.failures} '
                f"time(s) in {age}, and KubeVirt retries it without limit. Find why each migration fails "
                f"(kubectl get vmim -n {self.namespace} -l kubevirt.io/vmi-name={self.name}); to stop the retries: "
                f"virtctl evacuate-cancel vmi {self.name} -n {self.namespace}. {then}")


def failing_evacuation(vmi: VMIRecord, migrations: Sequence[MigrationRecord], node: NodeRecord | None, now: float,
                       settings: PolicySettings) -> FailingEvacuation | None:
    """The VM's evacuation has failed ``evacuationStaleAfterFailures`` times (at least once, and at least once
    if that setting is 0 and it is older than ``evacuationStaleAfter``), is still on (the VMI marked, or a retry
    queued), and no KubeVirt condition holds it back (waiting is not failing). ``migrations``: this
    incarnation's VMIMs; ``node``: the node being left (None if unknown)."""
    source = vmi.evacuation_node or next((m.evacuation_node for m in migrations
                                          if not m.finished and m.evacuation_node), "")
    if not source or blocking_migration(migrations) is not None:
        return None
    episode = evacuation_episode(vmi, migrations, source)
    failures = sum(1 for m in episode if m.phase == "Failed")
    if failures == 0:
        return None
    age = leaving_age(vmi, migrations, source, now)
    limit = settings.evacuation_stale_after_failures
    if not ((limit > 0 and failures >= limit) or (age is not None and age > settings.evacuation_stale_after)):
        return None
    draining = node is not None and node.draining
    descheduler = is_descheduler_caused(vmi, episode) and not draining
    cause = DESCHEDULER if descheduler else cause_of(episode[-1]) if episode else DRAIN
    if cause == DESCHEDULER and not descheduler:
        cause = DRAIN  # recorded as the descheduler's, but the node is drained now: a drain's to finish
    return FailingEvacuation(vmi.namespace, vmi.name, source, failures, age, cause, descheduler)
