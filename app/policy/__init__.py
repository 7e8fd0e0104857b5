"""The product's judgement: pure functions of (request, cluster view, now, settings)."""

from app.policy.cooldown import (
    CooldownState,
    FinishedMigration,
    cooldown_state,
    effective_cooldown,
    finished_migrations,
)
from app.policy.decide import decide
from app.policy.model import Decision, EvictionAttempt, PolicySettings, Reason

__all__ = [
    "CooldownState",
    "Decision",
    "EvictionAttempt",
    "FinishedMigration",
    "PolicySettings",
    "Reason",
    "cooldown_state",
    "decide",
    "effective_cooldown",
    "finished_migrations",
]
