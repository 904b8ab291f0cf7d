"""Settings base: one pydantic-settings object per service, each with its own env prefix."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    """Fields every service has. Subclasses set ``model_config`` with their env prefix."""

    model_config = SettingsConfigDict(env_prefix="TIDEMQ_", extra="ignore")

    host: str = "127.0.0.1"  # bind address; loopback until ACL exists
    port: int = 0  # listen port (each service sets its default)
    cluster: str = "DefaultCluster"  # namespaces Redis keys and registrations
    token: str = ""  # shared cluster token for /internal/ endpoints ("" = none required)
    log_level: str = "info"
