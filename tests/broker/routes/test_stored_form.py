"""Record format v2 over HTTP against a real broker: a send of producer-made batches
(``application/x-tidemq-batch``), and pulls that answer with the stored bytes. JSON and
msgpack sends and pulls of the same messages stay as the contract says."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
from tidemq.protocol.batch import CONTENT_BATCH, BatchBuilder

from tests.support.broker import BrokerHandle, run_broker
from tests.support.procs import RedisServer

pytestmark = pytest.mark.integration

BATCH_HEADERS = {"content-type": CONTENT_BATCH, "accept": "application/msgpack"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("stored"), redis_server.url) as handle:
        yield handle


def batch(topic: str, queue_id: int, ids: list[str], tag: str = "Paid") -> bytes:
    b = BatchBuilder(topic, queue_id)
    for mid in ids:
        b.add(f"body {mid}".encode(), mid, tag=tag, keys=[f"k-{mid}"],
              properties={"color": "red"}, born_timestamp=1_767_225_600_000)
    return b.finish()


def test_a_batch_send_is_read_back_by_json_and_msgpack_pulls(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    resp = broker.http.post(f"/v1/topics/{topic}/messages", headers=BATCH_HEADERS,
                            content=batch(topic, 1, ["s1", "s2"]) + batch(topic, 0, ["s3"]))
    assert resp.status_code == 200, resp.text
    assert msgpack.unpackb(resp.content) == {"batches": [[1, 0, 2], [0, 0, 1]]}
    answer = broker.pull(topic, 1)
    assert [m["message_id"] for m in answer["messages"]] == ["s1", "s2"]
    first = answer["messages"][0]
    assert {k: first[k] for k in ("body", "body_encoding", "tag", "keys", "properties",
                                  "queue_offset", "born_timestamp_ms", "reconsume_times")} == {
        "body": "body s1", "body_encoding": "utf-8", "tag": "Paid", "keys": ["k-s1"],
        "properties": {"color": "red"}, "queue_offset": 0,
        "born_timestamp_ms": 1_767_225_600_000, "reconsume_times": 0}
    packed = broker.http.get(f"/v1/topics/{topic}/queues/0/messages",
                             headers={"accept": "application/msgpack"})
    (m,) = msgpack.unpackb(packed.content)["messages"]
    assert (m["message_id"], m["body"]) == ("s3", b"body s3")


def test_a_bad_batch_is_a_400_naming_record_and_field(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    raw = bytearray(batch(topic, 0, ["b1", "b2"]))
    raw[-1] ^= 0xFF
    resp = broker.http.post(f"/v1/topics/{topic}/messages", headers=BATCH_HEADERS,
                            content=bytes(raw))
    message = broker.error(resp, 400, "BAD_REQUEST")
    assert "batches[0].records[1].crc" in message
    assert broker.pull(topic, 0)["max_offset"] == 0
