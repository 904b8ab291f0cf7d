"""Pure parts of the gRPC front door: message conversions, settings, status mapping."""

from __future__ import annotations

import gzip
import hashlib

import pytest
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.broker.grpc.errors import RpcRefused, error_status
from tidemq_server.broker.grpc.messages import inbound, md5_hex, outbound
from tidemq_server.broker.grpc.proto import ClientType, Code, MessageType, pb, timestamp_ms
from tidemq_server.broker.grpc.sessions import ServerSide, Sessions, server_settings
from tidemq_server.broker.store.types import StoredRecord, SysFlag

LIMIT = 4 * 1024 * 1024


def proto_message(kind: int = MessageType.NORMAL, **sp: object) -> object:
    msg = pb.Message(body=b"hello")
    msg.topic.name = "T"
    msg.user_properties["k"] = "v"
    msg.system_properties.message_id = "id-1"
    msg.system_properties.message_type = kind
    for name, value in sp.items():
        if name == "delivery_seconds":
            msg.system_properties.delivery_timestamp.seconds = value
        elif name == "keys":
            msg.system_properties.keys.extend(value)
        else:
            setattr(msg.system_properties, name, value)
    return msg


def test_inbound_normal_message_becomes_the_api_message() -> None:
    item = inbound(proto_message(tag="TagA", keys=["a", "b"]), LIMIT)
    assert item.topic == "T" and item.kind == MessageType.NORMAL
    assert item.wire == {"message_id": "id-1", "body": b"hello", "tag": "TagA",
                         "keys": ["a", "b"], "properties": {"k": "v"}}


def test_message_group_is_the_sharding_key_and_delivery_time_the_due_time() -> None:
    fifo = inbound(proto_message(MessageType.FIFO, message_group="order-7"), LIMIT)
    assert fifo.wire["sharding_key"] == "order-7"
    delayed = inbound(proto_message(MessageType.DELAY, delivery_seconds=1_800_000_000), LIMIT)
    assert delayed.wire["deliver_at_ms"] == 1_800_000_000_000
    # the official Python client puts milliseconds into the seconds field: read them as ms
    buggy = inbound(proto_message(MessageType.DELAY, delivery_seconds=1_800_000_000_123), LIMIT)
    assert buggy.wire["deliver_at_ms"] == 1_800_000_000_123


@pytest.mark.parametrize(("kind", "fields", "code"), [
    (MessageType.FIFO, {}, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (MessageType.DELAY, {}, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (MessageType.NORMAL, {"delivery_seconds": 1_800_000_000},
     Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (MessageType.LITE, {}, Code.UNSUPPORTED),
    (MessageType.NORMAL, {"message_id": ""}, Code.ILLEGAL_MESSAGE_ID),
])
def test_inbound_refuses_messages_that_contradict_their_type(
        kind: int, fields: dict[str, object], code: int) -> None:
    with pytest.raises(RpcRefused) as caught:
        inbound(proto_message(kind, **fields), LIMIT)
    assert caught.value.code == code


def test_gzip_bodies_are_stored_inflated_within_the_limit() -> None:
    msg = proto_message(body_encoding=pb.Encoding.GZIP)
    msg.body = gzip.compress(b"x" * 1000)  # type: ignore[attr-defined]
    assert inbound(msg, LIMIT).wire["body"] == b"x" * 1000
    with pytest.raises(RpcRefused) as caught:
        inbound(msg, 999)
    assert caught.value.code == Code.MESSAGE_BODY_TOO_LARGE


def record(**props: str) -> StoredRecord:
    return StoredRecord(physical_offset=0, size=0, topic="T", queue_id=2, queue_offset=9,
                        body=b"\x00\xffbody", properties={"UNIQ_KEY": "id-9", **props}, flag=0,
                        sys_flag=0, born_timestamp=1_700_000_000_123, born_host="10.0.0.1:5000",
                        store_timestamp=1_700_000_000_456, store_host="127.0.0.1:10911",
                        reconsume_times=0, prepared_tx_offset=0)


def test_outbound_carries_what_the_clients_read() -> None:
    rec = record(TAGS="TagA", KEYS="a\x1fb", SHARDING_KEY="g", user="u")
    msg = outbound(rec, receipt_handle="h", delivery_attempt=2, invisible_ms=1500)
    sp = msg.system_properties
    assert (sp.message_id, sp.tag, list(sp.keys), sp.message_group) == ("id-9", "TagA",
                                                                          ["a", "b"], "g")
    assert sp.message_type == MessageType.FIFO and dict(msg.user_properties) == {"user": "u"}
    assert sp.body_digest.type == pb.DigestType.MD5
    assert sp.body_digest.checksum == hashlib.md5(rec.body).hexdigest().upper() == md5_hex(
        rec.body)
    assert (sp.queue_id, sp.queue_offset, sp.receipt_handle, sp.delivery_attempt) == (
        2, 9, "h", 2)
    assert timestamp_ms(sp.born_timestamp) == rec.born_timestamp and sp.born_host == "10.0.0.1"
    assert sp.invisible_duration.seconds == 1 and sp.invisible_duration.nanos == 500_000_000
    committed = record()
    committed.sys_flag = int(SysFlag.COMMIT)
    assert outbound(committed).system_properties.message_type == MessageType.TRANSACTION


def test_server_settings_complete_what_the_client_reported() -> None:
    side = ServerSide(max_body_bytes=4 * 1024 * 1024, max_reconsume_times=16,
                      long_polling_ms=20_000)
    producer = pb.Settings(client_type=ClientType.PRODUCER)
    producer.publishing.topics.add(name="T")
    answer = server_settings(producer, side)
    assert answer.publishing.max_body_size == 4 * 1024 * 1024  # never 0: sends would all fail
    assert [t.name for t in answer.publishing.topics] == ["T"]
    assert answer.backoff_policy.max_attempts == 3
    consumer = pb.Settings(client_type=ClientType.PUSH_CONSUMER)
    consumer.subscription.group.name = "G"
    answer = server_settings(consumer, side)
    assert answer.subscription.long_polling_timeout.seconds == 20
    assert answer.backoff_policy.max_attempts == 17
    assert answer.backoff_policy.customized_backoff.next[0].seconds == 10

    sessions = Sessions(expiry_s=60)
    session = sessions.touch("c1")
    sessions.apply_settings(session, producer)
    assert session.is_producer and session.topics == ("T",) and sessions.get("c1") is session


def test_error_status_maps_tidemq_codes_to_rocketmq_codes() -> None:
    status = error_status(ProtocolError(ErrorCode.TOPIC_NOT_FOUND, "no topic X"), "Send")
    assert status.code == Code.TOPIC_NOT_FOUND and "no topic X" in status.message
    assert error_status(ProtocolError(ErrorCode.BROKER_BUSY, "busy"), "Send").code == \
        Code.TOO_MANY_REQUESTS
    assert error_status(ValueError("boom"), "Send").code == Code.INTERNAL_SERVER_ERROR
