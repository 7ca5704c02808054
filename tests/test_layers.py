"""The package's folders are layers: every import runs down, and no module imports itself back.

Reads every import statement (module level, inside functions and under
``TYPE_CHECKING``) with ``ast``, so a cycle hidden in a function-level import fails too.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "langchain_tiered_memory"
#: Bottom to top; a module may import from its own layer or any layer below.
LAYERS = ["core", "text", "storage", "tiers", "memory", "integrations", "cli"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports, wherever the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("langchain_tiered_memory"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("langchain_tiered_memory"))
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layer() -> None:
    outside = [m for m in _graph() if m != "langchain_tiered_memory" and _layer(m) is None]
    assert outside == []


@pytest.mark.parametrize("module", sorted(_graph()))
def test_imports_run_down(module: str) -> None:
    own = _layer(module)
    if own is None:  # the package's __init__: the public names, from every layer
        return
    upward = [m for m in _graph()[module] if (_layer(m) if _layer(m) is not None else -1) > own]
    assert upward == [], f"{module} imports from a layer above it"


def test_no_import_cycle() -> None:
    graph = dict(_graph())
    graph.pop("langchain_tiered_memory")  # re-exports only; nothing imports the top level
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            # A package's __init__ re-exporting its own modules is not a cycle of code.
            if state.get(nxt) == 1 and not node.startswith(f"{nxt}."):
                cycle = [*path[path.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
