"""The metrics sidecar: a PySpark job over ``TIDE_SYS_TRANS_EVENTS`` and its Prometheus export.

Kept import-light: Spark's Python workers import ``tidemq_server.metrics.source`` and its helpers,
so nothing here pulls in the web stack. See README.md in this folder.
"""

from __future__ import annotations

import importlib.util

METRICS_EXTRA = "pip install 'tidemq[metrics]'"  # PySpark and pandas (pyproject.toml extras)
SPARK_MISSING = f"PySpark is not installed (the metrics extra: {METRICS_EXTRA})"


def spark_installed() -> bool:
    """True when PySpark can be imported; looks for it without importing it (a second)."""
    return importlib.util.find_spec("pyspark") is not None
