"""Console settings, read from ``TIDEMQ_CONSOLE_*`` environment variables (one knob per field)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.constants import CONSOLE_PORT, NAMESERVER_PORT
from services.common.discovery import split_urls
from services.common.settings import ServiceSettings


class ConsoleSettings(ServiceSettings):
    """The console finds every broker through the nameservers (``GET /v1/cluster``); the
    checkers and schedulers are listed only to show their health."""

    model_config = SettingsConfigDict(env_prefix="TIDEMQ_CONSOLE_", extra="ignore")

    port: int = CONSOLE_PORT  # listen port (the pages, /healthz, /metrics)
    # comma-separated nameserver base URLs: where the brokers are found
    nameservers: str = f"http://127.0.0.1:{NAMESERVER_PORT}"
    checkers: str = ""  # comma-separated checker base URLs, shown with their health ("" = none)
    schedulers: str = ""  # comma-separated scheduler base URLs, shown likewise ("" = none)
    request_timeout_s: float = Field(default=5.0, gt=0)  # one request to a service (s)
    page_messages: int = Field(default=50, ge=1, le=1024)  # messages shown per list (DLQ, ...)
    # how often the brokers' /metrics and every group's lag are sampled (s): rates, lag history
    sample_interval_s: float = Field(default=10.0, gt=0)
    history_samples: int = Field(default=360, ge=2, le=100_000)  # lag samples kept per group
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    @property
    def nameserver_urls(self) -> list[str]:
        return split_urls(self.nameservers)

    @property
    def checker_urls(self) -> list[str]:
        return split_urls(self.checkers)

    @property
    def scheduler_urls(self) -> list[str]:
        return split_urls(self.schedulers)
