"""``python -m tidemq_server.console``: the web console (settings from ``TIDEMQ_CONSOLE_*``)."""

from __future__ import annotations

from tidemq_server.common.runner import serve, settings_or_exit
from tidemq_server.console.app import create_console_app
from tidemq_server.console.settings import ConsoleSettings


def main() -> None:
    settings = settings_or_exit(ConsoleSettings, "console")
    serve(create_console_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "console")


if __name__ == "__main__":
    main()
