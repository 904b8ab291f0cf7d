"""Metrics sidecar settings, read from ``TIDEMQ_METRICS_*`` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from tidemq_server.common.constants import (
    BROKER_PORT,
    METRICS_EXPOSITION_FILE,
    METRICS_MAX_EVENTS_PER_BATCH,
    METRICS_PORT,
    METRICS_SPARK_MASTER,
    METRICS_STALE_AFTER_S,
    METRICS_TRIGGER_INTERVAL_S,
)
from tidemq_server.common.settings import LogLevel, ServiceSettings
from tidemq_server.metrics.config import JobConfig, SessionConfig


class MetricsSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="TIDEMQ_METRICS_", extra="ignore")

    port: int = METRICS_PORT  # listen port of /metrics and /healthz
    # every broker group these nameservers list is read (comma-separated URLs; "" = broker_url)
    nameservers: str = ""
    broker_url: str = f"http://127.0.0.1:{BROKER_PORT}"  # the one broker read without nameservers
    data_dir: Path = Path("tidemq-data/metrics")  # checkpoint and exposition file live here
    topic: str = ""  # the event topic read ("" = TIDE_SYS_TRANS_EVENTS)

    # --- the Spark job -------------------------------------------------------------------------
    run_job: bool = True  # False: only serve the file a job started elsewhere writes
    # a job whose last trigger (or run, for cron --once) is older than this is down (s); with
    # run_job off and a cron --once job, set it above the cron period
    stale_after_s: float = Field(default=METRICS_STALE_AFTER_S, gt=0)
    master: str = METRICS_SPARK_MASTER  # Spark master URL ("local[*]", "spark://host:7077")
    mode: Literal["continuous", "once"] = "continuous"  # micro-batches, or availableNow once
    trigger_interval_s: float = Field(default=METRICS_TRIGGER_INTERVAL_S, gt=0)  # (s)
    max_events_per_batch: int = Field(default=METRICS_MAX_EVENTS_PER_BATCH, ge=0)  # 0: no limit
    partition_events: int = Field(default=50_000, gt=0)  # queue offsets per Spark task
    pull_max: int = Field(default=1024, ge=1, le=1024)  # records per broker pull
    start: Literal["earliest", "latest"] = "earliest"  # where a brand-new checkpoint begins
    shuffle_partitions: int = Field(default=2, ge=1)  # frozen into the checkpoint (§9)
    spark_ui: bool = False  # Spark's web UI (port 4040)
    spark_conf: str = ""  # extra Spark settings: "key=value,key=value"
    restart_delay_s: float = Field(default=10.0, gt=0)  # wait before restarting a failed query
    exposition_file: str = METRICS_EXPOSITION_FILE  # under data_dir

    log_level: LogLevel = "info"

    @property
    def exposition_path(self) -> Path:
        return self.data_dir / self.exposition_file

    @property
    def checkpoint_path(self) -> Path:
        return self.data_dir / "checkpoint"

    def job_config(self) -> JobConfig:
        return JobConfig(
            broker_url=self.broker_url, nameservers=self.nameservers, token=self.token,
            topic=self.topic,
            output=self.exposition_path,
            checkpoint=self.checkpoint_path, once=self.mode == "once",
            trigger_interval_s=self.trigger_interval_s,
            max_events_per_batch=self.max_events_per_batch,
            partition_events=self.partition_events, pull_max=self.pull_max, start=self.start,
        )

    def session_config(self) -> SessionConfig:
        extra = {}
        for item in filter(None, (p.strip() for p in self.spark_conf.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"spark_conf item {item!r} is not key=value")
            extra[key.strip()] = value.strip()
        return SessionConfig(master=self.master, shuffle_partitions=self.shuffle_partitions,
                             ui=self.spark_ui, extra=extra)
