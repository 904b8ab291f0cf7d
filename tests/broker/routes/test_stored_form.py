"""Record format v2 over HTTP against a real broker: a send of producer-made batches
(``application/x-tidemq-batch``), and pulls that answer with the stored bytes. JSON and
msgpack sends and pulls of the same messages stay as the contract says."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
from tidemq.protocol.records.stored import decode_stored
from tidemq.protocol.records.v2 import CONTENT_BATCH, BatchBuilder

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


def test_pulls_in_stored_form_carry_the_same_messages(broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=2)
    broker.http.post(f"/v1/topics/{topic}/messages", headers=BATCH_HEADERS,
                     content=batch(topic, 0, ["p1", "p2"]) + batch(topic, 1, ["p3"], tag="Other"))
    broker.send(topic, {"message_id": "p4", "body": "json", "tag": "Paid", "queue_id": 0})
    resp = broker.http.get(f"/v1/topics/{topic}/queues/0/messages",
                           params={"form": "stored", "offset": 1})
    assert resp.headers["content-type"] == "application/msgpack"
    answer = msgpack.unpackb(resp.content)
    assert (answer["next_offset"], answer["min_offset"], answer["max_offset"]) == (3, 0, 3)
    got = decode_stored(answer["stored"])
    want = broker.pull(topic, 0, offset=1)["messages"]
    assert [(m.message_id, m.body.decode(), m.tag, m.keys, m.properties, m.queue_offset,
             m.store_timestamp_ms) for m in got] == [
        (w["message_id"], w["body"], w["tag"], w["keys"], w["properties"], w["queue_offset"],
         w["store_timestamp_ms"]) for w in want]
    many = broker.http.post("/v1/pull", content=msgpack.packb({
        "queues": [{"topic": topic, "queue_id": 0, "offset": 0, "tags": "Paid"},
                   {"topic": topic, "queue_id": 1, "offset": 0, "tags": "Paid"}],
        "form": "stored"}), headers={"content-type": "application/msgpack"})
    entries = {e["queue_id"]: e for e in msgpack.unpackb(many.content)["queues"]}
    assert [m.message_id for m in decode_stored(entries[0]["stored"])] == ["p1", "p2", "p4"]
    assert entries[1]["stored"] == b"" and entries[1]["next_offset"] == 1  # tag skipped
    bad = broker.http.get(f"/v1/topics/{topic}/queues/0/messages", params={"form": "raw"})
    assert "form" in broker.error(bad, 400, "BAD_REQUEST")
