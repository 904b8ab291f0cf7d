"""Scheduler settings, read from ``TIDEMQ_SCHEDULER_*`` environment variables.

One field per knob, with its unit and default in the comment. The delay-level table is the
broker's (``TIDEMQ_BROKER_DELAY_LEVELS``): the scheduler reads it from the broker at start.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from tidemq_server.common.constants import SCHEDULER_PORT
from tidemq_server.common.settings import GroupServiceSettings, LogLevel, RedisUrl

MiB = 1024 * 1024


class SchedulerSettings(GroupServiceSettings):
    """One scheduler per broker group: ``broker_name`` + ``nameservers`` find the group's
    broker (``broker_url`` is the fixed broker when no nameservers are given)."""

    model_config = SettingsConfigDict(env_prefix="TIDEMQ_SCHEDULER_", extra="ignore")

    port: int = SCHEDULER_PORT  # internal API, /healthz and /metrics
    redis_url: RedisUrl = "redis://127.0.0.1:6379/0"  # progress per level and on the intake topic
    data_dir: Path = Path("tidemq-data/scheduler")  # timer log, bucket files, checkpoint

    # --- the timer store ---------------------------------------------------------------------
    bucket_ms: int = Field(default=3_600_000, gt=0)  # width of a time bucket on disk (ms)
    preload_ms: int = Field(default=600_000, ge=0)  # load a bucket this long before it starts
    tick_ms: int = Field(default=100, gt=0)  # wheel slot width (ms); bucket_ms is a multiple
    segment_bytes: int = Field(default=256 * MiB, gt=0)  # timer log segment size (bytes)
    checkpoint_interval_ms: int = Field(default=1000, gt=0)  # index fsync + checkpoint (ms)

    # --- intake, levels and delivery -----------------------------------------------------------
    intake_batch: int = Field(default=4096, ge=1, le=4096)  # timers per intake read
    intake_wait_ms: int = Field(default=1000, ge=0, le=30_000)  # intake long poll (ms)
    level_poll_ms: int = Field(default=100, gt=0)  # level queues looked at this often (ms)
    deliver_batch: int = Field(default=1024, ge=1, le=4096)  # timers per deliver request
    deliver_parallelism: int = Field(default=4, ge=1, le=64)  # deliver requests in flight
    progress_interval_ms: int = Field(default=1000, gt=0)  # retention floor report (ms)
    broker_timeout_s: float = Field(default=30.0, gt=0)  # one request to the broker (s)

    # --- roll and rebuild (the timer log is a cache of the broker's intake topic) -------------
    # a pending timer whose intake record is this old (wall time) is rolled: put back into the
    # intake topic, so the broker's retention floor (held at the rebuild floor) stays recent.
    # Keep it well below the broker's file_reserved_hours (ms)
    roll_after_ms: int = Field(default=86_400_000, gt=0)
    roll_interval_ms: int = Field(default=60_000, gt=0)  # rebuild floor + roll pass (ms)
    roll_batch: int = Field(default=16_384, ge=1)  # timers rolled per pass at most

    # --- tests only ----------------------------------------------------------------------------
    clock_offset_ms: int = Field(default=0, ge=0)  # the scheduler's clock runs this far ahead
    test_clock: bool = False  # allow POST /internal/v1/clock to move the clock forward

    log_level: LogLevel = "info"

    @model_validator(mode="after")
    def _validate_tick(self) -> SchedulerSettings:
        if self.bucket_ms % self.tick_ms:
            raise ValueError(f"bucket_ms ({self.bucket_ms}) must be a multiple of tick_ms "
                             f"({self.tick_ms})")
        return self
