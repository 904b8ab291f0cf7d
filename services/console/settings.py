"""Console settings, read from ``TIDEMQ_CONSOLE_*`` environment variables (one knob per field)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from tidemq_server.common.constants import (
    CONSOLE_PORT,
    CONSOLE_SESSION_TTL_S,
    LOOPBACK_HOSTS,
    NAMESERVER_PORT,
)
from tidemq_server.common.discovery import split_urls
from tidemq_server.common.settings import LogLevel, ServiceSettings


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
    log_level: LogLevel = "info"
    # a browser session (and its sign-in, ACL on) lasts this long (s)
    session_ttl_s: float = Field(default=CONSOLE_SESSION_TTL_S, gt=0)

    @model_validator(mode="after")
    def _open_only_on_loopback(self) -> Self:
        """Without ACL the console acts with full rights for whoever reaches it: loopback only."""
        if not self.acl_file and self.host not in LOOPBACK_HOSTS:
            raise ValueError(f"host {self.host!r}: without ACL (acl_file) the console acts with "
                             "full rights for anyone who reaches it, so it binds loopback only "
                             "(127.0.0.1, ::1 or localhost); set acl_file to listen elsewhere")
        return self

    @property
    def nameserver_urls(self) -> list[str]:
        return split_urls(self.nameservers)

    @property
    def checker_urls(self) -> list[str]:
        return split_urls(self.checkers)

    @property
    def scheduler_urls(self) -> list[str]:
        return split_urls(self.schedulers)
