"""The producer's batch encoder (tidemq._batch): messages as the SDK checked them become the
log's record format, which the broker's strict validation accepts as it is."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from tidemq._batch import QueueBatch, delay_of, encode_messages, encode_request, results_of
from tidemq._exceptions import UnexpectedResponseError
from tidemq._message import Message, SendResult, new_message_id, stored_result, to_outgoing
from tidemq.protocol import SHARDING_KEY, OutgoingMessage
from tidemq.protocol.records import _compiled, v2
from tidemq.protocol.records.v2 import CLIENT_PROPERTIES, BatchBuilder, DelayKind, tag_code
from tidemq.protocol.records.v2_read import BatchError, decode_record, split, validate


def test_sent_messages_become_records_the_broker_accepts() -> None:
    msgs = [to_outgoing(Message("hello", tag="Paid", keys=["order-42"],
                                properties={"region": "eu"})),
            to_outgoing(Message(b"\x00\xff", sharding_key="user-7")),
            to_outgoing(Message("later", delay_level=3)),
            to_outgoing(Message("at", deliver_at_ms=1_767_225_600_000)),
            to_outgoing(Message("in", delay_ms=90_000))]
    raw = encode_messages("Orders", 5, msgs, born_ms=1_700_000_000_000)
    s = validate(raw, allowed=CLIENT_PROPERTIES)
    assert (s.head.topic, s.head.queue_id, s.head.count) == ("Orders", 5, 5)
    assert s.message_ids == [m.message_id for m in msgs]
    assert s.tag_codes == [tag_code("Paid"), 0, 0, 0, 0]
    assert s.delayed == [2, 3, 4]
    recs = [decode_record(raw, p) for p in s.positions]
    assert (recs[0].body, recs[0].tag, recs[0].keys, recs[0].properties) == (
        b"hello", "Paid", ["order-42"], {"region": "eu"})
    assert recs[1].properties == {SHARDING_KEY: "user-7"} and recs[1].body == b"\x00\xff"
    assert [(r.delay_kind, r.delay_value) for r in recs[2:]] == [
        (DelayKind.LEVEL, 3), (DelayKind.DELIVER_AT_MS, 1_767_225_600_000),
        (DelayKind.DELAY_MS, 90_000)]
    assert {r.born_timestamp for r in recs} == {1_700_000_000_000}


def test_the_sharding_key_is_the_only_reserved_property_a_client_may_send() -> None:
    raw = encode_messages("Orders", 0, [to_outgoing(Message("x", sharding_key="k"))], 1)
    with pytest.raises(BatchError, match=r"records\[0\]\.properties: 'SHARDING_KEY'"):
        validate(raw)


def test_a_queue_batch_grows_as_messages_are_added() -> None:
    batch = QueueBatch("Orders", 1)
    empty = batch.nbytes
    first = to_outgoing(Message("a" * 100))
    batch.add(first, 5)
    assert batch.count == 1 and batch.nbytes > empty + 100
    batch.add(to_outgoing(Message("b")), 6)
    assert batch.messages[0] is first
    assert len(batch.finish()) == batch.nbytes
    with pytest.raises(ValueError, match="message_id"):
        QueueBatch("Orders", 1).add(OutgoingMessage(b"no id"), 1)


@pytest.mark.skipif(not _compiled.COMPILED, reason="the compiled record core is not built")
def test_the_producer_encodes_on_the_compiled_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled encoder hands what it cannot take to the pure reference; the producer's
    records (plain and delayed) must never be among them (a ``DelayKind`` member, an int
    subclass, once sent every record there)."""
    assert _compiled.core is not None
    fallbacks: list[int] = []

    def reference(*args: object) -> int:
        fallbacks.append(1)
        return v2.append_record_py(*args)  # type: ignore[arg-type]

    _compiled.core.use_writer(reference)
    try:
        msgs = [to_outgoing(Message("plain")), to_outgoing(Message("late", delay_level=2)),
                to_outgoing(Message("in", delay_ms=5)),
                to_outgoing(Message("at", tag="T", deliver_at_ms=9))]
        for m in msgs:
            m.queue_id = 0
        raw, _ = encode_request("Orders", msgs, born_ms=1)
        assert fallbacks == []
        # the spy does see what the compiled twin refuses (a float born stamp)
        with pytest.raises(v2.UnfitBatch):
            BatchBuilder("T", 0).add(b"x", "id", born_timestamp=1.5)  # type: ignore[arg-type]
        assert fallbacks == [1]
    finally:
        _compiled.core.use_writer(v2.append_record_py)
    kinds = [decode_record(raw, p).delay_kind for p in validate(raw).positions]
    assert kinds == [DelayKind.NONE, DelayKind.LEVEL, DelayKind.DELAY_MS,
                     DelayKind.DELIVER_AT_MS]


