"""No import cycle between the modules of ``services/`` or ``sdk/``: the rules of what counts
as an import are in tests/support/imports.py, which reads the graph with ``ast``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.imports import ROOTS, Module, cycles, describe, find_modules, import_graph


def test_no_import_cycle_between_modules_of_services_or_sdk() -> None:
    modules = find_modules(ROOTS)
    assert "tidemq_server.broker.service" in modules and "tidemq.protocol" in modules
    graph = import_graph(modules)
    found = [describe(chain, graph, modules) for chain in cycles(graph)]
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(found)


# -- the reader itself, on small packages written for the purpose ---------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    for relative, text in files.items():
        path = tmp_path / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return find_modules({tmp_path / "pkg": "pkg"})


@pytest.mark.parametrize("a_text, b_text", [
    ("import pkg.b\n", "import pkg.a\n"),
    ("from pkg import b\n", "from pkg.a import thing\n"),
    ("from . import b\n", "from .a import thing\n"),
    ("def f():\n    from pkg.b import x\n", "from pkg import a\n"),
    ("import importlib\nimportlib.import_module('pkg.b')\n", "import pkg.a\n"),
])
def test_a_cycle_is_found_whichever_form_its_imports_take(
        tmp_path: Path, a_text: str, b_text: str) -> None:
    modules = _package(tmp_path, {"__init__.py": "", "a.py": a_text, "b.py": b_text})
    graph = import_graph(modules)
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert describe(["pkg.a", "pkg.b", "pkg.a"], graph, modules, tmp_path).startswith(
        "pkg.a (pkg/a.py:")


def test_type_checking_imports_and_package_reexports_are_not_cycles(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "from pkg.a import thing\n",  # the package re-exports; a imports no package
        "a.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.b import B\nthing = 1\n",
        "b.py": "from pkg.a import thing\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ..a import thing\nfrom .. import b\n",
    })
    graph = import_graph(modules)
    assert graph["pkg.a"] == {}
    assert graph["pkg.sub.c"] == {"pkg.a": 1, "pkg.b": 2}
    assert cycles(graph) == []


def test_a_tangle_names_every_import_inside_it(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "from pkg import c\nfrom pkg import a\n",
        "c.py": "from pkg import a\n",
    })
    assert cycles(import_graph(modules)) == [["pkg.a", "pkg.b", "pkg.a"],
                                             ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
