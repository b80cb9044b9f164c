"""The package's layers, checked by reading the imports of every module (lazy and type-checking ones too):
no import circles, and no module imports a layer above its own. docs/architecture.md draws the same layers."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layers, bottom first: a module may import its own layer and the ones below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("state", ("tenxgraph.errors", "tenxgraph.utils", "tenxgraph.state")),
    ("storage and faults", ("tenxgraph.storage", "tenxgraph.core.crashpoints")),
    ("tools and the graph", ("tenxgraph.core.graph",)),
    (
        "prebuilt, models, server",
        ("tenxgraph.prebuilt", "tenxgraph.models", "tenxgraph.server", "tenxgraph.server.cli"),
    ),
    ("the package's front door", ("tenxgraph", "tenxgraph.core")),
    ("the pytest plugin", ("pytest_replaysafe",)),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def layer(module: str) -> int:
    """The most specific prefix decides (``tenxgraph.core.graph`` before ``tenxgraph.core``)."""
    best, found = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found >= 0, f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return found


def imports(module: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_there_are_no_import_circles() -> None:
    assert cycles() == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{m} ({LAYERS[layer(m)][0]}) imports {dep} ({LAYERS[layer(dep)][0]})"
        for m, deps in sorted(GRAPH.items())
        for dep in sorted(deps)
        if layer(dep) > layer(m)
    ]
    assert upward == []


def test_the_check_sees_imports_at_all() -> None:
    """Guards the two tests above against passing vacuously (a parser that found nothing)."""
    assert "tenxgraph.storage.checkpointer.base" in GRAPH["tenxgraph.core.graph.compiled"]
    assert (
        "tenxgraph.core.graph.utils.instrument" in GRAPH["tenxgraph.core.tools.tool"]
    )  # a function-level import counts
    assert len(MODULES) > 40


#: The layout guide is ~350 lines a module; past this, the module's docstring must say why (the phrase "~350-line").
LONG = 380


def test_a_long_module_says_why_it_is_long() -> None:
    unexplained = []
    for name, path in sorted(MODULES.items()):
        lines = len(path.read_text().splitlines())
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > LONG and "~350-line" not in docstring:
            unexplained.append(f"{name}: {lines} lines")
    assert unexplained == [], "split these modules, or state at their top why they are longer than ~350 lines"
