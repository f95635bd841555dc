"""The package's layers import only downward (docs/design.md draws them).

Every `import` of the package's source is read, those inside functions too, so a deferred
import cannot hide an uphill arrow.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "pipecast"

FOUNDATION = {"errors", "jsonio", "extras"}
"""Modules every layer may use: the error types, the JSON form, optional imports."""

MAY_IMPORT = {
    "values": set(),
    "planning": {"values"},
    "runtime": {"values"},
    "measuring": {"values", "planning", "runtime"},
    "orchestration": {"values", "planning", "runtime", "measuring"},
    "report": {"values", "planning", "runtime", "measuring", "orchestration"},
    "cli": {"values", "planning", "runtime", "measuring", "orchestration", "report", "api"},
    "api": {"values", "planning", "runtime", "measuring", "orchestration"},
}
"""Each layer and the layers below it that it may import. The runtime knows no planning:
it executes a plan it is given, and decides no schedule."""

PURE = ("values", "planning")
"""Layers that hold no process group: they plan on a laptop, in milliseconds."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = _modules()


def _edges() -> list[tuple[str, str]]:
    """(importer, imported) between the package's modules."""
    edges = []
    for module, path in MODULES.items():
        for name in _imports(path):
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module and name != "pipecast":
                edges.append((module, name))
    return edges


EDGES = _edges()


def test_the_layers_cover_the_package() -> None:
    """Every top-level module and folder is a layer or foundation, so none escapes the rule."""
    top = {_layer(m) for m in MODULES} - {""}
    assert top - FOUNDATION - set(MAY_IMPORT) == {"__main__"}


def test_every_import_runs_downhill() -> None:
    uphill = [
        f"{a} -> {b}"
        for a, b in EDGES
        if _layer(a) in MAY_IMPORT
        and _layer(b) != _layer(a)
        and _layer(b) not in FOUNDATION
        and _layer(b) not in MAY_IMPORT[_layer(a)]
    ]
    assert uphill == []


def test_foundation_imports_nothing_above_it() -> None:
    assert [
        f"{a} -> {b}" for a, b in EDGES if _layer(a) in FOUNDATION and _layer(b) not in FOUNDATION
    ] == []


def test_no_cycle_between_packages() -> None:
    """Inside a layer the packages (values.profile, values.hardware, ...) form no cycle."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in EDGES:
        pa, pb = ".".join(a.split(".")[:3]), ".".join(b.split(".")[:3])
        if pa != pb:
            graph[pa].add(pb)
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"packages import each other: {' -> '.join(exc.args[1])}")


@pytest.mark.parametrize("layer", PURE)
def test_planning_layers_hold_no_process_group(layer: str) -> None:
    reach = [
        f"{m} imports {name}"
        for m, path in MODULES.items()
        if _layer(m) == layer
        for name in _imports(path)
        if name.startswith("torch.distributed")
    ]
    assert reach == []
