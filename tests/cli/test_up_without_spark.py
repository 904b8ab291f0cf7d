"""`tidemq up` where PySpark is not installed, started from a user's project that has its own
``services`` package: every service but the metrics sidecar starts, and one line says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import free_port
from tests.support.up import UpRun
from tidemq_server.metrics import SPARK_MISSING

pytestmark = pytest.mark.integration

# on PYTHONPATH, imported by every interpreter `up` starts: PySpark cannot be found or imported
NO_SPARK = "import sys\nsys.modules['pyspark'] = None  # as if PySpark were not installed\n"


def test_up_without_pyspark_from_a_project_with_its_own_services_package(tmp_path: Path) -> None:
    app = tmp_path / "app"
    for package in (app / "services", app / "services" / "nameserver"):
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
    hide = tmp_path / "no-spark"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(NO_SPARK)
    ports = {name: free_port() for name in ("nameserver", "broker", "checker", "scheduler",
                                            "metrics")}
    up = UpRun(tmp_path, *(arg for name, port in ports.items()
                           for arg in (f"--{name}-port", str(port))),
               "--grpc-port", "0", cwd=app, env={"PYTHONPATH": str(hide)})
    try:
        up.wait_ready()
        assert f"metrics sidecar not started: {SPARK_MISSING}" in up.output().replace("\n", " ")
        assert set(up.children()) == {"redis", "nameserver", "broker", "checker", "scheduler",
                                      "console"}
    finally:
        assert up.stop() == 0, up.output()