def test_delay_of_each_field() -> None:
    assert delay_of(OutgoingMessage(b"", "m")) == (DelayKind.NONE, 0)
    assert delay_of(OutgoingMessage(b"", "m", delay_level=18)) == (DelayKind.LEVEL, 18)
    assert delay_of(OutgoingMessage(b"", "m", delay_ms=0)) == (DelayKind.DELAY_MS, 0)


def test_a_request_holds_one_batch_per_queue_and_its_answer_maps_back() -> None:
    msgs = [to_outgoing(Message(f"m{i}")) for i in range(5)]
    for m, qid in zip(msgs, [2, 0, 2, 2, 0], strict=True):
        m.queue_id = qid
    raw, where = encode_request("Orders", msgs, born_ms=1)
    assert where == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1)]
    (a, n), (b, _) = split(raw)
    assert validate(raw, a, end=a + n).message_ids == [msgs[i].message_id for i in (0, 2, 3)]
    assert validate(raw, b).head.queue_id == 0
    results = results_of({"batches": [[2, 40, 3], [0, 7, 2]]}, "Orders", msgs, where)
    assert [(r.message_id, r.queue_id, r.queue_offset) for r in results] == [
        (msgs[0].message_id, 2, 40), (msgs[1].message_id, 0, 7), (msgs[2].message_id, 2, 41),
        (msgs[3].message_id, 2, 42), (msgs[4].message_id, 0, 8)]
    per_message = [{"message_id": msgs[i].message_id, "queue_id": msgs[i].queue_id,
                    "queue_offset": 100 + i} for i in (0, 2, 3, 1, 4)]  # record order
    again = results_of({"results": per_message}, "Orders", msgs, where)
    assert [r.queue_offset for r in again] == [100, 101, 102, 103, 104]
    assert [r.message_id for r in again] == [m.message_id for m in msgs]
    with pytest.raises(UnexpectedResponseError):
        results_of({"results": per_message[:2]}, "Orders", msgs, where)
    unplaced = to_outgoing(Message("x"))
    with pytest.raises(ValueError, match="queue_id"):
        encode_request("Orders", [unplaced], born_ms=1)


def test_a_batch_answer_makes_the_results_the_constructor_makes() -> None:
    """``results_of`` builds results without the frozen dataclass's ``__init__``: they must be
    the very objects ``SendResult(...)`` makes (equal, hashed alike, frozen, same repr)."""
    msgs = [to_outgoing(Message(f"m{i}")) for i in range(3)]
    for m, qid in zip(msgs, [1, 3, 1], strict=True):
        m.queue_id = qid
    _, where = encode_request("Orders", msgs, born_ms=1)
    got = results_of({"batches": [[1, 10, 2], [3, 0, 1]]}, "Orders", msgs, where, "g1")
    want = [SendResult(msgs[0].message_id or "", "Orders", 1, 10, broker_name="g1"),
            SendResult(msgs[1].message_id or "", "Orders", 3, 0, broker_name="g1"),
            SendResult(msgs[2].message_id or "", "Orders", 1, 11, broker_name="g1")]
    assert got == want and [hash(r) for r in got] == [hash(r) for r in want]
    assert [repr(r) for r in got] == [repr(r) for r in want]
    assert type(got[0]) is SendResult and dataclasses.asdict(got[0]) == dataclasses.asdict(want[0])
    assert not got[0].scheduled and got[0].state == "stored" and got[0].deliver_at_ms is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].queue_offset = 5  # type: ignore[misc]
    assert stored_result("i", "T", 0, 1, None) == SendResult("i", "T", 0, 1)
    with pytest.raises(UnexpectedResponseError):  # a batch the answer does not place
        results_of({"batches": [[1, 10, 2]]}, "Orders", msgs, where)
    assert results_of({"batches": []}, "Orders", [], []) == []


def test_message_ids_are_uuid4_hex() -> None:
    """``new_message_id`` keeps the ``uuid.uuid4().hex`` form however it is computed: 32
    lowercase hex digits, version 4, RFC 4122 variant, no repeats."""
    ids = [new_message_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for mid in ids[:200]:
        u = uuid.UUID(hex=mid)
        assert mid == u.hex and u.version == 4 and u.variant == uuid.RFC_4122
