"""Fuzzing the v2 decoders (hypothesis): whatever the bytes, a reader answers a summary or a
BatchError — never another exception — and a damaged batch (a changed byte, a torn write, a
cut) is never taken for a good one."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tidemq.protocol.records.stored import append_group, decode_stored
from tidemq.protocol.records.v2 import BatchBuilder, fill
from tidemq.protocol.records.v2_read import BatchError, decode_record, split, validate
from tidemq.protocol.tags import tag_problem

text = st.text(st.characters(blacklist_characters="\x00\x01\x02\x1f",
                             blacklist_categories=["Cs"]), min_size=1, max_size=12)
records = st.fixed_dictionaries({
    "body": st.binary(max_size=300),
    "message_id": st.text("0123456789abcdef-", min_size=1, max_size=64),
    "tag": st.none() | text.filter(lambda t: tag_problem(t) is None),  # one a client may send
    "keys": st.lists(text, max_size=3),
    "properties": st.dictionaries(text.filter(lambda k: k.isalpha() and k.islower()), text,
                                  max_size=3),
    "born_timestamp": st.integers(0, 2**62),
    "flag": st.integers(-(2**31), 2**31 - 1),
})
batches = st.tuples(st.sampled_from(["Orders", "%RETRY%g", "Tópico"]), st.integers(0, 1023),
                    st.lists(records, min_size=1, max_size=8))
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(spec: tuple[str, int, list[dict[str, Any]]]) -> bytes:
    topic, queue_id, recs = spec
    b = BatchBuilder(topic, queue_id)
    for r in recs:
        b.add(**r)
    return b.finish()


def outcome(buf: bytes | bytearray, **kw: Any) -> Any:
    """The summary, or the BatchError; any other exception fails the test."""
    try:
        return validate(buf, **kw)
    except BatchError as exc:
        return exc


@FUZZ
@given(spec=batches)
def test_every_record_round_trips(spec: tuple[str, int, list[dict[str, Any]]]) -> None:
    raw = build(spec)
    s = validate(raw)
    assert (s.head.topic, s.head.queue_id, s.head.count) == (spec[0], spec[1], len(spec[2]))
    for p, want in zip(s.positions, spec[2], strict=True):
        got = decode_record(raw, p)
        assert (got.body, got.message_id, got.tag, got.keys, got.properties) == (
            want["body"], want["message_id"], want["tag"], want["keys"], want["properties"])
        assert (got.born_timestamp, got.flag) == (want["born_timestamp"], want["flag"])


@FUZZ
@given(spec=batches, where=st.integers(0), mask=st.integers(1, 255))
def test_any_changed_byte_is_detected(spec: tuple[str, int, list[dict[str, Any]]], where: int,
                                      mask: int) -> None:
    raw = bytearray(build(spec))
    fill(raw, 0, 4096, 12, 1_767_225_600_000, b"\x7f\0\0\1\0\0\x27\x0f")
    raw[where % len(raw)] ^= mask
    assert isinstance(outcome(raw, strict=False, offset=4096), BatchError)


@FUZZ
@given(spec=batches, keep=st.integers(0), tail=st.sampled_from(["zeros", "cut", "junk"]),
       junk=st.binary(min_size=1, max_size=64))
def test_a_torn_write_is_never_taken_for_a_batch(spec: tuple[str, int, list[dict[str, Any]]],
                                                 keep: int, tail: str, junk: bytes) -> None:
    raw = build(spec)
    keep %= len(raw)  # a proper prefix was written
    torn = {"zeros": raw[:keep] + bytes(len(raw) - keep),
            "junk": raw[:keep] + (junk * len(raw))[:len(raw) - keep],
            "cut": raw[:keep]}[tail]
    if torn == raw:  # the lost bytes happened to equal what was already there
        return
    assert isinstance(outcome(torn), BatchError)
    try:
        split(torn)
    except BatchError:
        pass


@FUZZ
@given(data=st.binary(max_size=400), strict=st.booleans())
def test_random_bytes_only_ever_raise_batch_error(data: bytes, strict: bool) -> None:
    outcome(data, strict=strict)
    for call in (lambda: split(data), lambda: decode_record(data, 0),
                 lambda: decode_stored(data)):
        try:
            call()
        except BatchError:
            pass


@FUZZ
@given(spec=batches, where=st.integers(0), mask=st.integers(1, 255))
def test_a_damaged_pull_answer_is_refused(spec: tuple[str, int, list[dict[str, Any]]],
                                          where: int, mask: int) -> None:
    raw = bytearray(build(spec))
    fill(raw, 0, 0, 0, 1, b"\0" * 8)
    s = validate(raw, strict=False)
    blob = bytearray()
    append_group(blob, raw[:s.head.records_at],
                 [raw[p:p + n] for p, n in zip(s.positions, s.sizes, strict=True)])
    assert [m.body for m in decode_stored(bytes(blob))] == [r["body"] for r in spec[2]]
    at = where % len(blob)
    blob[at] ^= mask
    try:
        got = decode_stored(bytes(blob))
    except BatchError:
        return
    raise AssertionError(f"byte {at} changed, yet decoded: {got}")
