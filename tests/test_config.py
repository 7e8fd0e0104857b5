"""Settings: Go durations, validation that names the setting, the config file."""

from __future__ import annotations

import pytest

from app.config import SettingsError, build_settings, load_config_file
from app.timefmt import format_duration, parse_duration


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("15m", 900), ("1h30m", 5400), ("0", 0), ("48h", 172800), ("1.5h", 5400),
                                           ("500ms", 0.5), ("-5m", -300)])
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "15 minutes", "m", "1h 30m", "1d"])
def test_parse_duration_rejects(text) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (45, "45s"), (300, "5m0s"), (900, "15m0s"), (172800, "48h0m0s"),
                                           (3661, "1h1m1s"), (599.6, "10m0s")])
def test_format_duration_like_go(seconds, text) -> None:
    assert format_duration(seconds) == text


def test_defaults() -> None:
    s = build_settings({})
    assert (s.migration_cooldown, s.max_migration_cooldown, s.migration_history_window) == (900, 21600, 172800)
    assert (s.cooldown_scope, s.pending_evacuations_per_node, s.evacuation_stale_after) == ("descheduler", 1, 3600)
    # the node cooldowns are off unless set (docs/simulator.md, "Node cooldowns measured", says why)
    assert (s.node_cooldown, s.target_node_cooldown, s.target_node_cooldown_churn_only) == (0, 0, False)
    assert (s.node_cooldown_window, s.max_node_cooldown) == (3600, 3600)


def test_node_cooldown_settings() -> None:
    s = build_settings({"nodeCooldown": "10m", "targetNodeCooldown": "5m", "nodeCooldownWindow": "0",
                        "maxNodeCooldown": "2h", "targetNodeCooldownChurnOnly": "true"})
    assert (s.node_cooldown, s.target_node_cooldown, s.node_cooldown_window, s.max_node_cooldown) == (600, 300, 0, 7200)
    assert s.target_node_cooldown_churn_only is True


def test_zero_means_zero() -> None:
    s = build_settings({"migrationCooldown": "0", "maxMigrationCooldown": 0, "pendingEvacuationsPerNode": 0})
    assert (s.migration_cooldown, s.max_migration_cooldown, s.pending_evacuations_per_node) == (0, 0, 0)


@pytest.mark.parametrize("values, named", [
    ({"migrationCooldown": "-5m"}, "migrationCooldown"),
    ({"migrationHistoryWindow": "two days"}, "migrationHistoryWindow"),
    ({"migrationCooldown": "1h", "maxMigrationCooldown": "30m"}, "maxMigrationCooldown"),
    ({"cooldownScope": "everyone"}, "cooldownScope"),
    ({"pendingEvacuationsPerNode": -1}, "pendingEvacuationsPerNode"),
    ({"pendingEvacuationsPerNode": "many"}, "pendingEvacuationsPerNode"),
    ({"deschedulerUsers": [1, 2]}, "deschedulerUsers"),
    ({"evacuationStaleAfter": "-1s"}, "evacuationStaleAfter"),
    ({"honorPreferNoEviction": "yes"}, "honorPreferNoEviction"),
    ({"honorPreferNoEviction": 1}, "honorPreferNoEviction"),
    ({"evacuationStaleAfterFailures": -1}, "evacuationStaleAfterFailures"),
    ({"evacuationStaleAfterFailures": 6}, "evacuationStaleAfterFailures"),
    ({"evacuationStaleAfterFailures": "three"}, "evacuationStaleAfterFailures"),
    ({"evacuationStaleAfterFailures": 2.5}, "evacuationStaleAfterFailures"),
    ({"evacuationStaleAfterFailures": True}, "evacuationStaleAfterFailures"),
    ({"nodeCooldown": "-1m"}, "nodeCooldown"),
    ({"targetNodeCooldown": "soon"}, "targetNodeCooldown"),
    ({"nodeCooldownWindow": "1 hour"}, "nodeCooldownWindow"),
    ({"maxNodeCooldown": "-1h"}, "maxNodeCooldown"),
    ({"targetNodeCooldownChurnOnly": "maybe"}, "targetNodeCooldownChurnOnly"),
])
def test_invalid_settings_name_the_setting(values, named) -> None:
    with pytest.raises(SettingsError) as e:
        build_settings(values)
    assert str(e.value).startswith(named)


def test_stale_after_failures() -> None:
    assert build_settings({}).evacuation_stale_after_failures == 3
    assert build_settings({"evacuationStaleAfterFailures": "5"}).evacuation_stale_after_failures == 5
    assert build_settings({"evacuationStaleAfterFailures": 0}).evacuation_stale_after_failures == 0
    with pytest.raises(SettingsError, match="KubeVirt keeps only the 5 most recent"):
        build_settings({"evacuationStaleAfterFailures": 9})


def test_config_file(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("migrationCooldown: 30m\ndeschedulerUsers: [a, b]\ncooldownScope: all\n")
    s = build_settings(load_config_file(f))
    assert s.migration_cooldown == 1800 and s.descheduler_users == {"a", "b"} and s.cooldown_scope == "all"


@pytest.mark.parametrize("content, problem", [("migrationCooldown: [", "not valid YAML"), ("- a\n", "expected a mapping"),
                                              ("cooldwnScope: all\n", "unknown setting(s): cooldwnScope")])
def test_bad_config_file(tmp_path, content, problem) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(content)
    with pytest.raises(SettingsError) as e:
        load_config_file(f)
    assert str(f) in str(e.value) and problem in str(e.value)


def test_unreadable_config_file(tmp_path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_config_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize("values, shown", [
    ({"migrationCooldown": "8h"}, "(6h0m0s by default < 8h)"),
    ({"maxMigrationCooldown": "10m"}, "(10m < 15m0s by default)"),
    ({"migrationCooldown": "1h", "maxMigrationCooldown": "30m"}, "(30m < 1h)"),
])
def test_cap_below_floor_message_shows_values_never_none(values, shown) -> None:
    with pytest.raises(SettingsError) as e:
        build_settings(values)
    assert str(e.value).endswith(shown) and "None" not in str(e.value)


@pytest.mark.parametrize("raw, honored", [(True, True), (False, False), ("true", True), ("False", False), (None, True)])
def test_honor_prefer_no_eviction(raw, honored) -> None:
    assert build_settings({"honorPreferNoEviction": raw}).honor_prefer_no_eviction is honored


@pytest.mark.parametrize("raw, refused", [(True, True), (False, False), ("false", False), (None, True)])
def test_refuse_not_migratable(raw, refused) -> None:
    assert build_settings({"refuseNotMigratable": raw}).refuse_not_migratable is refused


def test_refuse_not_migratable_must_be_a_boolean() -> None:
    with pytest.raises(SettingsError, match="refuseNotMigratable"):
        build_settings({"refuseNotMigratable": "sometimes"})
