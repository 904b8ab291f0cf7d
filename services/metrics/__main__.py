"""``python -m tidemq_server.metrics``: the metrics sidecar (settings from ``TIDEMQ_METRICS_*``)."""

from __future__ import annotations

import sys

from tidemq_server.common.runner import serve, settings_or_exit
from tidemq_server.metrics import SPARK_MISSING, spark_installed
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import create_sidecar_app


def main() -> None:
    settings = settings_or_exit(MetricsSettings, "metrics")
    if settings.run_job and not spark_installed():  # serve-only mode needs no Spark
        sys.exit(f"tidemq metrics sidecar: {SPARK_MISSING}; or run it with "
                 "TIDEMQ_METRICS_RUN_JOB=false to serve a file a job elsewhere writes")
    serve(create_sidecar_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "metrics")


if __name__ == "__main__":
    main()
