"""``make e2e``'s runner (tests/e2e/groups.py): how groups are packed into processes and how their summaries merge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e import groups as runner


@pytest.fixture
def times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "group-times.json"
    monkeypatch.setattr(runner, "TIMES", path)
    return path


def test_groups_are_packed_longest_first_by_the_last_run(times: Path):
    groups = {"control-plane": ["t"] * 30, "node": ["t"] * 9, "kubevirt": ["t"] * 5, "test_outcome": ["t"] * 3,
              "test_a": ["t"], "test_b": ["t"]}
    # first run: by test count; every group in exactly one process, never more processes than jobs
    first = runner.plan(groups, 4)
    assert len(first) == 4 and sorted(g for p in first for g in p) == sorted(groups)
    assert [p[0] for p in first] == ["control-plane", "node", "kubevirt", "test_outcome"]
    # then by the last run's wall times: the longest groups get a process each, the short ones fill the shortest
    times.write_text(json.dumps({"control-plane": {"seconds": 200}, "node": {"seconds": 250},
                                 "kubevirt": {"seconds": 180}, "test_outcome": {"seconds": 130},
                                 "test_a": {"seconds": 30}, "test_b": {"seconds": 20}}))
    plan = runner.plan(groups, 4)
    assert plan == [["node"], ["control-plane"], ["kubevirt"], ["test_outcome", "test_a", "test_b"]]
    assert runner.plan(groups, 1) == [["node", "control-plane", "kubevirt", "test_outcome", "test_a", "test_b"]]
    assert runner.plan({"node": ["t"]}, 4) == [["node"]]


def test_summaries_merge_into_every_check_once(tmp_path: Path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"kubernetes": "v1", "checks": [{"name": "x", "passed": True, "detail": "x1"},
                                                            {"name": "shared", "passed": True, "detail": "s1"}],
                             "groups": {"node": {"seconds": 1.0, "tests": 2, "passed": True}},
                             "node": {"kubelet": "v1"}}))
    b.write_text(json.dumps({"kubernetes": "v1", "checks": [{"name": "shared", "passed": False, "detail": "s2"}],
                             "groups": {"kubevirt": {"seconds": 2.0, "tests": 1, "passed": False}}}))
    merged = runner.merge([a, b, tmp_path / "missing.json"])
    assert merged["checks"] == [{"name": "x", "passed": True, "detail": "x1"},
                                {"name": "shared", "passed": False, "detail": "s1; s2"}]
    assert set(merged["groups"]) == {"node", "kubevirt"}
    assert merged["node"] == {"kubelet": "v1"} and merged["kubernetes"] == "v1"
