"""The hot transaction writes' batches (``transactions/batches.py``) are byte for byte what the
record-by-record path writes (``commit_copy`` / ``event_record`` + ``encode_records``), with the
same summaries, grouped and cut alike: a commit copy written from its half's stored bytes
(``v2_copy``), on hypothesis-made halves, and the events of a request."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tidemq.protocol import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    TRANSACTION_ID,
    EventKind,
    EventSource,
)
from tidemq.protocol.records.v2 import BatchBuilder
from tidemq.protocol.records.v2_read import decode_record, validate

from tidemq_server.broker.ingest.halves import BatchHalf, check_half_record
from tidemq_server.broker.store.records.v2_copy import CopyBatch, copy_record_py
from tidemq_server.broker.store.records.v2_own import encode_records
from tidemq_server.broker.store.types import tag_code
from tidemq_server.broker.transactions.batches import CommitCopies, EventBatches
from tidemq_server.broker.transactions.model import (
    HALF_ONLY_NAMES,
    HALF_TOPIC,
    TxInfo,
    commit_copy,
    event_record,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
text = st.text(st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=12)


def half_batch(txid: str, qid: int, tag: str | None, keys: list[str], extra: dict[str, str],
               body: bytes, immunity: str | None = None) -> bytes:
    props = {TRAN_MSG: "true", PGROUP: "G", REAL_TOPIC: "Orders", REAL_QID: str(qid),
             TRANSACTION_ID: txid, **extra}
    if immunity is not None:
        props[CHECK_IMMUNITY_TIME_IN_SECONDS] = immunity
    builder = BatchBuilder(HALF_TOPIC, 0)
    builder.add(body, "M1", tag=tag, keys=[*keys, txid], properties=props, born_timestamp=77,
                flag=3)
    return builder.finish()


def half_of(raw: bytes, host: str = "10.0.0.9:4242") -> BatchHalf:
    s = validate(raw, 0, strict=False)
    half = check_half_record(raw, 0, 0, s.positions[0], "G", "Orders", 8, s.message_ids[0],
                             s.keys[0])
    half.host = host
    return half


def info(txid: str, first: int = 4096) -> TxInfo:
    return TxInfo(txid, "M1", "G", "Orders", first, first, 0, 0, 1)


def old_path(halves: list[tuple[BatchHalf, TxInfo]], max_bytes: int = 1 << 20) -> list:
    records = [commit_copy(h.record(), i, tag_code(h.properties.get(TAGS))) for h, i in halves]
    return encode_records(records, max_bytes)[0]


@FUZZ
@given(tag=st.none() | text, keys=st.lists(text.filter(lambda k: "\x1f" not in k),
                                           max_size=3),
       extra=st.dictionaries(st.sampled_from(["a", "app", "é", "x-y"]), text, max_size=3),
       body=st.binary(max_size=300), qid=st.integers(0, 7),
       immunity=st.none() | st.sampled_from(["0", "12.5"]))
def test_a_copy_is_the_record_the_encoder_writes(tag: str | None, keys: list[str],
                                                 extra: dict[str, str], body: bytes, qid: int,
                                                 immunity: str | None) -> None:
    txid = "tx-1"
    half = half_of(half_batch(txid, qid, tag, keys, extra, body, immunity))
    assert half.distinct
    copies = CommitCopies(1 << 20)
    copies.add(half, info(txid))
    [got] = copies.batches()
    [want] = old_path([(half, info(txid))])
    assert got.raw == want.raw
    assert got.summary == want.summary
    assert got.born_host == want.born_host
    rec = decode_record(got.raw, got.summary.positions[0])
    assert rec.keys == keys and rec.prepared_tx_offset == 4096 and rec.flag == 0
    assert TRANSACTION_ID in rec.properties and REAL_QID not in rec.properties


def test_copies_share_batches_by_queue_and_host_and_are_cut_as_the_encoder_cuts() -> None:
    halves = [(half_of(half_batch(f"t{i}", i % 2, "red", ["k"], {}, b"b" * 400),
                       host=f"10.0.0.{i % 3}:1"), info(f"t{i}", 100 * i)) for i in range(12)]
    copies = CommitCopies(3000)
    for h, i in halves:
        copies.add(h, i)
    got = copies.batches()
    want = old_path(halves, 3000)
    assert sorted(b.raw for b in got) == sorted(b.raw for b in want)
    assert not copies and copies.batches() == []


class Pairs(dict[str, str]):
    """Properties as pairs, a name perhaps twice (what a producer's bytes may hold)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs

    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]
        return self.pairs

    def __len__(self) -> int:
        return len(self.pairs)


def test_a_half_with_a_property_twice_is_not_copied_from_its_bytes() -> None:
    pairs = [(TRAN_MSG, "true"), (PGROUP, "G"), (REAL_TOPIC, "Orders"), (REAL_QID, "1"),
             (TRANSACTION_ID, "t"), ("app", "a"), ("app", "b")]
    builder = BatchBuilder(HALF_TOPIC, 0)
    builder.add(b"x", "M1", keys=["t"], properties=Pairs(pairs))
    half = half_of(builder.finish())
    assert half.properties["app"] == "b"  # as every reader decodes it
    assert not half.distinct and not CommitCopies.takes(half)  # the encoder writes "app" once
    assert CommitCopies.takes(half_of(half_batch("t", 1, None, [], {"app": "a"}, b"x")))
    assert not CommitCopies.takes(half.record())


@pytest.mark.parametrize("src", [b"", b"\0" * 66, b"\0" * 67, b"\0\0\0\x50" + b"\0" * 63])
def test_bytes_that_are_not_one_record_are_refused(src: bytes) -> None:
    buf = bytearray(b"head")
    with pytest.raises(ValueError):
        copy_record_py(buf, 0, src, b"", HALF_ONLY_NAMES, 0)
    assert buf == b"head"


def test_an_empty_copy_batch_is_unfit() -> None:
    from tidemq.protocol.records.v2 import UnfitBatch
    with pytest.raises(UnfitBatch):
        CopyBatch("Orders", 0, 8, b"\0" * 8).finish()


@pytest.mark.parametrize("max_bytes", [1 << 20, 2000])
def test_events_are_the_records_the_encoder_writes(max_bytes: int) -> None:
    kinds = [EventKind.HALF, EventKind.COMMIT, EventKind.ROLLBACK, EventKind.UNKNOWN]
    made = [(kinds[i % 4], EventSource.CHECK if i % 3 else EventSource.PRODUCER,
             TxInfo(f"tx{i}", f"m{i}", "Gé", "Orders", i, i, 0, i % 2, 1000 + i), 5000 + i)
            for i in range(15)]
    events = EventBatches(max_bytes)
    for kind, source, i, ts in made:
        events.add(kind, source, i, ts)
    assert len(events) == 15 and events.kinds == {"half": 4, "commit": 4, "rollback": 4,
                                                  "unknown": 3}
    got = events.batches()
    want = encode_records([event_record(*m) for m in made], max_bytes)[0]
    assert len(got) == len(want) and (len(got) > 1) == (max_bytes < 4000)
    for g, w in zip(got, want, strict=True):
        assert (g.raw, g.summary, g.born_host) == (w.raw, w.summary, w.born_host)
    assert events.batches() == []
