"""The broker's layers: ``messaging`` imports nothing above it, and only the ingest package
touches the appender. (No import cycle anywhere: tests/test_import_cycles.py.)

Read from the source with ``ast``: nothing is imported to find out.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.imports import ROOTS, find_modules, import_graph

ROOT = Path(__file__).resolve().parents[2] / "services" / "broker"
PACKAGE = "tidemq_server.broker"
#: Packages of the broker that ``messaging`` must not import (it sits below them).
ABOVE_MESSAGING = ("transactions", "consumers", "routes", "grpc", "replication", "service")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def broker_graph() -> dict[str, set[str]]:
    """Each broker module and the broker modules it imports (tests/support/imports.py)."""
    graph = import_graph(find_modules(ROOTS))
    return {name: {dep for dep in deps if dep.startswith(f"{PACKAGE}.")}
            for name, deps in graph.items() if name.startswith(f"{PACKAGE}.")}


def test_messaging_imports_nothing_above_it() -> None:
    upward = {(name, dep) for name, deps in broker_graph().items()
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
