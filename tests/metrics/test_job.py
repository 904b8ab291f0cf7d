"""The streaming job on real Spark (local[2], one shared session) against a real broker.

Events are written to the broker, the job runs with Trigger.AvailableNow and a small read limit
(so every run takes several micro-batches), and its exposition must equal, sample for sample,
the one rendered from the plain-Python aggregation of the same events.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerHandle, unique
from tests.support.metrics import (
    MALFORMED_BY_REASON,
    Body,
    Samples,
    Script,
    encode,
    parse_exposition,
    promtool,
    put_events,
    sample,
    scenario,
)
from tidemq_server.metrics.events import parse_event
from tidemq_server.metrics.exposition import BatchInfo, render
from tidemq_server.metrics.job import JobConfig, start_query
from tidemq_server.metrics.rollup import python_rollup

pytestmark = pytest.mark.integration

BATCH_LABELS = ("tidemq_metrics_batch_id", "tidemq_metrics_batch_timestamp_seconds")


def run_once(spark: Any, broker: BrokerHandle, token: str, topic: str, job_dir: Path,
             max_events: int = 40) -> tuple[str, Samples]:
    cfg = JobConfig(broker_url=broker.url, token=token, topic=topic, once=True,
                    output=job_dir / "metrics.prom", checkpoint=job_dir / "checkpoint",
                    max_events_per_batch=max_events, partition_events=16)
    query = start_query(spark, cfg)
    query.awaitTermination(120)
    assert not query.isActive, "the available-now run did not finish"
    assert query.exception() is None, query.exception()
    text = cfg.output.read_text()
    return text, parse_exposition(text)


def expected(bodies: Sequence[Body]) -> Samples:
    rollups = python_rollup(parse_event(encode(b)) for b in bodies)
    return parse_exposition(render(rollups, BatchInfo(0, 0.0)))


def without_batch(samples: Samples) -> Samples:
    return {k: v for k, v in samples.items() if k[0] not in BATCH_LABELS}


def test_counts_buckets_and_malformed_events_exactly(spark: Any, events_broker: BrokerHandle,
                                                     token: str, job_dir: Path) -> None:
    topic = events_broker.create_topic(unique("Events"), queues=2)
    bodies = scenario()
    put_events(events_broker.url, token, topic, bodies, queues=2)
    text, got = run_once(spark, events_broker, token, topic, job_dir)
    promtool("check", "metrics", stdin=text)
    assert without_batch(got) == without_batch(expected(bodies))
    assert sample(got, "tidemq_metrics_batch_id") >= 1  # several micro-batches

    shop = {"producer_group": "shop", "topic": "Orders"}
    assert sample(got, "tidemq_transaction_half_messages_total", **shop) == 11
    assert sample(got, "tidemq_transaction_commits_total", **shop, source="producer") == 5
    assert sample(got, "tidemq_transaction_check_outcomes_total", **shop, outcome="commit") == 1
    assert sample(got, "tidemq_transaction_discards_total", **shop) == 1
    commit = {**shop, "outcome": "commit"}
    name = "tidemq_transaction_resolution_seconds_bucket"
    assert [sample(got, name, **commit, le=le) for le in ("0.1", "1.0", "5.0", "10.0", "+Inf")
            ] == [1, 3, 4, 5, 6]
    assert sample(got, "tidemq_transaction_resolution_quantiles_seconds", **commit,
                  quantile="0.5") == 0.7
    for reason, count in MALFORMED_BY_REASON.items():
        assert sample(got, "tidemq_metrics_malformed_events_total", reason=reason) == count
    assert sample(got, "tidemq_metrics_events_read_total") == len(bodies)


def test_restart_from_the_checkpoint_counts_nothing_twice(spark: Any,
                                                          events_broker: BrokerHandle,
                                                          token: str, job_dir: Path) -> None:
    topic = events_broker.create_topic(unique("Events"), queues=3)
    first = scenario()
    put_events(events_broker.url, token, topic, first, queues=3)
    _, got = run_once(spark, events_broker, token, topic, job_dir)
    assert without_batch(got) == without_batch(expected(first))

    # a new query on the same checkpoint reads only what came since
    later = Script("shop", "Orders")
    for after in (300, 9000, 90_000):
        later.ended("commit", after)
    later.discarded(2, 1_000_000)
    put_events(events_broker.url, token, topic, later.bodies, queues=3)
    _, got = run_once(spark, events_broker, token, topic, job_dir)
    assert without_batch(got) == without_batch(expected(first + later.bodies))
    last_batch = int(sample(got, "tidemq_metrics_batch_id"))

    # a crash after the batch's offsets were logged but before it was committed: Spark runs
    # that batch again from the state of the batch before; the totals stay exact
    commits = job_dir / "checkpoint" / "commits"
    (commits / str(last_batch)).unlink()
    (commits / f".{last_batch}.crc").unlink(missing_ok=True)
    (job_dir / "metrics.prom").unlink()
    _, got = run_once(spark, events_broker, token, topic, job_dir)
    assert int(sample(got, "tidemq_metrics_batch_id")) == last_batch  # replayed, not new
    assert without_batch(got) == without_batch(expected(first + later.bodies))
