"""The services' import name (tidemq_server): not shadowed by a user's own ``services`` package,
one version for both packages, and no PySpark import outside the metrics job.

Each check runs a fresh interpreter (a subprocess), since what matters is what a new process
imports from the directory it is started in.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import tidemq

import tidemq_server
from tidemq_server.cli.plan import SERVICE_ORDER

RUN_TIMEOUT_S = 120.0  # one interpreter importing the CLI on a loaded 2-core machine


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def user_project(root: Path) -> Path:
    """A user's application with its own ``services`` package (and a ``services.nameserver``)."""
    app = root / "app"
    for package in (app / "services", app / "services" / "nameserver"):
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
    return app


def test_a_users_services_package_does_not_shadow_the_server(tmp_path: Path) -> None:
    app = user_project(tmp_path)
    modules = [f"tidemq_server.{kind}" for kind in SERVICE_ORDER]
    found = run_python("from tidemq_server.cli.plan import module_available\n"
                       f"print([m for m in {modules!r} if not module_available(m)])", app)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"  # `tidemq up` can start every service from here
    helped = subprocess.run([sys.executable, "-m", "tidemq_server.cli", "up", "--help"], cwd=app,
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert helped.returncode == 0, helped.stderr
    assert "--metrics" in helped.stdout


def test_the_console_script_runs_from_a_users_project(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "tidemq"
    assert script.exists(), "the tidemq console script is not installed beside this Python"
    helped = subprocess.run([str(script), "--help"], cwd=user_project(tmp_path),
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert helped.returncode == 0, helped.stderr
    assert "up" in helped.stdout


def test_one_version_for_the_sdk_the_services_and_the_distribution() -> None:
    assert tidemq.__version__ == importlib.metadata.version("tidemq")
    assert tidemq_server.__version__ == tidemq.__version__


def test_the_cli_and_the_services_never_import_pyspark(tmp_path: Path) -> None:
    modules = ["tidemq_server.cli", "tidemq_server._script", "tidemq_server.broker.app",
               "tidemq_server.nameserver.app", "tidemq_server.checker.app",
               "tidemq_server.scheduler.app", "tidemq_server.console.app",
               "tidemq_server.metrics", "tidemq_server.metrics.sidecar",
               "tidemq_server.metrics.package"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('pyspark', 'pyarrow', "
            "'pandas')))")
    done = run_python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
