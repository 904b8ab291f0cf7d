"""The store's compiled twins (store/_cstore.pyx) against their references: the same index puts
write the same bytes (or raise the same error), the same lookups answer the same offsets, on
hypothesis-made keys, offsets, deltas and damaged chains, and an IndexFile answers alike; a
batch's consume-queue units pack alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tidemq.protocol.records.v2 import BatchBuilder
from tidemq.protocol.records.v2_read import validate

from tidemq_server.broker.store import consume_queue, index
from tidemq_server.broker.store.index import ENTRY_SIZE, HEADER_SIZE, IndexFile, unique_key
from tidemq_server.broker.store.records import v2_copy


def twin(compiled: Callable[..., Any], reference: Callable[..., Any]) -> pytest.MarkDecorator:
    """Skip a twin test where ``compiled`` is its ``reference`` (the extension is not built,
    or ``TIDEMQ_PURE_PYTHON=1``: ``make test-pure``); ``make test`` runs it."""
    return pytest.mark.skipif(compiled is reference,
                              reason="the compiled store twin is not built or is disabled")


compiled = twin(index.write_entry, index.write_entry_py)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOTS, ENTRIES = 7, 40
ENTRIES_AT = HEADER_SIZE + SLOTS * 4
SIZE = ENTRIES_AT + (ENTRIES + 1) * ENTRY_SIZE


def result(call: Callable[..., Any], *args: Any) -> Any:
    """What ``call(*args)`` answers, or its error as (type, message)."""
    try:
        return call(*args)
    except Exception as exc:
        return (type(exc), str(exc))


keys = st.text(max_size=12) | st.sampled_from(["U\0abc", "Orders\0k1", "\ud800", "é" * 5])
puts = st.lists(st.tuples(keys, st.integers(-(2**64), 2**64) | st.integers(0, 2**40),
                          st.integers(-(2**32), 2**32) | st.integers(0, 1000),
                          st.integers(-2, ENTRIES + 3)), max_size=30)


@compiled
@FUZZ
@given(ops=puts, junk=st.lists(st.tuples(st.integers(0, SIZE - 1), st.integers(0, 255)),
                                max_size=6),
       lows=st.lists(st.tuples(keys, st.integers(-5, 500), st.integers(-5, 2000)), max_size=8))
def test_puts_and_lookups_agree(ops: list[tuple[str, int, int, int]],
                                junk: list[tuple[int, int]],
                                lows: list[tuple[str, int, int]]) -> None:
    ref, got = bytearray(SIZE), bytearray(SIZE)
    for key, phys, delta, count in ops:
        a = result(index.write_entry_py, ref, ENTRIES_AT, SLOTS, count, key, phys, delta)
        b = result(index.write_entry, got, ENTRIES_AT, SLOTS, count, key, phys, delta)
        assert a == b
        assert got == ref
    for at, value in junk:  # damage: chains that loop, point forward or out of the file
        ref[at] = got[at] = value
    for key, low, high in lows + [(k, 0, 2000) for k, *_ in ops]:
        for count in (ENTRIES, 3, 2**40):
            assert result(index.find_entries, got, ENTRIES_AT, SLOTS, count, key, low,
                          high) == result(index.find_entries_py, ref, ENTRIES_AT, SLOTS, count,
                                          key, low, high)


batches = st.lists(st.tuples(st.lists(st.tuples(keys, st.integers(-(2**64), 2**64)
                                               | st.integers(0, 2**40)), max_size=8),
                             st.integers(-(2**32), 2**32) | st.integers(0, 1000),
                             st.integers(-2, ENTRIES + 3)), max_size=8)


@compiled
@FUZZ
@given(ops=batches, odd=st.sampled_from(["", "tuple", "short", "str_phys"]))
def test_batch_puts_write_what_one_by_one_puts_write(
        ops: list[tuple[list[tuple[str, int]], int, int]], odd: str) -> None:
    ref, got = bytearray(SIZE), bytearray(SIZE)
    for entries, delta, first in ops:
        ks: Any = [k for k, _ in entries]
        ps: Any = [p for _, p in entries]
        if odd == "tuple":
            ks = tuple(ks)
        elif odd == "short" and ps:
            ps = ps[:-1]
        elif odd == "str_phys" and ps:
            ps[0] = str(ps[0])
        a = result(index.write_entries_py, ref, ENTRIES_AT, SLOTS, first, ks, ps, delta)
        b = result(index.write_entries, got, ENTRIES_AT, SLOTS, first, ks, ps, delta)
        assert a == b
        assert got == ref


@compiled
def test_an_index_file_answers_alike_with_either_twin(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def fill(name: str) -> tuple[bytes, list[list[int]]]:
        f = IndexFile(tmp_path / name, 64, 500, 1_000)
        for i in range(400):
            f.put(unique_key(f"id{i % 150}"), i * 1024, 1_000 + i)
        found = [f.lookup(unique_key(f"id{i}"), 1_000 + i, 1_300) for i in range(160)]
        f.flush()
        raw = bytes(f.mm)
        f.close()
        return raw, found

    compiled_file = fill("00000000000000001000")
    monkeypatch.setattr(index, "write_entry", index.write_entry_py)
    monkeypatch.setattr(index, "find_entries", index.find_entries_py)
    reference = fill("00000000000000002000")
    assert compiled_file[1] == reference[1] and any(compiled_file[1])
    assert compiled_file[0][HEADER_SIZE:] == reference[0][HEADER_SIZE:]


i64 = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**64), 2**64) | st.integers(0, 2**40)


@twin(consume_queue.pack_units, consume_queue.pack_units_py)
@FUZZ
@given(base=i64, units=st.lists(st.tuples(st.integers(0, 2**31) | i64,
                                          st.integers(-(2**31), 2**31 - 1) | i64, i64),
                                max_size=20),
       odd=st.sampled_from(["", "short", "bool", "float"]))
def test_consume_queue_units_pack_alike(base: int, units: list[tuple[int, int, int]],
                                        odd: str) -> None:
    positions, sizes, codes = ([u[k] for u in units] for k in range(3))
    if odd == "short" and units:
        codes = codes[:-1]
    if odd == "bool":
        sizes = [*sizes, True]
        positions, codes = [*positions, 1], [*codes, False]
    got = result(consume_queue.pack_units, base, positions, sizes, codes)
    ref = result(consume_queue.pack_units_py, base, positions, sizes, codes)
    assert got == ref
    if odd == "float":
        half: Any = 0.5
        assert result(consume_queue.pack_units, half, positions, sizes, codes) == result(
            consume_queue.pack_units_py, half, positions, sizes, codes)


words = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)


@st.composite
def stored_records(draw: st.DrawFn) -> bytes:
    """A record as the log stores it, perhaps damaged (a byte changed, cut or grown)."""
    builder = BatchBuilder("T", 0)
    props = draw(st.dictionaries(words.filter(lambda w: "\x01" not in w and "\x02" not in w),
                                 words.filter(lambda w: "\x02" not in w), max_size=4))
    builder.add(draw(st.binary(max_size=40)), draw(words), tag=draw(st.none() | words),
                keys=draw(st.lists(words.filter(lambda w: w and "\x1f" not in w),
                                   max_size=3)),
                properties=props, born_timestamp=draw(i64.filter(lambda v: -(2**63) <= v
                                                                  < 2**63)))
    raw = builder.finish()
    s = validate(raw, 0, strict=False)
    rec = bytearray(raw[s.positions[0]:s.positions[0] + s.sizes[0]])
    damage = draw(st.sampled_from(["", "", "byte", "cut", "grow", "props"]))
    if damage == "byte" and rec:
        rec[draw(st.integers(0, len(rec) - 1))] = draw(st.integers(0, 255))
    elif damage == "cut":
        del rec[draw(st.integers(0, len(rec))):]
    elif damage == "grow":
        rec += draw(st.binary(min_size=1, max_size=3))
    elif damage == "props":  # a property list not ended by \x02, or invalid utf-8 in it
        rec[-1:] = b"\xff"
    return bytes(rec)


@twin(v2_copy.copy_record, v2_copy.copy_record_py)
@FUZZ
@given(src=stored_records(), drop_key=st.binary(max_size=3) | words.map(str.encode),
       drop=st.frozensets(st.sampled_from([b"", b"a", b"\xc3\xa9", b"TRAN_MSG"])
                          | words.map(str.encode), max_size=4),
       ordinal=st.integers(-1, 2**16) | st.integers(0, 5),
       prepared=i64, lead=st.binary(max_size=5))
def test_record_copies_are_written_alike(src: bytes, drop_key: bytes, drop: frozenset[bytes],
                                         ordinal: int, prepared: int, lead: bytes) -> None:
    ref, got = bytearray(lead), bytearray(lead)
    assert result(v2_copy.copy_record, got, ordinal, src, drop_key, drop, prepared) == \
        result(v2_copy.copy_record_py, ref, ordinal, src, drop_key, drop, prepared)
    assert got == ref


@twin(v2_copy.copy_record, v2_copy.copy_record_py)
def test_a_record_copy_with_odd_arguments_goes_to_the_reference() -> None:
    builder = BatchBuilder("T", 0)
    builder.add(b"body", "id", keys=["k", "tx"], properties={"a": "1", "b": "2"})
    raw = builder.finish()
    src = raw[validate(raw, 0).positions[0]:]
    calls: list[tuple[Any, ...]] = [  # not bytes, not a frozenset of bytes, not an int
        (bytearray(), 0, src, b"tx", frozenset({b"a"}), 5),
        (bytearray(), 0, bytearray(src), b"tx", frozenset({b"a"}), 5),
        (bytearray(), 0, src, "tx", frozenset({b"a"}), 5),
        (bytearray(), 0, src, b"tx", {b"a"}, 5),
        (bytearray(), 0, src, b"tx", frozenset({"a", b"b"}), 5),
        (bytearray(), 0.0, src, b"tx", frozenset(), 5),
        (b"", 0, src, b"tx", frozenset(), 5)]
    for args in calls:
        ref = [bytearray(args[0]) if isinstance(args[0], bytearray) else args[0], *args[1:]]
        assert result(v2_copy.copy_record, *args) == result(v2_copy.copy_record_py, *ref)
        assert args[0] == ref[0]
