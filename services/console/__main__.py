"""``python -m services.console``: the web console (settings from ``TIDEMQ_CONSOLE_*``)."""

from __future__ import annotations

from services.common.runner import serve, settings_or_exit
from services.console.app import create_console_app
from services.console.settings import ConsoleSettings


def main() -> None:
    settings = settings_or_exit(ConsoleSettings, "console")
    serve(create_console_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "console")


if __name__ == "__main__":
    main()
