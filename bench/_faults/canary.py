"""Canaries: deliberate bugs that the faults suite must catch (bench/_faults/canaries/).

Each ``*.patch`` is a unified diff against the tree, headed by ``Canary:``, ``Check:`` (the
checker's count that must find it) and ``Bug:`` lines (``git apply`` skips text before the first
``diff --git``). ``run_all`` applies each to a temporary copy of the tree (the working tree as it
is, uncommitted changes included), runs ``python -m bench.faults --short --json`` there, and
calls the canary caught when its named check counted at least one violation. A canary that no
longer applies fails: it is updated with the code, never skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench._faults.checker import VIOLATIONS

ROOT = Path(__file__).resolve().parents[2]
CANARIES = Path(__file__).resolve().parent / "canaries"
RUN_TIMEOUT_S = 1200  # one short schedule under a canary (s)


@dataclass(frozen=True)
class Canary:
    name: str
    check: str  # the checker's count that must be > 0
    bug: str
    patch: Path


@dataclass
class Outcome:
    canary: Canary
    applied: bool
    caught: bool
    counts: dict[str, int]
    note: str = ""


def load(folder: Path = CANARIES) -> list[Canary]:
    out = []
    for patch in sorted(folder.glob("*.patch")):
        head: dict[str, str] = {}
        for line in patch.read_text().splitlines():
            if line.startswith("diff --git"):
                break
            if ":" in line:
                key, _, value = line.partition(":")
                head[key.strip().lower()] = value.strip()
        if not {"canary", "check", "bug"} <= set(head):
            raise ValueError(f"{patch}: needs Canary:, Check: and Bug: lines before the diff")
        out.append(Canary(head["canary"], head["check"], head["bug"], patch))
    return out


def apply(canary: Canary, tree: Path, *, check_only: bool = False) -> str | None:
    """Apply (or only try) the canary's patch in ``tree``; None, or why it does not apply."""
    argv = ["git", "apply", *(["--check"] if check_only else []), str(canary.patch)]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def copy_tree(dest: Path, root: Path = ROOT) -> None:
    """The working tree's files (tracked and untracked, ignored ones left out) into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=root, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        src = root / name
        if name and src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs a copy's own code: its SDK, and its services as
    ``tidemq_server`` (the folder services/, mapped by package-dir when installed) through a link
    like scripts/mypy.sh's. Without the link the installed tree's services, unpatched, ran."""
    (tree / ".lint").mkdir(exist_ok=True)
    link = tree / ".lint" / "tidemq_server"
    if not link.exists():
        link.symlink_to(tree / "services")
    path = os.pathsep.join(str(p) for p in (tree / "sdk", tree / ".lint", tree))
    return {**os.environ, "PYTHONPATH": path}


def run_one(canary: Canary, log: Callable[[str], None]) -> Outcome:
    with tempfile.TemporaryDirectory(prefix=f"tidemq-canary-{canary.name}-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        why = apply(canary, tree)
        if why is not None:
            return Outcome(canary, False, False, {}, f"does not apply: {why}")
        env = tree_env(tree)
        done = subprocess.run([sys.executable, "-m", "bench.faults", "--short", "--json"],
                              cwd=tree, env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, check=False)
        counts = _last_json(done.stdout)
        if not counts:
            tail = (done.stdout + done.stderr)[-1500:]
            return Outcome(canary, True, False, {}, f"no result (exit {done.returncode}):\n{tail}")
        caught = int(counts.get(canary.check, 0)) > 0
        log(f"  {canary.name}: {canary.check} {counts.get(canary.check, 0)}")
        return Outcome(canary, True, caught, counts)


def _last_json(stdout: str) -> dict[str, int]:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            return {k: v for k, v in doc.items() if isinstance(v, int)}
    return {}


def table(outcomes: list[Outcome]) -> str:
    lines = [f"{'canary':<26}{'check':<20}{'count':>7}  verdict", "-" * 66]
    for o in outcomes:
        count = o.counts.get(o.canary.check, 0)
        verdict = ("caught" if o.caught else "MISSED" if o.applied else "DOES NOT APPLY")
        others = ", ".join(f"{k} {v}" for k, v in sorted(o.counts.items())
                           if v and k != o.canary.check and k in VIOLATIONS)
        lines.append(f"{o.canary.name:<26}{o.canary.check:<20}{count:>7}  {verdict}"
                     + (f" (also {others})" if others else ""))
        if o.note:
            lines.append(f"    {o.note[:400]}")
    return "\n".join(lines)
