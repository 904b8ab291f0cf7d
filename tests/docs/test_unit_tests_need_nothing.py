"""The README's promise: `make test-unit` (``-m "not integration"``) needs nothing but the
virtualenv. Run as a real pytest process whose PATH holds the virtualenv alone, over every test
module that calls promtool (eight unit tests failed "promtool is not installed" on a fresh
clone): the tests it selects pass, none asks for a missing tool."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO

pytestmark = pytest.mark.integration

TOOL_USE = re.compile(r"\bpromtool\(")  # the outside tool unit tests were caught calling


def test_unit_tests_run_with_only_the_virtualenv_on_path() -> None:
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                     if p.name != Path(__file__).name and TOOL_USE.search(p.read_text()))
    assert len(modules) >= 5, modules  # the promtool users of tests/deploy and tests/metrics
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PATH"] = str(Path(sys.executable).parent)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "not integration", *modules], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout[-4000:] + done.stderr[-2000:]
    assert "not installed" not in done.stdout, done.stdout[-4000:]
