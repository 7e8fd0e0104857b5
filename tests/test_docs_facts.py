"""What the docs state about the code, checked against the code: every metric the guard exposes is in the metrics
table of docs/operations.md, every watch restart cause is named there, and the kinds it watches are counted
right."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from app.domain.kinds import KINDS, OPTIONAL_KINDS
from app.metrics import PREFIX, Metrics
from app.transport.tlsreload import ReloadMetrics

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


def exposed() -> set[str]:
    registry = CollectorRegistry()
    Metrics(registry), ReloadMetrics(registry)
    return {f"{fam.name}_total" if fam.type == "counter" else fam.name for fam in registry.collect()}


def test_every_metric_is_in_the_operations_page() -> None:
    missing = sorted(n for n in exposed() if f"`{n[len(PREFIX):]}" not in OPERATIONS and f"`{n}" not in OPERATIONS)
    assert missing == []


def test_every_watch_restart_cause_is_named_in_the_operations_page() -> None:
    tree = ast.parse((ROOT / "app" / "cluster" / "informer.py").read_text())
    causes = {node.args[0].value for node in ast.walk(tree)
              if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Outcome"
              and node.args and isinstance(node.args[0], ast.Constant)}
    assert {"timeout", "expired", "closed_early", "internal"} <= causes  # the check reads the code it should
    watches = OPERATIONS[OPERATIONS.index("watch_restarts_total{kind,cause}"):]
    watches = watches[:watches.index("\n- **")]
    assert sorted(c for c in causes if f"`{c}`" not in watches) == []
    assert "`http_<code>`" in watches


def test_the_docs_count_the_watched_kinds_right() -> None:
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    watched = len(KINDS) + len(OPTIONAL_KINDS)
    for doc in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for n, word in words.items():
            for m in re.finditer(rf"(?:all|watches) {word} kinds", doc.read_text()):
                assert n == watched, f"{doc.name}: {m.group(0)!r}, but the guard watches {watched} kinds"
