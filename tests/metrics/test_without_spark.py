"""The metrics sidecar where PySpark is not installed: it refuses to run its job, naming the
extra, and still serves a file a job elsewhere writes (serve-only mode needs no Spark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tidemq_server.metrics import METRICS_EXTRA
from tidemq_server.metrics.settings import MetricsSettings

RUN_TIMEOUT_S = 120.0  # one interpreter importing the web stack on a loaded machine
# PySpark cannot be found or imported in this interpreter, then the sidecar runs as __main__
WITHOUT_SPARK = ("import runpy, sys\n"
                 "sys.modules['pyspark'] = None\n"
                 "runpy.run_module('tidemq_server.metrics', run_name='__main__')\n")


def test_the_sidecar_refuses_to_run_its_job_without_pyspark(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_SPARK], cwd=tmp_path,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={"TIDEMQ_METRICS_DATA_DIR": str(tmp_path / "metrics"),
                               "TIDEMQ_METRICS_PORT": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert METRICS_EXTRA in done.stderr and "TIDEMQ_METRICS_RUN_JOB=false" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_settings_import_no_spark() -> None:
    settings = MetricsSettings(data_dir=Path("/nonexistent"))
    assert settings.job_config().output == Path("/nonexistent") / settings.exposition_file
    code = ("import sys; sys.modules['pyspark'] = None\n"
            "from tidemq_server.metrics.settings import MetricsSettings\n"
            "from tidemq_server.metrics.sidecar import create_sidecar_app\n"
            "create_sidecar_app(MetricsSettings(run_job=False))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
