"""``python -m services.broker``: one broker process (settings from ``TIDEMQ_BROKER_*``)."""

from __future__ import annotations

from services.broker.app import create_broker_app
from services.broker.settings import BrokerSettings
from services.common.runner import serve, settings_or_exit


def main() -> None:
    settings = settings_or_exit(BrokerSettings, "broker")
    app = create_broker_app(settings, release_on_signal=True)
    serve(app, settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "broker")


if __name__ == "__main__":
    main()
