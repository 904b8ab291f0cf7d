"""The broker's modules import each other without a cycle (module level or inside functions;
imports under ``if TYPE_CHECKING:`` aside), ``messaging`` imports nothing above it, and only
the ingest package touches the appender.

Read from the source with ``ast``: nothing is imported to find out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "services" / "broker"
PACKAGE = "tidemq_server.broker"
#: Packages of the broker that ``messaging`` must not import (it sits below them).
ABOVE_MESSAGING = ("transactions", "consumers", "routes", "grpc", "replication", "service")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The broker modules ``tree`` imports, outside ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:
                visit(stmt)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # ``from pkg import module`` names a module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(files)
    return {name: _imports(ast.parse(path.read_text()), modules) - {name}
            for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or None.
    A package's ``__init__`` importing its own modules is not a cycle by itself."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            if dep not in state and (found := walk(dep)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)) is not None:
            return found
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_between_broker_modules() -> None:
    graph = import_graph()
    assert len(graph) > 100  # every module was read
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_messaging_imports_nothing_above_it() -> None:
    upward = {(name, dep) for name, deps in import_graph().items()
              if name.startswith(f"{PACKAGE}.messaging.") for dep in deps
              if dep.removeprefix(f"{PACKAGE}.").split(".")[0] in ABOVE_MESSAGING}
    assert not upward


def test_only_ingest_calls_the_appender() -> None:
    callers = set()
    for path in ROOT.rglob("*.py"):
        name = _module_name(path)
        if name.startswith((f"{PACKAGE}.ingest.", f"{PACKAGE}.store.",
                            f"{PACKAGE}.replication.")):
            continue  # the appender's own modules, and the one write path
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in {"append", "append_batches",
                                                                  "settle"}
                    and isinstance(node.value, ast.Attribute)
                    and node.value.attr in {"appender", "writer", "gate"}):
                callers.add(f"{name}: {ast.unparse(node)}")
    assert not callers
