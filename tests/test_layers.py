"""The layout, checked by reading the source: the layers (every import, lazy and type-checking ones too, goes to
its own layer or one below), no import circle between modules nor between packages (folders), one ContextVar in
the runtime, small signatures and modules, and a plugin split by role whose entry loads only itself.
docs/architecture.md draws the same layers."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layers, bottom first: a module may import its own layer and the ones below. Each layer is folders.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("state", ("tenxgraph.utils", "tenxgraph.state")),
    ("storage", ("tenxgraph.storage",)),
    ("tools", ("tenxgraph.core.tools", "tenxgraph.core.crashpoints")),
    ("the ledger", ("tenxgraph.core.graph.utils",)),
    ("the ledger's public entry", ("tenxgraph.ledger",)),
    ("the graph", ("tenxgraph.core.graph",)),
    ("prebuilt, models, server", ("tenxgraph.prebuilt", "tenxgraph.models", "tenxgraph.server")),
    ("integrations", ("tenxgraph.integrations",)),
    ("the package's front door", ("tenxgraph", "tenxgraph.core")),
    ("the plugin: matrix", ("pytest_replaysafe.matrix",)),
    ("the plugin: judge", ("pytest_replaysafe.judge",)),
    ("the plugin: report", ("pytest_replaysafe.report",)),
    ("the plugin: run", ("pytest_replaysafe.run",)),
    ("the plugin: conformance", ("pytest_replaysafe.conformance",)),
    ("the plugin's entry", ("pytest_replaysafe",)),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def layer(module: str) -> int:
    """The most specific prefix decides (``tenxgraph.core.graph.utils`` before ``tenxgraph.core.graph``)."""
    best, found = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found >= 0, f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return found


def imports(module: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(TREES[module]):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def package(module: str) -> str:
    """The folder a module is in (a package's ``__init__`` is in its own folder)."""
    return ".".join(MODULES[module].parent.relative_to(SRC).parts)


#: ``tenxgraph.core`` is a folder of three layers (tools below the ledger, the ledger, the graph above its public
#: entry), so its top packages are those folders.
CORE_LAYERS = ("tenxgraph.core.tools", "tenxgraph.core.graph.utils", "tenxgraph.core.graph")


def top_package(module: str) -> str:
    """The package's first two levels: ``tenxgraph.storage``, ``pytest_replaysafe.run``; in ``tenxgraph.core``, the
    layer's folder (:data:`CORE_LAYERS`)."""
    folder = package(module)
    for layer_folder in CORE_LAYERS:
        if folder == layer_folder or folder.startswith(layer_folder + "."):
            return layer_folder
    return ".".join(folder.split(".")[:2])


def collapsed(group: Callable[[str], str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, deps in GRAPH.items():
        graph.setdefault(group(module), set()).update(group(d) for d in deps if group(d) != group(module))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_there_are_no_import_circles_between_modules() -> None:
    assert cycles(GRAPH) == []


def test_there_are_no_import_circles_between_packages() -> None:
    """Folders are layers: neither the folders (``tenxgraph.core.graph`` and ``tenxgraph.core.graph.utils``
    apart) nor the top packages (``tenxgraph.core``, ``tenxgraph.storage``, ``pytest_replaysafe.run``) import
    each other in a circle."""
    assert cycles(collapsed(package)) == []
    assert cycles(collapsed(top_package)) == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{m} ({LAYERS[layer(m)][0]}) imports {dep} ({LAYERS[layer(dep)][0]})"
        for m, deps in sorted(GRAPH.items())
        for dep in sorted(deps)
        if layer(dep) > layer(m)
    ]
    assert upward == []


def test_the_checks_see_imports_and_circles_at_all() -> None:
    """Guards the tests above against passing vacuously (a parser that found nothing, a search that finds none)."""
    assert "tenxgraph.storage.checkpointer.base" in GRAPH["tenxgraph.core.graph.compiled"]
    assert "tenxgraph.ledger" in GRAPH["tenxgraph.core.graph.tool_node"]
    assert "tenxgraph.core.graph.utils.invoke_node_handler" in GRAPH["tenxgraph.ledger"]
    assert "pytest_replaysafe.run.harness" in GRAPH["pytest_replaysafe.fixtures"]  # a function-level import counts
    assert len(MODULES) > 60
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert collapsed(top_package)["tenxgraph.core.graph"] >= {"tenxgraph.storage", "tenxgraph.state"}
    assert collapsed(top_package)["tenxgraph.core.graph"] >= {"tenxgraph.ledger"}
    assert collapsed(top_package)["tenxgraph.ledger"] >= {"tenxgraph.core.graph.utils", "tenxgraph.core.tools"}


#: What a caller of the ledger may not import: its implementation, the crash points, a storage class's module.
PRIVATE = ("tenxgraph.core.graph.utils", "tenxgraph.core.crashpoints", "tenxgraph.storage.")
#: The ledger's callers: our tool node and every integration.
LEDGER_CALLERS = ("tenxgraph.core.graph.tool_node", "tenxgraph.integrations")


def test_the_ledgers_callers_go_through_its_public_entry() -> None:
    """Our tool node and the integrations (LangGraph, MCP) reach the ledger through ``tenxgraph.ledger`` only:
    nothing of its implementation, no crash point (the probe instead), no storage module (``LedgerStore``)."""
    callers = [m for m in MODULES if m.startswith(LEDGER_CALLERS)]
    assert len(callers) >= 8 and all("tenxgraph.ledger" in GRAPH[m] for m in LEDGER_CALLERS[:1])
    private = sorted(f"{m} imports {d}" for m in callers for d in GRAPH[m] if d.startswith(PRIVATE))
    assert private == []
    assert any(d.startswith(PRIVATE) for d in GRAPH["tenxgraph.core.graph.compiled"])  # (the check sees some)


def test_the_ledgers_entry_names_what_it_exports() -> None:
    import tenxgraph.ledger as entry

    assert sorted(entry.__all__) == sorted(n for n in vars(entry) if not n.startswith("_") and n != "annotations")
    named = [getattr(entry, name) for name in entry.__all__]
    assert all(x.__doc__ for x in named if inspect.isfunction(x) or inspect.isclass(x))  # (Reconcile: an alias)


def test_the_runtime_has_one_context_variable() -> None:
    """The run's scope (``core/tools/context.py``); everything else is passed as arguments."""
    found = [
        name
        for name, tree in TREES.items()
        if name.startswith("tenxgraph")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "ContextVar"
    ]
    assert found == ["tenxgraph.core.tools.context"]


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


FUNCTIONS = [
    (name, node)
    for name, tree in TREES.items()
    for node in ast.walk(tree)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
]


def test_no_function_takes_more_than_eight_parameters() -> None:
    wide = [f"{m}.{f.name}: {len(parameters(f))}" for m, f in FUNCTIONS if len(parameters(f)) > 8]
    assert wide == [], "group what travels together into one object"


def test_the_test_authors_crash_run_is_small() -> None:
    (init,) = [f for m, f in FUNCTIONS if m == "pytest_replaysafe.run.harness" and f.name == "__init__"]
    assert len(parameters(init)) <= 6


#: The layout guide is ~350 lines a module; past LONG, the module's docstring must say why (the phrase
#: "~350-line"), and no module passes MAX.
LONG, MAX = 380, 450


def test_no_module_is_over_the_limit_and_a_long_one_says_why() -> None:
    over, unexplained = [], []
    for name, path in sorted(MODULES.items()):
        lines = len(path.read_text().splitlines())
        if lines > MAX:
            over.append(f"{name}: {lines} lines")
        if lines > LONG and "~350-line" not in (ast.get_docstring(TREES[name]) or ""):
            unexplained.append(f"{name}: {lines} lines")
    assert over == [], f"split these modules (at most {MAX} lines)"
    assert unexplained == [], "split these modules, or state at their top why they are longer than ~350 lines"


#: The plugin's entry: what pytest loads for every run; each role is a subpackage.
ENTRY = {"__init__", "__main__", "plugin", "options", "fixtures", "hookspecs", "reporter"}
ROLES = {"matrix", "run", "judge", "report", "conformance"}


def test_the_plugin_is_split_by_role() -> None:
    plugin = SRC / "pytest_replaysafe"
    assert {p.stem for p in plugin.glob("*.py")} == ENTRY
    assert {p.name for p in plugin.iterdir() if (p / "__init__.py").exists()} == ROLES


def test_a_plain_pytest_run_loads_only_the_plugins_entry() -> None:
    """Without ``--crash-matrix``, loading the plugin and registering its options imports no role subpackage but
    the matrix's names (cells, services) the options check."""
    code = (
        "import sys, pytest_replaysafe.plugin\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('pytest_replaysafe.'))))"
    )
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert loaded, "the probe saw nothing"
    heavy = sorted(m for m in loaded if m.split(".")[1] in ROLES - {"matrix"} or m.endswith(("schedules", "orders")))
    assert heavy == []
