"""The events source over every broker group a nameserver lists (reader called directly, and one
available-now run on Spark): offsets per group, a group that joins, a group that is down, and a
one-broker checkpoint carried over."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from tests.metrics.test_job import expected, without_batch
from tests.support.broker import unique
from tests.support.groups import GroupProcs, Groups, run_groups
from tests.support.metrics import Script, encode, parse_exposition, put_events
from tests.support.procs import RedisServer
from tests.support.wait import wait_until
from tidemq_server.metrics.job import JobConfig, start_query
from tidemq_server.metrics.source import (
    ARROW_SCHEMA,
    TransactionEventReader,
    TransactionEventSource,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory,
          redis_server: RedisServer) -> Iterator[Groups]:
    """Three groups without checkers and schedulers (events are written directly)."""
    with run_groups(tmp_path_factory.mktemp("metrics-groups"), redis_server.url, groups=3,
                    sidecars=False) as running:
        yield running


def reader(running: Groups, token: str, topic: str, **options: str) -> TransactionEventReader:
    source = TransactionEventSource({"nameservers": running.nameserver_urls, "token": token,
                                     "topic": topic, **options})
    made = source.streamReader(schema=None)  # type: ignore[arg-type]
    assert isinstance(made, TransactionEventReader)
    return made


def read_all(r: TransactionEventReader, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    copy = pickle.loads(pickle.dumps(r))  # what an executor gets
    batches = [b for p in r.partitions(start, end) for b in copy.read(p)]
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def events(group: GroupProcs, token: str, topic: str, n: int, tag: str) -> list[bytes]:
    script = Script(f"shop-{tag}", "Orders")
    for i in range(n):
        script.ended("commit", 500 * i)  # exact in binary: sums do not depend on order
    bodies = [encode(b) for b in script.bodies]
    put_events(group.url, token, topic, bodies, queues=2)
    return bodies


def test_every_group_is_read_and_keeps_its_own_offsets(three: Groups, token: str) -> None:
    a, b, c = (three.groups[n] for n in ("broker-a", "broker-b", "broker-c"))
    topic = unique("Events")
    for g in (a, b):
        g.create_topic(topic, queues=2)
    r = reader(three, token, topic)
    start = r.initialOffset()
    assert start == {"brokers": {"broker-a": {"0": 0, "1": 0}, "broker-b": {"0": 0, "1": 0}}}
    sent = events(a, token, topic, 5, "a") + events(b, token, topic, 3, "b")
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"brokers": {"broker-a": {"0": 5, "1": 5}, "broker-b": {"0": 3, "1": 3}}}
    table = read_all(r, start, end)
    assert table.num_rows == len(sent) == 16

    # a group that gets the topic later is read from its first event
    c.create_topic(topic, queues=2)
    more = events(c, token, topic, 2, "c")
    wait_until(lambda: "broker-c" in r.latestOffset(end, ReadAllAvailable())["brokers"], 10,
               "broker-c in the next batch")
    later = r.latestOffset(end, ReadAllAvailable())
    assert later["brokers"]["broker-c"] == {"0": 2, "1": 2}
    assert later["brokers"]["broker-a"] == end["brokers"]["broker-a"]
    assert read_all(r, end, later).num_rows == len(more)

    # a group that is down is skipped; its queues wait and nothing of it is lost
    events(a, token, topic, 1, "a2")
    b_events = events(b, token, topic, 2, "b2")
    b.kill_broker()
    try:
        partial = r.latestOffset(later, ReadAllAvailable())
        assert partial["brokers"]["broker-b"] == later["brokers"]["broker-b"]
        assert partial["brokers"]["broker-a"] == {"0": 6, "1": 6}
        assert read_all(r, later, partial).num_rows == 2
    finally:
        b.start_broker()
    wait_until(lambda: r.latestOffset(partial, ReadAllAvailable())["brokers"]["broker-b"]
               != later["brokers"]["broker-b"], 15, "broker-b read again after its return")
    rest = r.latestOffset(partial, ReadAllAvailable())
    assert rest["brokers"]["broker-b"] == {"0": 5, "1": 5}
    assert read_all(r, partial, rest).num_rows == len(b_events)
    r.stop()


def test_a_one_broker_checkpoint_is_carried_over_to_its_group(three: Groups, token: str
                                                               ) -> None:
    a, b = three.groups["broker-a"], three.groups["broker-b"]
    topic = unique("Events")
    for g in (a, b):
        g.create_topic(topic, queues=2)
    events(a, token, topic, 4, "a")
    events(b, token, topic, 1, "b")
    legacy = {"queues": {"0": 3, "1": 4}}  # written by a job reading broker-a alone
    r = reader(three, token, topic, broker_url=a.url)
    end = r.latestOffset(legacy, ReadAllAvailable())
    assert end == {"brokers": {"broker-a": {"0": 4, "1": 4}, "broker-b": {"0": 1, "1": 1}}}
    assert read_all(r, legacy, end).num_rows == 1 + 2  # broker-a's last one, broker-b's two
    elsewhere = reader(three, token, topic, broker_url="http://127.0.0.1:9")
    assert elsewhere.latestOffset(legacy, ReadAllAvailable())["brokers"]["broker-a"] == \
        {"0": 4, "1": 4}
    assert read_all(elsewhere, legacy, end).num_rows == 8 + 2  # dropped: read from the start


def test_the_job_counts_the_events_of_every_group(spark: Any, three: Groups, token: str,
                                                  job_dir: Path) -> None:
    topic = unique("Events")
    bodies: list[bytes] = []
    for tag, g in three.groups.items():
        g.create_topic(topic, queues=2)
        bodies += events(g, token, topic, 7, tag)
    cfg = JobConfig(broker_url="", nameservers=three.nameserver_urls, token=token, topic=topic,
                    once=True, output=job_dir / "metrics.prom",
                    checkpoint=job_dir / "checkpoint", max_events_per_batch=20,
                    partition_events=8)
    query = start_query(spark, cfg)
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None, query.exception()
    got = parse_exposition(cfg.output.read_text())
    assert without_batch(got) == without_batch(expected(bodies))
