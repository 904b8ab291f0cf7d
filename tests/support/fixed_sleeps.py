"""Count the fixed sleeps of the tests: ``python -m tests.support.fixed_sleeps [--all] [MIN_S]``.

A fixed sleep is a call ``time.sleep(x)`` or ``asyncio.sleep(x)`` in a file under tests/
(tests/support included) whose ``x`` is known without running the test: a literal, a named
constant (of the same file, or imported from a module of the repository, by name or as
``module.NAME``), or arithmetic, ``min``/``max`` and ``int``/``float`` over those;
``rng.uniform(a, b)`` counts as its lower bound ``min(a, b)``. Sleeps whose length is only known
at run time (``time.sleep(pause)``, ``max(0.0, due - now_ms())``) are listed apart as "not
fixed" with ``--all``: they are waits computed from a clock, not counted, but worth a look.

It prints each fixed sleep of ``MIN_S`` seconds (default 0.5) or longer as ``path:line  seconds
source`` and then their count. ``tests/test_fixed_sleeps.py`` keeps the count within its budget.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# import name prefix -> folder, to read the constants a test imports
PACKAGES = {"tests": REPO / "tests", "tidemq_server": REPO / "services",
            "tidemq": REPO / "sdk" / "tidemq"}
MIN_S = 0.5  # the bar: fixed sleeps this long or longer are counted (s)


@dataclasses.dataclass(frozen=True)
class Sleep:
    path: Path
    line: int
    seconds: float | None  # None: known only at run time
    source: str

    def __str__(self) -> str:
        length = "?" if self.seconds is None else f"{self.seconds:g}"
        return f"{self.path.relative_to(REPO)}:{self.line}  {length}  {self.source}"


class Unknown(Exception):
    """The expression's value is not known without running the code."""


def _module_path(name: str) -> Path | None:
    top, _, rest = name.partition(".")
    folder = PACKAGES.get(top)
    if folder is None:
        return None
    base = folder.joinpath(*rest.split(".")) if rest else folder
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@dataclasses.dataclass
class Scope:
    """What the names of one module mean: constants, and aliases of imported modules."""

    path: Path
    assigned: dict[str, ast.expr]
    imported: dict[str, tuple[str, str]]  # local name -> (module, name in it)
    modules: dict[str, str]  # local name -> module


@cache
def _scope(path: Path) -> Scope:
    tree = ast.parse(path.read_text(), filename=str(path))
    scope = Scope(path, {}, {}, {})
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            scope.assigned[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(
                node.target, ast.Name):
            scope.assigned[node.target.id] = node.value
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                local = alias.asname or alias.name
                if _module_path(f"{node.module}.{alias.name}") is not None:
                    scope.modules[local] = f"{node.module}.{alias.name}"
                else:
                    scope.imported[local] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    scope.modules[alias.asname] = alias.name
    return scope


def _name_value(scope: Scope, name: str, depth: int) -> float:
    if depth > 20:
        raise Unknown(name)
    if name in scope.assigned:
        return _value(scope.assigned[name], scope, depth + 1)
    if name in scope.imported:
        module, attribute = scope.imported[name]
        path = _module_path(module)
        if path is not None:
            return _name_value(_scope(path), attribute, depth + 1)
    raise Unknown(name)


def _value(node: ast.expr, scope: Scope, depth: int = 0) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(
            node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return _name_value(scope, node.id, depth)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        module = scope.modules.get(node.value.id)
        path = _module_path(module) if module else None
        if path is not None:
            return _name_value(_scope(path), node.attr, depth + 1)
        raise Unknown(ast.unparse(node))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, scope, depth)
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, scope, depth), _value(node.right, scope, depth)
        ops = {ast.Add: lambda: left + right, ast.Sub: lambda: left - right,
               ast.Mult: lambda: left * right, ast.Div: lambda: left / right,
               ast.FloorDiv: lambda: left // right}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    if isinstance(node, ast.Call) and not node.keywords:
        args = [_value(arg, scope, depth) for arg in node.args]
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("min", "max", "int", "float") and args:
            return {"min": min, "max": max}.get(func.id, lambda *a: float(a[0]))(*args)
        if isinstance(func, ast.Attribute) and func.attr == "uniform" and len(args) == 2:
            return min(args)
    raise Unknown(ast.unparse(node))


def _is_sleep(node: ast.Call) -> bool:
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "sleep"
            and isinstance(func.value, ast.Name) and func.value.id in ("time", "asyncio")
            and len(node.args) == 1)


def sleeps(root: Path = TESTS) -> list[Sleep]:
    """Every ``time.sleep``/``asyncio.sleep`` call under ``root``, with its length when fixed."""
    found: list[Sleep] = []
    for path in sorted(root.rglob("*.py")):
        scope = _scope(path)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and _is_sleep(node):
                try:
                    seconds: float | None = _value(node.args[0], scope)
                except Unknown:
                    seconds = None
                found.append(Sleep(path, node.lineno, seconds, ast.unparse(node)))
    return sorted(found, key=lambda s: (str(s.path), s.line))


def long_fixed_sleeps(min_s: float = MIN_S, root: Path = TESTS) -> list[Sleep]:
    return [s for s in sleeps(root) if s.seconds is not None and s.seconds >= min_s]


def main(argv: list[str]) -> int:
    show_all = "--all" in argv
    numbers = [float(a) for a in argv if a != "--all"]
    min_s = numbers[0] if numbers else MIN_S
    found = sleeps()
    long = [s for s in found if s.seconds is not None and s.seconds >= min_s]
    for sleep in long:
        print(sleep)
    print(f"{len(long)} fixed sleeps of {min_s:g} s or longer "
          f"({len(found)} sleep calls in {len({s.path for s in found})} files)")
    if show_all:
        print("\nnot fixed (length known at run time):")
        for sleep in found:
            if sleep.seconds is None:
                print(sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
