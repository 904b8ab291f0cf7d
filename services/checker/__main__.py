"""``python -m tidemq_server.checker``: one checker process (settings from ``TIDEMQ_CHECKER_*``)."""

from __future__ import annotations

from tidemq_server.checker.app import create_checker_app
from tidemq_server.checker.settings import CheckerSettings
from tidemq_server.common.runner import serve, settings_or_exit


def main() -> None:
    settings = settings_or_exit(CheckerSettings, "checker")
    serve(create_checker_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "checker")


if __name__ == "__main__":
    main()
