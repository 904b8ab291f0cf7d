"""``python -m services.metrics``: the metrics sidecar (settings from ``TIDEMQ_METRICS_*``)."""

from __future__ import annotations

from services.common.runner import serve
from services.metrics.settings import MetricsSettings
from services.metrics.sidecar import create_sidecar_app


def main() -> None:
    settings = MetricsSettings()
    serve(create_sidecar_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls())


if __name__ == "__main__":
    main()
