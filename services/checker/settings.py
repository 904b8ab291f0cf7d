"""Checker settings, read from ``TIDEMQ_CHECKER_*`` environment variables (one knob per field)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from tidemq_server.common.constants import (
    CHECKER_PORT,
    TRANSACTION_CHECK_INTERVAL_MS,
    TRANSACTION_CHECK_MAX,
    TRANSACTION_CHECK_MIN_SLEEP_MS,
    TRANSACTION_CHECK_SLACK_MS,
    TRANSACTION_MAX_AGE_S,
    TRANSACTION_TIMEOUT_MS,
)
from tidemq_server.common.settings import GroupServiceSettings, LogLevel, RedisUrl


class CheckerSettings(GroupServiceSettings):
    """One checker per broker group: ``broker_name`` + ``nameservers`` find the group's broker
    (``broker_url`` is the fixed broker when no nameservers are given)."""

    model_config = SettingsConfigDict(env_prefix="TIDEMQ_CHECKER_", extra="ignore")

    port: int = CHECKER_PORT  # listen port (/healthz, /metrics, /internal/v1/scan)
    redis_url: RedisUrl = "redis://127.0.0.1:6379/0"  # progress (half and op offsets)
    # scan the half queue at least this often (ms; RocketMQ's transactionCheckInterval), and
    # sooner: at the earliest due time of the half messages watched since the last scan
    check_interval_ms: int = Field(default=TRANSACTION_CHECK_INTERVAL_MS, gt=0)
    # least time between two scans, and between two looks at new half messages (ms)
    check_min_sleep_ms: int = Field(default=TRANSACTION_CHECK_MIN_SLEEP_MS, ge=0)
    # scan this long after the earliest due time (ms)
    check_slack_ms: int = Field(default=TRANSACTION_CHECK_SLACK_MS, ge=0)
    # a half message is first checked this long after it was stored, unless it carries its own
    # check_immunity_s (ms); also the least time between two checks of one message
    transaction_timeout_ms: int = Field(default=TRANSACTION_TIMEOUT_MS, ge=0)
    # checks sent to producers before a half message is discarded
    check_max: int = Field(default=TRANSACTION_CHECK_MAX, ge=1)
    max_age_s: float = Field(default=TRANSACTION_MAX_AGE_S, gt=0)  # discard older halves (s)
    batch_size: int = Field(default=512, ge=1, le=4096)  # half messages per page and action call
    request_timeout_s: float = Field(default=30.0, gt=0)  # one request to the broker (s)
    log_level: LogLevel = "info"
