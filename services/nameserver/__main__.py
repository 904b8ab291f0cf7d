"""``python -m tidemq_server.nameserver``: serve with settings from ``TIDEMQ_NAMESRV_*``."""

from __future__ import annotations

from tidemq_server.common.runner import serve, settings_or_exit
from tidemq_server.nameserver.app import build_app
from tidemq_server.nameserver.settings import NameserverSettings


def main() -> None:
    settings = settings_or_exit(NameserverSettings, "nameserver")
    serve(build_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "nameserver")


if __name__ == "__main__":
    main()
