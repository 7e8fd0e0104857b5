"""Policy settings: the ``--config`` YAML file and the flags of the same names.

Every setting is validated at start-up; a bad one stops the guard with a
message naming it (``migrationCooldown: not a duration: '15 minutes'``).
Unlike the reference plugin, 0 means 0: there is no silent default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app.policy.model import SCOPE_ALL, SCOPE_DESCHEDULER, PolicySettings
from app.timefmt import format_duration, parse_duration

DURATIONS = {
    "migrationCooldown": "migration_cooldown",
    "maxMigrationCooldown": "max_migration_cooldown",
    "migrationHistoryWindow": "migration_history_window",
    "evacuationStaleAfter": "evacuation_stale_after",
    "nodeCooldown": "node_cooldown",
    "targetNodeCooldown": "target_node_cooldown",
    "nodeCooldownWindow": "node_cooldown_window",
    "maxNodeCooldown": "max_node_cooldown",
}
POINTS = {"steeringMinGain": "steering_min_gain", "steeringMargin": "steering_margin"}  # score points, 0..100
BOOLS = {"honorPreferNoEviction": "honor_prefer_no_eviction", "refuseNotMigratable": "refuse_not_migratable",
         "targetNodeCooldownChurnOnly": "target_node_cooldown_churn_only"}
OTHERS = {"cooldownScope": "cooldown_scope", "deschedulerUsers": "descheduler_users",
          "pendingEvacuationsPerNode": "pending_evacuations_per_node",
          "evacuationStaleAfterFailures": "evacuation_stale_after_failures"}
ATTRS = {**DURATIONS, **BOOLS, **POINTS, **OTHERS}  # setting name -> PolicySettings attribute
SETTING_NAMES = (*DURATIONS, "cooldownScope", "deschedulerUsers", "pendingEvacuationsPerNode", *BOOLS, *POINTS,
                 "evacuationStaleAfterFailures")
# one line per setting: --help, and the chart's values.yaml says the same
SETTING_HELP = {
    "migrationCooldown": "floor of a VM's cooldown after any finished migration",
    "maxMigrationCooldown": "cap of the cooldown after backoff; 0: no cap",
    "migrationHistoryWindow": "finished migrations counted for the backoff",
    "evacuationStaleAfter": "a node held this long by its leaving VMs is reported (NodeHeld Event, held_nodes, "
                            "alert); a descheduler-caused evacuation this old is stuck (evacuation_stuck)",
    "nodeCooldown": "node_cooldown: rest of a node after a descheduler move left it; 0: off",
    "targetNodeCooldown": "target_node_cooldown: rest of a node after a descheduler move reached it; 0: off",
    "nodeCooldownWindow": "node cooldowns: each further move of the node within this doubles the rest; 0: never",
    "maxNodeCooldown": "node cooldowns: cap of the rest; 0: no cap",
    "cooldownScope": "descheduler (cooldown and node budget hold only its evictions) or all",
    "deschedulerUsers": "usernames treated as the descheduler besides its requested-by annotation",
    "pendingEvacuationsPerNode": "node_busy: VMs that may be leaving a node at once; 0: node_busy off",
    "honorPreferNoEviction": "prefer_no_eviction: deny descheduler evictions of VMs annotated prefer-no-eviction",
    "refuseNotMigratable": "not_migratable: deny descheduler evictions of VMs that cannot live-migrate (KubeVirt would "
                           "shut them down)",
    "targetNodeCooldownChurnOnly": "target_node_cooldown only while the node also sent a VM away within its rest",
    "steeringMinGain": "steering: score points the best move must gain (0 to 100)",
    "steeringMargin": "steering: hold a VM back when another gains more than this many points more (0 to 100)",
    "evacuationStaleAfterFailures": "failed attempts after which a descheduler-caused evacuation is stuck; "
                                    "0: by age only; at most 5",
}
MAX_STALE_FAILURES = 5  # KubeVirt keeps the 5 most recent finished VMIMs per VMI: more could never be counted
# guard-level settings that may share the config file with the policy
GUARD_KEYS = ("staleAfter", "maxBodyBytes")


class SettingsError(ValueError):
    """A setting or settings file the guard refuses to start with; the text names it."""


def kebab(name: str) -> str:
    return "".join("-" + c.lower() if c.isupper() else c for c in name)


def read_yaml_file(path: str | Path, error: type[Exception], label: str) -> Any:
    """One YAML document from a file; any problem is ``error`` with a message that starts with ``label``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise error(f"{label}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise error(f"{label}: not UTF-8 text") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise error(f"{label}: not valid YAML: {e}".splitlines()[0]) from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    data = read_yaml_file(path, SettingsError, f"--config {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"--config {path}: expected a mapping of settings, got {type(data).__name__}")
    unknown = sorted(set(data) - set(SETTING_NAMES) - set(GUARD_KEYS))
    if unknown:
        raise SettingsError(f"--config {path}: unknown setting(s): {', '.join(map(str, unknown))}")
    return data


def _integer(values: dict, name: str) -> int:
    """A whole number (an int, or a float without a fraction); booleans and text are refused."""
    raw = values[name]
    try:
        number = int(raw)
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError
    except (TypeError, ValueError):
        raise SettingsError(f"{name}: must be an integer, got {raw!r}") from None
    return number


def build_settings(values: dict[str, Any]) -> PolicySettings:
    """Settings from a mapping keyed by the camelCase names (file, then flags on top)."""
    kwargs: dict[str, Any] = {}
    for name, attr in DURATIONS.items():
        if name in values and values[name] is not None:
            raw = values[name]
            try:
                seconds = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw == 0 else parse_duration(raw)
            except ValueError as e:
                raise SettingsError(f"{name}: {e}") from None
            if seconds < 0:
                raise SettingsError(f"{name}: must not be negative, got {raw}")
            kwargs[attr] = seconds
    if values.get("cooldownScope") is not None:
        scope = values["cooldownScope"]
        if scope not in (SCOPE_DESCHEDULER, SCOPE_ALL):
            raise SettingsError(f"cooldownScope: must be '{SCOPE_DESCHEDULER}' or '{SCOPE_ALL}', got {scope!r}")
        kwargs["cooldown_scope"] = scope
    if values.get("deschedulerUsers") is not None:
        users = values["deschedulerUsers"]
        if isinstance(users, str):
            users = [u.strip() for u in users.split(",") if u.strip()]
        if not isinstance(users, list) or not all(isinstance(u, str) and u for u in users):
            raise SettingsError("deschedulerUsers: must be a list of usernames")
        kwargs["descheduler_users"] = frozenset(users)
    if values.get("pendingEvacuationsPerNode") is not None:
        budget = _integer(values, "pendingEvacuationsPerNode")
        if budget < 0:
            raise SettingsError(f"pendingEvacuationsPerNode: must not be negative, got {budget}")
        kwargs["pending_evacuations_per_node"] = budget
    if values.get("evacuationStaleAfterFailures") is not None:
        failures = _integer(values, "evacuationStaleAfterFailures")
        if not 0 <= failures <= MAX_STALE_FAILURES:
            raise SettingsError(
                f"evacuationStaleAfterFailures: must be between 0 (off) and {MAX_STALE_FAILURES} (KubeVirt keeps only "
                f"the {MAX_STALE_FAILURES} most recent finished migrations of a VMI), got {failures}")
        kwargs["evacuation_stale_after_failures"] = failures
    for name, attr in POINTS.items():
        raw = values.get(name)
        if raw is None:
            continue
        try:
            if isinstance(raw, bool):
                raise ValueError
            points = float(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{name}: must be a number of score points (0 to 100), got {raw!r}") from None
        if not 0 <= points <= 100:
            raise SettingsError(f"{name}: must be between 0 and 100 score points, got {raw!r}")
        kwargs[attr] = points
    for name, attr in BOOLS.items():
        if values.get(name) is not None:
            raw = values[name]
            if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
                raw = raw.strip().lower() == "true"
            if not isinstance(raw, bool):
                raise SettingsError(f"{name}: must be true or false, got {values[name]!r}")
            kwargs[attr] = raw
    settings = PolicySettings(**kwargs)
    if (
        settings.max_migration_cooldown > 0
        and settings.migration_cooldown > 0
        and settings.max_migration_cooldown < settings.migration_cooldown
    ):
        raise SettingsError(
            "maxMigrationCooldown: must be 0 (no cap) or at least migrationCooldown "
            f"({_shown(values, 'maxMigrationCooldown', settings)} < {_shown(values, 'migrationCooldown', settings)})"
        )
    return settings


def by_name(settings: PolicySettings) -> dict[str, Any]:
    """The settings as an admin writes them: camelCase names, Go durations (``15m0s``), a list of users."""
    out: dict[str, Any] = {}
    for name in SETTING_NAMES:
        value = getattr(settings, ATTRS[name])
        if name in DURATIONS:
            value = format_duration(value)
        elif isinstance(value, frozenset):
            value = sorted(value)
        out[name] = value
    return out


def _shown(values: dict[str, Any], name: str, settings: PolicySettings) -> str:
    """A duration setting as the admin wrote it, or its value marked as the default."""
    if values.get(name) is not None:
        return str(values[name])
    return f"{format_duration(getattr(settings, DURATIONS[name]))} by default"
