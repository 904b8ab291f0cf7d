"""Counts for issue 21 (the broker's wiring), repeatable on any checkout.

    python scripts/wiring_counts.py [--list] [ROOT]

- rewirings: in ``services/broker``, statements that change a part from outside it: an
  assignment to an attribute of anything but ``self`` (``delays.on_first_delay = ...``,
  ``self.store.put = ...``), an assignment silenced with ``method-assign`` (a method replaced),
  and ``append``/``insert`` into another object's attribute (``self.queries.views.insert``).
  Data objects filled in by the code that made them (``req.result = ...``) count too: the
  number is compared before and after, the list (``--list``) says which is which.
- duplicate class names: a class name defined in two or more modules of ``services/`` and
  ``sdk/``.
- dead functions: functions and methods of ``services/`` and ``sdk/`` (not decorated, not
  dunder, not CamelCase gRPC methods) whose name occurs nowhere in ``services/``, ``sdk/``,
  ``bench/`` but their definition: "never called" when the tests do not name them either,
  "tests only" when they do.
- duplicates pairs: ``duplicates`` over a copy of ``services/`` and ``sdk/`` together.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

MUTATORS = {"append", "insert", "extend"}
# the broker's parts and their collaborators, as the code names the variables holding them: a
# write into one of these from outside is a rewiring; a write into a data object is not
PARTS = {"broker", "store", "writer", "log", "retention", "index", "dispatcher", "role",
         "hooks", "replication", "quorum", "gate", "visibility", "follower", "source", "delays",
         "delay_router", "schedule", "queries", "transactions", "tx", "tx_checking",
         "checker_requests", "registrar", "topics", "sender", "pulls", "hold", "offsets",
         "simple", "dedup", "elector", "door"}


def _is_part(node: ast.expr) -> bool:
    """``store``, ``self.store``, ``store.writer``: a chain of part names from ``self``."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    if node.id != "self":
        names.append(node.id)
    return bool(names) and all(n in PARTS for n in names)


def py_files(root: Path, *dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (root / d).rglob("*.py") if ".venv" not in p.parts)


def rewirings(root: Path, parts_only: bool = True) -> list[str]:
    """Writes into another object (``parts_only``: into one of the broker's ``PARTS``)."""
    hits: list[str] = []
    for path in py_files(root, "services/broker"):
        text = path.read_text()
        lines = text.splitlines()
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(text)):
            line = ""
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and not (
                            isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")) and (
                            not parts_only or _is_part(t.value)):
                        line = lines[node.lineno - 1]
                    elif isinstance(t, ast.Attribute) and "method-assign" in lines[node.lineno - 1]:
                        line = lines[node.lineno - 1]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Attribute)
                  and isinstance(node.func.value.value, ast.Attribute)
                  and not node.func.value.attr.startswith("_")
                  and (not parts_only or _is_part(node.func.value.value))):
                line = lines[node.lineno - 1]  # self.part.list.append(...)
            if line:
                hits.append(f"{rel}:{node.lineno}: {line.strip()}")
    return sorted(set(hits))


def duplicate_classes(root: Path) -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in py_files(root, "services", "sdk"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return {name: spots for name, spots in sorted(where.items()) if len(spots) > 1}


def dead_functions(root: Path) -> tuple[list[str], list[str]]:
    defs: list[tuple[str, str]] = []
    for path in py_files(root, "services", "sdk"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not node.decorator_list and not node.name.startswith("__")
                    and not node.name[0].isupper()):
                defs.append((node.name, f"{path.relative_to(root)}:{node.lineno}"))
    words: dict[str, int] = defaultdict(int)
    for path in py_files(root, "services", "sdk", "bench"):
        for w in re.findall(r"\b[A-Za-z_]\w*\b", path.read_text()):
            words[w] += 1
    test_words: set[str] = set()
    for path in py_files(root, "tests"):
        test_words.update(re.findall(r"\b[A-Za-z_]\w*\b", path.read_text()))
    defined: dict[str, int] = defaultdict(int)
    for name, _ in defs:
        defined[name] += 1
    never, tests_only = [], []
    for name, spot in defs:
        if words[name] > defined[name]:
            continue
        (tests_only if name in test_words else never).append(f"{spot}: {name}")
    return never, tests_only


def duplicate_pairs(root: Path) -> str:
    tool = shutil.which("duplicates")
    if tool is None:
        return "duplicates: not installed"
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("services", "sdk"):
            shutil.copytree(root / d, Path(tmp) / d,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        out = subprocess.run([tool, "--repo", tmp, "--seconds", "120"], capture_output=True,
                             text=True, check=False).stdout
    return out.splitlines()[0] if out else "duplicates: no output"


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--list"]
    show = "--list" in sys.argv
    root = Path(args[0] if args else ".").resolve()
    rw = rewirings(root)
    broad = rewirings(root, parts_only=False)
    classes = duplicate_classes(root)
    never, tests_only = dead_functions(root)
    print(f"rewirings (services/broker): {len(rw)} into parts; {len(broad)} attribute writes "
          "into other objects of any kind")
    if show:
        print("".join(f"  {h}\n" for h in rw), end="")
    print(f"duplicate class names (services/, sdk/): {len(classes)}")
    if show:
        print("".join(f"  {n}: {', '.join(s)}\n" for n, s in classes.items()), end="")
    print(f"dead functions: {len(never)} never called, {len(tests_only)} called by tests only")
    if show:
        print("".join(f"  never: {h}\n" for h in never), end="")
        print("".join(f"  tests only: {h}\n" for h in tests_only), end="")
    print(f"duplicates (services/ + sdk/): {duplicate_pairs(root)}")


if __name__ == "__main__":
    main()
