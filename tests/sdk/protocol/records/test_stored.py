"""Stored-form pull answers (tidemq.protocol.records.stored): groups of stored records become
ReceivedMessages whose keys, properties and body are decoded only when first read."""

from __future__ import annotations

import dataclasses

import pytest
from tidemq.protocol import ReceivedMessage
from tidemq.protocol.records.stored import BODY, REST, StoredMessage, append_group, decode_stored
from tidemq.protocol.records.v2 import BatchBuilder, fill
from tidemq.protocol.records.v2_read import BatchError, validate


def stored_batch(topic: str, queue_id: int, base_q: int, n: int, store_ms: int) -> bytearray:
    b = BatchBuilder(topic, queue_id)
    for i in range(n):
        b.add(f"body-{i}".encode(), f"id-{base_q + i}", tag="even" if i % 2 == 0 else "odd",
              keys=[f"k{i}"], properties={"n": str(i), "RETRY_TOPIC": "Orders"} if i == 1 else
              {"n": str(i)}, born_timestamp=1000 + i, reconsume_times=i)
    raw = bytearray(b.finish())
    fill(raw, 0, 65_536, base_q, store_ms, b"\0" * 8)
    return raw


def group_of(raw: bytearray, pick: list[int]) -> bytes:
    s = validate(raw, strict=False)
    out = bytearray()
    append_group(out, raw[:s.head.records_at],
                 [raw[s.positions[i]:s.positions[i] + s.sizes[i]] for i in pick])
    return bytes(out)


def test_groups_carry_offsets_and_times_from_their_headers() -> None:
    a = stored_batch("Orders", 2, 100, 4, 5_000)
    b = stored_batch("Orders", 2, 104, 2, 6_000)
    msgs = decode_stored(group_of(a, [0, 2, 3]) + group_of(b, [1]))
    assert [(m.message_id, m.queue_offset, m.store_timestamp_ms) for m in msgs] == [
        ("id-100", 100, 5_000), ("id-102", 102, 5_000), ("id-103", 103, 5_000),
        ("id-105", 105, 6_000)]
    assert {(m.topic, m.queue_id) for m in msgs} == {("Orders", 2)}
    assert [m.tag for m in msgs] == ["even", "even", "odd", "odd"]
    assert [(m.born_timestamp_ms, m.reconsume_times) for m in msgs] == [
        (1000, 0), (1002, 2), (1003, 3), (1001, 1)]
    assert all(isinstance(m, ReceivedMessage) for m in msgs)


def test_keys_properties_and_body_wait_until_read() -> None:
    m, other = decode_stored(group_of(stored_batch("Orders", 0, 0, 2, 1), [1, 0]))
    assert m._lazy == BODY | REST and m._src is not None  # nothing lazy decoded yet
    assert m.body == b"body-1"
    assert m._lazy == REST and m._src is not None  # the body alone (what a handler reads)
    assert (m.keys, m.properties, m.origin_topic) == (["k1"], {"n": "1"}, "Orders")
    assert m._lazy == 0 and m._src is None  # all decoded: the answer's bytes may go
    assert other.origin_topic is None and other._lazy == BODY
    assert other.body == b"body-0" and other._src is None


def test_a_stored_message_equals_its_wire_form_field_for_field() -> None:
    (m,) = decode_stored(group_of(stored_batch("Orders", 1, 7, 1, 9), [0]))
    wire = ReceivedMessage.from_wire({
        "message_id": "id-7", "topic": "Orders", "queue_id": 1, "queue_offset": 7,
        "body": b"body-0", "tag": "even", "keys": ["k0"], "properties": {"n": "0"},
        "born_timestamp_ms": 1000, "store_timestamp_ms": 9, "reconsume_times": 0})
    assert dataclasses.asdict(m) == dataclasses.asdict(wire)


def test_fields_set_by_hand_win_and_copies_work() -> None:
    (m,) = decode_stored(group_of(stored_batch("Orders", 1, 7, 1, 9), [0]))
    m.body = b"replaced"
    m.receipt_handle = "h-1"
    assert (m.body, m.keys) == (b"replaced", ["k0"])
    copy = dataclasses.replace(m, topic="Other")
    assert isinstance(copy, StoredMessage)
    assert (copy.topic, copy.body, copy.keys, copy.receipt_handle) == (
        "Other", b"replaced", ["k0"], "h-1")


def test_a_corrupt_record_is_refused_naming_group_and_record() -> None:
    blob = bytearray(group_of(stored_batch("Orders", 0, 0, 3, 1), [0, 1, 2]))
    blob[-1] ^= 0x20  # record 2's last body byte
    with pytest.raises(BatchError, match=r"records\[2\]\.crc: group 0") as exc:
        decode_stored(bytes(blob))
    assert exc.value.index == 2
    assert decode_stored(bytes(blob), verify=False)[2].body == b"body-2"[:-1] + b"\x12"


def test_an_answer_cut_short_is_refused() -> None:
    blob = group_of(stored_batch("Orders", 0, 0, 3, 1), [0, 1, 2])
    for cut in (3, 40, len(blob) - 1):
        with pytest.raises(BatchError):
            decode_stored(blob[:cut])
    assert decode_stored(b"") == []
