"""``python -m tidemq_server.broker``: one broker process (settings from ``TIDEMQ_BROKER_*``)."""

from __future__ import annotations

from tidemq_server.broker.app import create_broker_app
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.common.door_http import lean_protocol
from tidemq_server.common.httpserver import JsonErrorsProtocol
from tidemq_server.common.runner import serve, settings_or_exit


def main() -> None:
    settings = settings_or_exit(BrokerSettings, "broker")
    app = create_broker_app(settings, release_on_signal=True)
    protocol = lean_protocol(app) if settings.lean_door == "protocol" else JsonErrorsProtocol
    serve(app, settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "broker", protocol)


if __name__ == "__main__":
    main()
