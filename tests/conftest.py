"""The real-Prometheus tests (marker ``prometheus``) need Debian's ``prometheus`` package.

Where its binaries are missing they are not run, and the run says so in one line
at the end (never a silent skip). ``REQUIRE_PROMETHEUS=1`` (set by ``.ci/run``,
which installs the package) turns that into a failure instead.
"""

from __future__ import annotations

import os

import pytest

from tests.prometheus_support import missing

_not_run: list[int] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = missing()
    if not why:
        return
    marked = [item for item in items if item.get_closest_marker("prometheus")]
    if not marked:
        return
    if os.environ.get("REQUIRE_PROMETHEUS") == "1":
        raise pytest.UsageError(f"REQUIRE_PROMETHEUS=1 but {why}: apt-get install prometheus")
    items[:] = [item for item in items if not item.get_closest_marker("prometheus")]
    config.hook.pytest_deselected(items=marked)
    _not_run.append(len(marked))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _not_run:
        terminalreporter.write_line(
            f"NOT RUN: {_not_run[0]} real-Prometheus tests (steering), because {missing()}; "
            "install Debian's prometheus package (apt-get install prometheus) or run .ci/run", yellow=True, bold=True)
