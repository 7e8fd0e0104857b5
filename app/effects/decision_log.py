"""One structured log line per decision: who asked, what was decided, why.

The fields are the ones an operator filters on (uid to match the API server's
audit log, namespace/pod/VMI/node to find the VM, requester to find the
caller, reason and the cooldown numbers to understand the answer). Never the
request body, never anything from the user's credentials beyond the username;
what the request says goes through ``text.printable`` (escaped, at most 200
characters a field), so a line stays under a few KiB whatever was sent.
"""

from __future__ import annotations

import logging
from typing import Any

from app.effects.text import MAX_MESSAGE, printable
from app.logs import structured
from app.policy.model import Decision, Review

log = logging.getLogger("kubevirt_eviction_guard.decision")


def decision_fields(review: Review, decision: Decision) -> dict[str, Any]:
    ev = review.eviction
    fields: dict[str, Any] = {
        "uid": printable(review.uid),
        "namespace": printable(ev.namespace),
        "pod": printable(ev.name),
        "vmi": decision.vmi.name if decision.vmi else None,
        "node": decision.node or None,
        "requester": printable(ev.requested_by or ev.username) or None,
        "user": printable(ev.username) or None,
        "decision": "allowed" if decision.allowed else "denied",
        "reason": decision.reason,
        "dry_run": decision.dry_run or ev.dry_run,
    }
    if ev.eviction_reason:
        fields["eviction_reason"] = printable(ev.eviction_reason)
    cd = decision.cooldown
    if cd is not None:
        fields["cooldown_s"] = int(round(cd.cooldown))  # type: ignore[attr-defined]
        fields["migrations_in_window"] = cd.count  # type: ignore[attr-defined]
    if decision.remaining is not None:
        fields["remaining_s"] = int(round(decision.remaining))
    if decision.leaving:
        fields["leaving"] = ",".join(decision.leaving)
    ranking = decision.ranking
    if ranking is not None:  # steering: this VM's predicted gain and the best one's, in score points
        mine, best = ranking.of(decision.vmi.key) if decision.vmi else None, ranking.best  # type: ignore[attr-defined]
        fields["score"] = round(ranking.hot_score, 1)  # type: ignore[attr-defined]
        fields["target"] = ranking.target  # type: ignore[attr-defined]
        if mine is not None:
            fields["gain"] = round(mine.gain, 1)
        if best is not None:
            fields["best"] = best.name
            fields["best_gain"] = round(best.gain, 1)
    return fields


def log_decision(review: Review, decision: Decision) -> None:
    # the message may quote the request (a pod that is not a VM's): printable and short as well
    structured(log, logging.INFO, printable(decision.message, MAX_MESSAGE), decision_fields(review, decision))  # logging.info, minus most of its cost
