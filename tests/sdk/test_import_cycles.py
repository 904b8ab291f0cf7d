"""No import cycle among the modules of ``sdk/tidemq`` (issue 30).

Every ``import`` counts, at module level or inside a function, except those under
``if TYPE_CHECKING:``. ``from package import name`` is an edge to ``package.name`` when that is a
module, else to the package itself (its ``__init__``). A package's ``__init__`` is a module like
the others, so a private module that imports a name from ``tidemq`` (not from the module that
defines it) makes a cycle with the ``__init__`` that re-exports it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[2] / "sdk"
ROOT = "tidemq"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SDK).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SDK / ROOT).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import of a module, ``if TYPE_CHECKING:`` bodies left out."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the SDK that module ``name`` imports."""
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
            continue
        base = node.module or ""
        if node.level:
            package = _package_of(name, path)
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        if base.split(".")[0] != ROOT:
            continue
        for alias in node.names:
            child = f"{base}.{alias.name}"
            out.add(child if child in modules else base)
    out.discard(name)
    return {m for m in out if m in modules}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
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


def test_the_checker_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_checker_reads_function_level_imports_and_skips_type_checking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / ROOT
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_a.py").write_text("def f():\n    from tidemq import _b\n")
    (pkg / "_b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from tidemq._c import X\nfrom tidemq._a import f\n")
    (pkg / "_c.py").write_text("from ._b import g\n")
    monkeypatch.setitem(globals(), "SDK", tmp_path)
    graph = import_graph()
    assert graph == {"tidemq": set(), "tidemq._a": {"tidemq._b"}, "tidemq._b": {"tidemq._a"},
                     "tidemq._c": {"tidemq._b"}}
    assert cycles(graph) == [["tidemq._a", "tidemq._b"]]


def test_no_import_cycle_in_the_sdk() -> None:
    graph = import_graph()
    assert len(graph) > 40  # the SDK was found
    found = cycles(graph)
    assert not found, "import cycles among the SDK's modules:\n" + "\n".join(
        " <-> ".join(c) for c in found)
