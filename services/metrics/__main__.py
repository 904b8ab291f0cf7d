"""``python -m tidemq_server.metrics``: the metrics sidecar (settings from ``TIDEMQ_METRICS_*``)."""

from __future__ import annotations

from tidemq_server.common.runner import serve, settings_or_exit
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.metrics.sidecar import create_sidecar_app


def main() -> None:
    settings = settings_or_exit(MetricsSettings, "metrics")
    serve(create_sidecar_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "metrics")


if __name__ == "__main__":
    main()
