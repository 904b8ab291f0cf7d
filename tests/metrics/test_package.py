"""The --py-files zip holds every first-party module the job and its workers import."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from tidemq_server.metrics.package import build


def first_party_imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.split(".")[0] in ("tidemq_server", "tidemq")}


def test_zip_is_closed_under_first_party_imports(tmp_path: Path) -> None:
    target = build(tmp_path / "tidemq-metrics.zip")
    with zipfile.ZipFile(target) as zf:
        files = set(zf.namelist())
        sources = {name: zf.read(name).decode() for name in files if name.endswith(".py")}
    modules = {n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for n in sources}
    assert {"tidemq_server.metrics.job", "tidemq_server.metrics.source",
            "tidemq.protocol"} <= modules
    assert "tidemq_server.metrics.sidecar" not in modules  # the web side stays out
    for name, source in sources.items():
        for imported in first_party_imports(source):
            # "from pkg import name" may name a module or an attribute: one must be there
            parent = imported.rsplit(".", 1)[0]
            assert imported in modules or parent in modules, f"{name} imports {imported}"
