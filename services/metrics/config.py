"""What the metrics job is given: the query's and the Spark session's settings.

Apart from the job (``job.py``) so that the sidecar's settings, which build these, import no
Spark: the sidecar starts, and serves a file in serve-only mode, without PySpark installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tidemq_server.common.constants import (
    METRICS_MAX_EVENTS_PER_BATCH,
    METRICS_SPARK_MASTER,
    METRICS_TRIGGER_INTERVAL_S,
)


@dataclass(frozen=True)
class JobConfig:
    broker_url: str  # the one broker read when no nameservers are given
    output: Path  # the exposition file each batch replaces
    checkpoint: Path  # Spark's checkpoint: source offsets, aggregation state
    token: str = ""
    nameservers: str = ""  # comma-separated: read every broker group they list
    topic: str = ""  # "" = TIDE_SYS_TRANS_EVENTS
    once: bool = False  # Trigger.AvailableNow: read what is there now, then stop
    trigger_interval_s: float = METRICS_TRIGGER_INTERVAL_S
    max_events_per_batch: int = METRICS_MAX_EVENTS_PER_BATCH
    partition_events: int = 50_000
    pull_max: int = 1024
    start: str = "earliest"

    def source_options(self) -> dict[str, str]:
        opts = {"broker_url": self.broker_url, "nameservers": self.nameservers,
                "token": self.token, "start": self.start,
                "max_events_per_batch": str(self.max_events_per_batch),
                "partition_events": str(self.partition_events), "pull_max": str(self.pull_max)}
        if self.topic:
            opts["topic"] = self.topic
        return opts


@dataclass(frozen=True)
class SessionConfig:
    master: str = METRICS_SPARK_MASTER  # "" = spark-submit's under spark-submit, else local[*]
    app_name: str = "tidemq-metrics"
    shuffle_partitions: int = 2  # frozen into the checkpoint on its first run
    ui: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)
