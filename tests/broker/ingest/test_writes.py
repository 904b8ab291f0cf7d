"""``Ingest``, the broker's one write path, over a real store: plain writes counted or not,
batches as sent with records after them, settle, and a refusal mapped to the client's error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.records.v2 import BatchBuilder
from tidemq.protocol.records.v2_read import validate

from tests.broker.store.conftest import make_record, small_config
from tidemq_server.broker.delays.routing import DelayRouter
from tidemq_server.broker.ingest.dedup import DedupCache
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.observability import BrokerMetrics
from tidemq_server.broker.store import MessageStore


@pytest.fixture
async def ingest(tmp_path: Path) -> AsyncIterator[Ingest]:
    store = await MessageStore.open(small_config(tmp_path / "store"))
    yield Ingest(store, store.writer, DedupCache(600, 1000, 0), BrokerMetrics(),
                 DelayRouter((1000,), 60_000).waiting)
    await store.close()


def _requests(ingest: Ingest, status: str = "ok") -> float:
    value = ingest.metrics.registry.get_sample_value("tidemq_broker_put_requests_total",
                                                     {"status": status})
    return value or 0.0


async def test_a_counted_write_is_in_the_put_metrics_and_an_uncounted_one_is_not(
        ingest: Ingest) -> None:
    where = await ingest.write([make_record(0), make_record(1)])
    assert [(a.queue_id, a.queue_offset) for a in where] == [(0, 0), (0, 1)]
    assert _requests(ingest) == 1
    await ingest.write([make_record(2)], counted=False)
    assert _requests(ingest) == 1
    got = ingest.store.get("T", 0, 0, 10).records
    assert [r.message_id for r in got] == ["id-T-0", "id-T-1", "id-T-2"]


async def test_batches_as_sent_then_records_in_one_commit(ingest: Ingest) -> None:
    b = BatchBuilder("T", 1)
    b.add(b"one", "m1", born_timestamp=5)
    b.add(b"two", "m2", born_timestamp=5)
    raw = b.finish()
    batches = ingest.batches_of(raw, [validate(raw, strict=True)], "10.0.0.1:5")
    appended = await ingest.write_batches(batches, [make_record(7, topic="U")])
    assert len(appended) == 2  # one per batch: the producer's, then the encoded records
    assert [r.message_id for r in ingest.store.get("T", 1, 0, 10).records] == ["m1", "m2"]
    assert [r.message_id for r in ingest.store.get("U", 0, 0, 10).records] == ["id-U-7"]
    assert ingest.store.get("T", 1, 0, 10).records[0].born_host == "10.0.0.1:5"
    assert _requests(ingest) == 1


async def test_settle_and_a_refused_write(ingest: Ingest) -> None:
    await ingest.write([make_record(0)])
    await ingest.settle(ingest.store.log.write_offset)  # the writer acknowledges what it has
    await ingest.store.close()
    with pytest.raises(ProtocolError) as err:
        await ingest.write([make_record(1)])
    assert err.value.code is ErrorCode.UNAVAILABLE
    assert _requests(ingest, "unavailable") == 1
