"""No import cycle between the project's modules, at import time or at run time.

Every import a module can execute counts, a function's own imports included (a
cycle hidden in a function is still a cycle, only a later one); imports under
`if TYPE_CHECKING:` do not, as they never run. Importing `a.b.c` runs `a/__init__`
and `a/b/__init__` first, so those count too. (tests/integration/test_imports.py
imports each module alone in a fresh interpreter.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("bridge", "meshbridge", "h2grpc", "linkerd_api", "xds_api", "harness")


def project_modules() -> dict[str, Path]:
    """Every module of the installed packages (pyproject's packages), by name."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """The names of the modules `node` may import when it runs (not TYPE_CHECKING)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield from (n for c in child.orelse for n in _imports(c, module, is_package))
            continue
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield alias.name
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - (child.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            for alias in child.names:  # `from pkg import module`
                yield f"{base}.{alias.name}"
        else:
            yield from _imports(child, module, is_package)


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for target in _imports(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            parts = target.split(".")
            # Importing a.b.c runs a and a.b first; a module's own packages have run
            # before it, unless it imports from one of them by name.
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                implicit = i < len(parts) and name.startswith(prefix + ".")
                if prefix in modules and prefix != name and not implicit:
                    edges.add(prefix)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking() -> None:
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    import bridge.model\n"
              "def f():\n    from bridge import authority\n")
    found = set(_imports(ast.parse(source), "bridge.x", False))
    assert "bridge.authority" in found and "bridge.model" not in found
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_project_module_imports_itself_back() -> None:
    graph = import_graph()
    assert len(graph) > 100  # every package was read
    assert cycles(graph) == []
