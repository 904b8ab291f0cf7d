"""``python -m services.metrics``: the metrics sidecar (settings from ``TIDEMQ_METRICS_*``)."""

from __future__ import annotations

from services.common.runner import serve, settings_or_exit
from services.metrics.settings import MetricsSettings
from services.metrics.sidecar import create_sidecar_app


def main() -> None:
    settings = settings_or_exit(MetricsSettings, "metrics")
    serve(create_sidecar_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "metrics")


if __name__ == "__main__":
    main()
