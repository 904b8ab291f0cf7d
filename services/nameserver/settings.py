"""Nameserver settings, read from ``TIDEMQ_NAMESRV_*`` environment variables."""

from __future__ import annotations

from pydantic import NonNegativeFloat, PositiveFloat
from pydantic_settings import SettingsConfigDict

from tidemq_server.common.constants import (
    BROKER_EXPIRY_S,
    BROKER_HEARTBEAT_INTERVAL_S,
    NAMESERVER_PORT,
)
from tidemq_server.common.settings import ServiceSettings


class NameserverSettings(ServiceSettings):
    """``token`` (TIDEMQ_NAMESRV_TOKEN), when set, is required to register or remove a broker."""

    model_config = SettingsConfigDict(env_prefix="TIDEMQ_NAMESRV_", extra="ignore")

    port: int = NAMESERVER_PORT  # listen port
    broker_expiry_s: PositiveFloat = BROKER_EXPIRY_S  # drop a broker silent this long (s)
    expiry_check_interval_s: PositiveFloat = 10.0  # how often silent brokers are swept (s)
    # for this long after start an unknown topic answers 503 UNAVAILABLE, not 404: brokers
    # re-register with a restarted nameserver within one heartbeat interval (s; 0 = never)
    warmup_s: NonNegativeFloat = BROKER_HEARTBEAT_INTERVAL_S
    # comma-separated base URLs of every nameserver of the cluster, this one included, as
    # GET /v1/cluster lists them for clients ("" = none listed)
    peers: str = ""
    # comma-separated broker group names this nameserver expects (``tidemq up`` lists the
    # groups it starts): once each has a primary registered, the warm-up ends ("" = none)
    expect_brokers: str = ""

    @property
    def expected_groups(self) -> list[str]:
        return [g.strip() for g in self.expect_brokers.split(",") if g.strip()]

    @property
    def peer_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.peers.split(",") if u.strip()]
