"""The data source's reader, called directly (no Spark) against a real broker process."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from tidemq.protocol import make_event

from tests.support.broker import BrokerHandle, unique
from tests.support.metrics import MALFORMED, Body, Script, encode, put_events, scenario
from tidemq_server.common.broker_client import BrokerRefused
from tidemq_server.metrics.events import COLUMNS, parse_event
from tidemq_server.metrics.source import (
    ARROW_SCHEMA,
    RangePartition,
    SourceOptions,
    TransactionEventReader,
    TransactionEventSource,
    _parse_vectorized,
    to_arrow,
)

pytestmark = pytest.mark.integration


def reader(broker: BrokerHandle, token: str, topic: str, **options: str,
           ) -> TransactionEventReader:
    opts = {"broker_url": broker.url, "token": token, "topic": topic, **options}
    source = TransactionEventSource(opts)
    assert source.schema().startswith("queue_id int, queue_offset bigint")
    made = source.streamReader(schema=None)  # type: ignore[arg-type]
    assert isinstance(made, TransactionEventReader)
    return made


def read_all(r: TransactionEventReader, start: dict, end: dict) -> pa.Table:
    copy = pickle.loads(pickle.dumps(r))  # what an executor gets
    batches = [b for p in r.partitions(start, end) for b in copy.read(p)]
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="broker_url"):
        SourceOptions.parse({})
    with pytest.raises(ValueError, match="start"):
        SourceOptions.parse({"broker_url": "http://x", "start": "middle"})
    with pytest.raises(ValueError, match="pull_max"):
        SourceOptions.parse({"broker_url": "http://x", "pull_max": "5000"})
    opts = SourceOptions.parse({"broker_url": "http://x", "max_events_per_batch": "0"})
    assert opts.max_events_per_batch == 0 and opts.topic == "TIDE_SYS_TRANS_EVENTS"


def test_a_topic_that_does_not_exist_yet_has_no_data(events_broker: BrokerHandle,
                                                     token: str) -> None:
    r = reader(events_broker, token, unique("Absent"))
    start = r.initialOffset()
    assert start == {"queues": {}}
    assert r.latestOffset(start, ReadAllAvailable()) == start
    assert r.partitions(start, start) == []


def test_offsets_limits_available_now_and_reading(events_broker: BrokerHandle,
                                                  token: str) -> None:
    topic = events_broker.create_topic(unique("Events"), queues=3)
    script = Script("g", "Orders")
    for i in range(40):
        script.ended("commit", 10 * i)
    bodies = script.bodies + MALFORMED  # 80 events + 6 malformed
    put_events(events_broker.url, token, topic, bodies, queues=3)
    r = reader(events_broker, token, topic, max_events_per_batch="30", partition_events="10",
               pull_max="7")
    assert r.getDefaultReadLimit() == ReadMaxRows(30)
    start = r.initialOffset()
    assert start == {"queues": {"0": 0, "1": 0, "2": 0}}
    limited = r.latestOffset(start, ReadMaxRows(30))
    assert sorted(limited["queues"].values()) == [10, 10, 10]
    everything = r.latestOffset(start, ReadAllAvailable())
    assert sum(everything["queues"].values()) == len(bodies)
    assert r.reportLatestOffset() == everything

    r.prepareForTriggerAvailableNow()  # frozen here: later events wait for the next run
    put_events(events_broker.url, token, topic, script.bodies[:9], queues=3)
    assert r.latestOffset(everything, ReadAllAvailable()) == everything

    parts = r.partitions(start, limited)
    assert all(isinstance(p, RangePartition) and p.end - p.begin <= 10 for p in parts)
    first = read_all(r, start, limited)
    rest = read_all(r, limited, everything)
    assert first.num_rows == 30 and rest.num_rows == len(bodies) - 30
    table = pa.concat_tables([first, rest])
    assert table.column_names == [name for name, _ in COLUMNS]
    keys = set(zip(table["queue_id"].to_pylist(), table["queue_offset"].to_pylist(),
                   strict=True))
    assert len(keys) == len(bodies)  # every offset once
    malformed = [m for m in table["malformed"].to_pylist() if m]
    assert len(malformed) == len(MALFORMED)
    assert table["event"].to_pylist().count("commit") == 40


def test_start_latest_skips_history(events_broker: BrokerHandle, token: str) -> None:
    topic = events_broker.create_topic(unique("Events"), queues=2)
    put_events(events_broker.url, token, topic, Script("g", "T").bodies or ["{}"] * 4, queues=2)
    r = reader(events_broker, token, topic, start="latest")
    assert r.initialOffset() == {"queues": {"0": 2, "1": 2}}


def test_a_wrong_token_fails_the_read(events_broker: BrokerHandle) -> None:
    topic = events_broker.create_topic(unique("Events"), queues=1)
    put_events(events_broker.url, "test-token", topic, ["{}"])
    r = reader(events_broker, "wrong", topic)
    start, end = r.initialOffset(), r.latestOffset({"queues": {}}, ReadAllAvailable())
    with pytest.raises(BrokerRefused, match="401"):
        read_all(r, start, end)


def _rows(batch: pa.RecordBatch) -> list[tuple]:
    return [tuple(row.values()) for row in batch.to_pylist()]


def test_vectorized_parse_follows_the_python_rules() -> None:
    script = Script("shop", "Orders")
    for i in range(50):
        script.ended("commit", i)
    valid = [encode(b) for b in script.bodies]
    valid.append(encode(make_event("half", producer_group="g", topic="t", transaction_id="x",
                                   message_id="", born_ms=0, ts_ms=0)))
    assert _parse_vectorized(valid) is not None
    batch = to_arrow(3, list(range(len(valid))), valid)
    assert _rows(batch) == [(3, i, *parse_event(b)) for i, b in enumerate(valid)]

    edge: list[Body] = [
        make_event("half", producer_group="g", topic="t", transaction_id="x", born_ms=0,
                   ts_ms=0, check_times=2**31),  # past the 32-bit column
        make_event("half", producer_group="", topic="t", transaction_id="x", born_ms=0,
                   ts_ms=0),
        make_event("half", producer_group="g" * 256, topic="t", transaction_id="x",
                   born_ms=0, ts_ms=0),
        {**make_event("half", producer_group="g", topic="t", transaction_id="x", born_ms=0,
                      ts_ms=0), "ts_ms": 1.0},
        '{"event": "half",\n "source": "producer"}',  # a raw newline inside the body
        "",
    ]
    for bad in [*scenario()[-6:], *edge]:
        bodies = [*valid[:5], encode(bad), *valid[5:9]]
        assert _parse_vectorized(bodies) is None, bad
        batch = to_arrow(0, list(range(len(bodies))), bodies)
        assert _rows(batch) == [(0, i, *parse_event(b)) for i, b in enumerate(bodies)]
        assert _rows(batch)[5][-1] is not None, bad
    assert to_arrow(0, [], []).num_rows == 0
