"""No import cycle between the modules of ``services/`` (``tidemq_server.*``) or ``sdk/``
(``tidemq.*``).

The graph is read from the source with ``ast``, without importing anything. A module imports
another when one of its statements names it:

- ``import a.b.c`` names ``a.b.c``; ``from a.b import c`` names ``a.b.c`` when that is a module
  of ours, else ``a.b`` (``c`` is then a name defined in ``a/b/__init__.py``); relative forms
  (``from . import x``, ``from ..y import z``) are resolved against the importing module's
  package; ``importlib.import_module("a.b")`` with a literal name counts as well;
- imports at module level and imports inside functions or methods both count: a cycle closed
  only when a function runs is still a cycle (the two modules cannot be understood, or split,
  one without the other);
- imports under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) do not: they never run.

An import names the module it asks for, not the packages above it (``import a.b.c`` is an edge
to ``a.b.c``, not also to ``a`` and ``a.b``), so a package whose ``__init__`` re-exports its
submodules does not form a cycle with each of them. Modules outside our two packages are ignored.

Each cycle is reported as a chain of modules with the file and line of every import on it, e.g.
``tidemq_server.x.a (services/x/a.py:12) -> tidemq_server.x.b (services/x/b.py:30) ->
tidemq_server.x.a``; a tangle of several modules is reported as one shortest cycle per import
inside it, so every import to remove is named.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# folder -> the import name of the package it holds
ROOTS = {REPO / "services": "tidemq_server", REPO / "sdk" / "tidemq": "tidemq"}


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package a relative import of this module starts from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def find_modules(roots: dict[Path, str]) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for folder, top in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join((top, *parts))
            modules[name] = Module(name, path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _resolve_relative(module: Module, level: int, name: str | None) -> str:
    base = module.package.split(".")
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def imports_of(module: Module, modules: dict[str, Module]) -> list[Edge]:
    """The edges from ``module`` to the modules of ours it imports at run time."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    edges: list[Edge] = []

    def add(target: str, line: int) -> None:
        # the most specific module of ours that the name is, or lies in
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module.name:
            edges.append(Edge(module.name, target, line))

    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(module, node.level, node.module) if node.level
                    else node.module or "")
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in modules else base, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno)
    return edges


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import of it}."""
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for module in modules.values():
        for edge in imports_of(module, modules):
            lines = graph[edge.source]
            lines[edge.target] = min(lines.get(edge.target, edge.line), edge.line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components with more than one module, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, sorted(graph[root])))
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _shortest_path(graph: dict[str, dict[str, int]], inside: set[str], start: str,
                   goal: str) -> list[str]:
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for nxt in sorted(graph[node]):
            if nxt in inside and nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    path: list[str] = []
    step: str | None = goal
    while step is not None:
        path.append(step)
        step = came_from[step]
    return path[::-1]


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """For every import inside a component, the shortest cycle through it (each cycle once,
    written from its smallest module, closed by repeating it)."""
    found: dict[tuple[str, ...], list[str]] = {}
    for component in strongly_connected(graph):
        inside = set(component)
        for source in component:
            for target in sorted(graph[source]):
                if target not in inside:
                    continue
                loop = [source, *_shortest_path(graph, inside, target, source)[:-1]]
                first = loop.index(min(loop))
                loop = loop[first:] + loop[:first]
                found.setdefault(tuple(loop), [*loop, loop[0]])
    return [found[key] for key in sorted(found)]


def describe(chain: list[str], graph: dict[str, dict[str, int]],
             modules: dict[str, Module], base: Path = REPO) -> str:
    steps = []
    for here, there in itertools.pairwise(chain):
        where = modules[here].path.relative_to(base)
        steps.append(f"{here} ({where}:{graph[here][there]})")
    return " -> ".join([*steps, chain[-1]])
