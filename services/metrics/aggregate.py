"""The job's aggregation in Spark SQL: events → one ``Rollup`` row per key (see ``rollup``).

The same expression serves the streaming query (a stateful aggregation, complete output mode,
state kept in the checkpoint) and a batch DataFrame (the benchmark). Everything is a native
Spark expression: no Python UDF, so the Python workers only run the data source.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tidemq_server.metrics.events import RESOLUTIONS
from tidemq_server.metrics.rollup import (
    CHECK_BUCKETS,
    LATENCY_BUCKETS_S,
    PERCENTILE_ACCURACY,
    QUANTILES,
    Rollup,
)

KEYS = ("producer_group", "topic", "event", "reason")


def _count_if(condition: Column) -> Column:
    return F.sum(F.when(condition, F.lit(1)).otherwise(F.lit(0))).cast("long")


def aggregate(events: DataFrame) -> DataFrame:
    """``events`` with the source's columns (``events.COLUMNS``) → rollup rows."""
    valid = F.col("malformed").isNull()
    resolved = valid & F.col("event").isin(*RESOLUTIONS)
    latency = F.when(
        resolved, F.greatest(F.col("ts_ms") - F.col("born_ms"), F.lit(0)) / F.lit(1000.0))
    checks = F.when(valid, F.col("check_times"))
    blank = F.lit("")  # a malformed event has no trustworthy key: one row per reason
    keyed = events.select(
        F.when(valid, F.col("producer_group")).otherwise(blank).alias("producer_group"),
        F.when(valid, F.col("topic")).otherwise(blank).alias("topic"),
        F.when(valid, F.col("event")).otherwise(blank).alias("event"),
        F.coalesce(F.col("malformed"), blank).alias("reason"),
        F.col("source"), latency.alias("latency_s"), checks.alias("checks"),
    )
    lat, chk = F.col("latency_s"), F.col("checks")
    return keyed.groupBy(*KEYS).agg(
        F.count(F.lit(1)).alias("events"),
        _count_if(F.col("source") == "producer").alias("from_producer"),
        _count_if(F.col("source") == "check").alias("from_check"),
        F.coalesce(F.sum(lat), F.lit(0.0)).alias("latency_sum_s"),
        F.array(*[_count_if(lat <= F.lit(b)) for b in LATENCY_BUCKETS_S]
                ).alias("latency_buckets"),
        F.percentile_approx(lat, list(QUANTILES), PERCENTILE_ACCURACY
                            ).alias("latency_quantiles_s"),
        F.coalesce(F.sum(chk), F.lit(0)).cast("long").alias("checks_sum"),
        F.array(*[_count_if(chk <= F.lit(b)) for b in CHECK_BUCKETS]).alias("check_buckets"),
    )


def to_rollup(row: Any) -> Rollup:
    """One collected Spark row → ``Rollup`` (malformed rows keep only their count)."""
    d = row.asDict() if hasattr(row, "asDict") else dict(row)
    reason = d["reason"] or ""
    roll = Rollup(d["producer_group"] or "", d["topic"] or "", d["event"] or "", reason,
                  events=int(d["events"]))
    if reason:
        return roll
    roll.from_producer = int(d["from_producer"])
    roll.from_check = int(d["from_check"])
    roll.latency_sum_s = float(d["latency_sum_s"] or 0.0)
    roll.latency_buckets = [int(v) for v in d["latency_buckets"]]
    quantiles = d["latency_quantiles_s"]
    roll.latency_quantiles_s = [float(v) for v in quantiles] if quantiles else None
    roll.checks_sum = int(d["checks_sum"] or 0)
    roll.check_buckets = [int(v) for v in d["check_buckets"]]
    return roll
