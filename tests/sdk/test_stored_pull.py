"""The consumer's side of stored-form pulls (tidemq._broker_api): a ``stored`` answer decodes into
lazy messages (origin topics read only in retry and DLQ topics); a messages answer is read as
before; a broker refusing the multi-queue pull's ``form`` field is asked without it."""

from __future__ import annotations

from tidemq._broker_api import _pull_result
from tidemq.protocol import RETRY_TOPIC
from tidemq.protocol.records.stored import StoredMessage, append_group
from tidemq.protocol.records.v2 import BatchBuilder, fill


def blob(topic: str, first_offset: int, n: int) -> bytes:
    b = BatchBuilder(topic, 1)
    for i in range(n):
        b.add(f"body {i}".encode(), f"m{i}", tag="t", properties={RETRY_TOPIC: "Orders"})
    raw = bytearray(b.finish())
    fill(raw, 0, 4096, first_offset, 1_767_225_600_000, b"\0" * 8)
    s_at = 65 + len(topic.encode())
    records = []
    p = s_at
    while p < len(raw):
        size = int.from_bytes(raw[p:p + 4], "big")
        records.append(bytes(raw[p:p + size]))
        p += size
    out = bytearray()
    append_group(out, raw[:s_at], records)
    return bytes(out)


def test_a_stored_answer_decodes_into_lazy_messages() -> None:
    answer = {"stored": blob("%RETRY%g", 10, 3), "next_offset": 13, "min_offset": 0,
              "max_offset": 13}
    res = _pull_result(answer, "q", "%RETRY%g")
    assert [(m.message_id, m.queue_offset, m.topic) for m in res.messages] == [
        ("m0", 10, "%RETRY%g"), ("m1", 11, "%RETRY%g"), ("m2", 12, "%RETRY%g")]
    assert all(isinstance(m, StoredMessage) for m in res.messages)
    assert res.origin_topics == {10: "Orders", 11: "Orders", 12: "Orders"}
    assert res.messages[1].body == b"body 1" and res.messages[1].properties == {}
    plain = _pull_result({**answer, "stored": blob("Orders", 0, 2)}, "q", "Orders")
    assert plain.origin_topics == {} and plain.messages[0]._lazy  # nothing decoded yet
