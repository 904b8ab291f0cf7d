"""``python -m tidemq_server.scheduler``: one scheduler (settings from ``TIDEMQ_SCHEDULER_*``)."""

from __future__ import annotations

from tidemq_server.common.runner import serve, settings_or_exit
from tidemq_server.scheduler.app import create_scheduler_app
from tidemq_server.scheduler.memory import pin_mmap_threshold
from tidemq_server.scheduler.settings import SchedulerSettings


def main() -> None:
    pin_mmap_threshold()  # before any large buffer exists
    settings = settings_or_exit(SchedulerSettings, "scheduler")
    serve(create_scheduler_app(settings), settings.host, settings.port, settings.log_level,
          settings.server_tls(), settings.log_format, "scheduler")


if __name__ == "__main__":
    main()
