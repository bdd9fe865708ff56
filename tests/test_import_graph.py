"""No import circle in ``agentik/``: each module imports only modules below it, so the core can
be read (and split) bottom up. Imports inside functions count; ``TYPE_CHECKING`` ones do not
(they never run). A failure names every import of the circle, with its line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentik"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_only(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``."""
    return {
        id(node)
        for test in ast.walk(tree)
        if isinstance(test, ast.If) and "TYPE_CHECKING" in ast.dump(test.test)
        for stmt in test.body
        for node in ast.walk(stmt)
    }


def import_graph() -> dict[str, dict[str, str]]:
    """module -> {module it imports: "file:line" of the first such import}."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, dict[str, str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = type_only(tree)
        edges: dict[str, str] = {}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # "from agentik.core import store" imports the module agentik.core.store
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(f"{target}."):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    edges.setdefault(target, where)
                    break
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
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


def test_no_import_circle_in_agentik():
    graph = import_graph()
    problems = []
    for component in circles(graph):
        problems.append(" <-> ".join(component))
        for module in component:
            for target, where in sorted(graph[module].items()):
                if target in component:
                    problems.append(f"    {where}: {module} imports {target}")
    assert not problems, "import circle(s) in agentik/:\n" + "\n".join(problems)


def test_the_check_finds_a_circle_and_names_its_imports():
    graph = {
        "a": {"b": "a.py:3"},
        "b": {"c": "b.py:7"},
        "c": {"a": "c.py:1 (inside a function)"},
        "d": {"a": "d.py:2"},
    }
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b": "x"}, "b": {}}) == []


def test_the_graph_sees_imports_inside_functions_but_not_type_only_ones():
    graph = import_graph()
    # agentik.core.cli imports the app inside its functions (for a fast --help)
    assert "agentik.core.app" in graph["agentik.core.cli"]
    # the hook specifications name the agent only for type checkers
    assert "agentik.core.agent" not in graph["agentik.hookspecs"]
