"""``python -m services.console``: the web console (settings from ``TIDEMQ_CONSOLE_*``)."""

from __future__ import annotations

from services.common.runner import serve
from services.console.app import create_console_app
from services.console.settings import ConsoleSettings


def main() -> None:
    settings = ConsoleSettings()
    serve(create_console_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls())


if __name__ == "__main__":
    main()
