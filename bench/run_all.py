"""Run every benchmark in ``bench/``: ``python -m bench.run_all [--quick] [--json]``.

A benchmark is any ``bench/<name>.py`` (other than this file and ``_``-prefixed helpers) that
defines a top-level ``main(argv)``; each runs in its own process as ``python -m bench.<name>``
with the flags passed through, its output is printed as it comes, and the exit status is
non-zero when any of them fails. With ``--json`` the last line of stdout is one JSON object
``{"benchmarks": {name: <that benchmark's JSON line>}, "failed": [...]}``.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = {"run_all", "__init__"}


def discover() -> list[str]:
    """Module names under bench/ with a top-level ``main`` taking at least one argument."""
    names = []
    for path in sorted(HERE.glob("*.py")):
        name = path.stem
        if name in SKIP or name.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except SyntaxError as exc:
            print(f"run_all: cannot parse {path.name}: {exc}", file=sys.stderr)
            names.append(name)  # let it run and fail visibly
            continue
        for node in tree.body:
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main"
                    and (node.args.args or node.args.posonlyargs or node.args.vararg)):
                names.append(name)
                break
    return names


def run_one(name: str, flags: list[str], want_json: bool) -> tuple[int, dict | None]:
    cmd = [sys.executable, "-m", f"bench.{name}", *flags]
    print(f"\n=== bench.{name} {' '.join(flags)}".rstrip(), flush=True)
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=HERE.parent, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    last = ""
    for line in proc.stdout:  # stderr (progress bars) goes straight through
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.strip():
            last = line
    rc = proc.wait()
    print(f"=== bench.{name}: exit {rc} after {time.perf_counter() - began:.1f} s", flush=True)
    result = None
    if want_json and rc == 0:
        try:
            result = json.loads(last)
        except ValueError:
            print(f"run_all: bench.{name} printed no JSON object on its last line",
                  file=sys.stderr)
            rc = rc or 1
    return rc, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="passed through: small sizes")
    ap.add_argument("--json", action="store_true", help="passed through; summary JSON last")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only this benchmark (repeatable)")
    args = ap.parse_args(argv)
    flags = [f for f, on in (("--quick", args.quick), ("--json", args.json)) if on]
    names = discover()
    if args.only:
        unknown = set(args.only) - set(names)
        if unknown:
            print(f"run_all: no such benchmark: {', '.join(sorted(unknown))} "
                  f"(have: {', '.join(names)})", file=sys.stderr)
            return 2
        names = [n for n in names if n in args.only]
    if not names:
        print("run_all: no benchmarks found", file=sys.stderr)
        return 1
    failed: list[str] = []
    results: dict[str, dict | None] = {}
    for name in names:
        rc, result = run_one(name, flags, args.json)
        results[name] = result
        if rc != 0:
            failed.append(name)
    summary = f"{len(names) - len(failed)}/{len(names)} benchmarks passed"
    print(f"\nrun_all: {summary}" + (f"; failed: {', '.join(failed)}" if failed else ""),
          flush=True)
    if args.json:
        print(json.dumps({"benchmarks": results, "failed": failed}, sort_keys=True), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
