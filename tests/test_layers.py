"""The import graph points one way (docs/design.md, "Layout"): every module of ``app`` is in a layer here, and
each layer names the layers it may import.

domain is a leaf; policy reads only domain; cluster, metricsource and effects read policy and domain; the
admission handler hands decisions to effects and reads the steering snapshot; the transport (HTTP server, TLS)
is generic and imports nothing of the product; startup loads state for every command; serve wires the guard;
nothing but ``app.__main__`` imports the command line. Leaf utilities (timestamps, backoff, rate limits, metrics, logging)
import nothing from the application and may be used by any layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"
LEAF_UTILITIES = {"app.timefmt", "app.backoff", "app.metrics", "app.logs", "app.ratelimit"}

# layer -> the application modules (prefixes) it may import besides itself and the leaf utilities
ALLOWED = {
    "app.domain": set(),
    "app.policy": {"app.domain"},
    "app.cluster": {"app.domain", "app.policy"},
    "app.metricsource": {"app.domain"},
    "app.effects": {"app.domain", "app.policy"},
    "app.transport": set(),  # the HTTP server, TLS and the metrics port: generic, below the admission handler
    "app.admission": {"app.domain", "app.policy", "app.effects", "app.metricsource"},
    "app.config": {"app.policy"},
    "app.startup": {"app.cluster", "app.config", "app.domain", "app.metricsource", "app.policy"},
    "app.inspect": {"app.cluster", "app.domain", "app.policy", "app.startup"},
    "app.sim": {"app.cluster", "app.config", "app.domain", "app.effects", "app.policy"},
    "app.serve": {"app.admission", "app.cluster", "app.config", "app.domain", "app.effects", "app.metricsource",
                  "app.policy", "app.startup", "app.transport"},
    "app.cli": {"app.admission", "app.cluster", "app.config", "app.domain", "app.effects", "app.inspect",
                "app.metricsource", "app.policy", "app.serve", "app.sim", "app.startup", "app.transport"},
    "app.__main__": {"app.cli"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def app_imports(path: Path, modules: set[str]) -> set[str]:
    """Application modules a file imports (``from M import n`` counts as M, or M.n when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("app"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("app."))
    return found - {"app"}  # the package itself: __version__


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


FILES = {module_name(p): p for p in APP.rglob("*.py")}
MODULES = {mod: app_imports(path, set(FILES)) for mod, path in FILES.items()}


def violations(package: str, graph: dict[str, set[str]]) -> set[str]:
    allowed = ALLOWED[package] | LEAF_UTILITIES | {package}
    return {
        f"{mod} -> {imp}"
        for mod, imps in graph.items() if _within(mod, package)
        for imp in imps if not any(_within(imp, a) for a in allowed)
    }


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_points_only_at_lower_layers(package: str) -> None:
    assert not violations(package, MODULES)


def test_every_module_is_in_a_layer() -> None:
    layers = set(ALLOWED) | LEAF_UTILITIES | {"app"}
    assert sorted(m for m in MODULES if not any(_within(m, layer) for layer in layers)) == []


def test_the_check_sees_a_wrong_arrow() -> None:
    graph = dict(MODULES, **{"app.policy.decide": MODULES["app.policy.decide"] | {"app.cluster.store"}})
    assert violations("app.policy", graph) == {"app.policy.decide -> app.cluster.store"}


def test_leaf_utilities_import_nothing_from_the_application() -> None:
    for util in LEAF_UTILITIES:
        assert not MODULES[util], (util, MODULES[util])


def test_only_main_imports_the_command_line() -> None:
    users = {mod for mod, imps in MODULES.items() if any(_within(i, "app.cli") for i in imps)}
    assert users == {"app.__main__"}


def cycles(graph: dict[str, set[str]], within: str) -> list[list[str]]:
    """Import circles among the modules under ``within`` (lazy imports inside functions count too)."""
    nodes = {m for m in graph if _within(m, within)}
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for imp in sorted(graph[mod] & nodes):
            if state.get(imp) == 1:
                found.append(path[path.index(imp):] + [imp])
            elif imp not in state:
                visit(imp, path + [imp])
        state[mod] = 2

    for mod in sorted(nodes):
        if mod not in state:
            visit(mod, [mod])
    return found


def test_the_application_has_no_import_circle() -> None:
    assert not cycles(MODULES, "app")


def test_the_circle_check_sees_a_circle() -> None:
    graph = dict(MODULES, **{"app.sim.report": MODULES["app.sim.report"] | {"app.sim.guards"}})
    assert ["app.sim.guards", "app.sim.options", "app.sim.report", "app.sim.guards"] in cycles(graph, "app.sim")
