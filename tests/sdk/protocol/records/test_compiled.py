"""The compiled record core (records/_crecords.pyx) against its pure-Python reference: on the
same inputs, hypothesis-fuzzed, both answer the same summary or bytes, or raise the same error
(type, message, record index, field, code). And the switch: TIDEMQ_PURE_PYTHON=1 runs the
reference, an unset one the compiled twin wherever the build had a compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tidemq.protocol.message import Limits
from tidemq.protocol.records import _compiled, stored, v2, v2_read
from tidemq.protocol.records.v2 import BatchBuilder, DelayKind, fill

from tests.sdk.protocol.records.test_v2_fuzz import batches, build

compiled = pytest.mark.skipif(not _compiled.COMPILED,
                              reason="the compiled record core is not built or is disabled")
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Spec = tuple[str, int, list[dict[str, Any]]]


def result(call: Callable[[], Any]) -> Any:
    """What a call answers, or its error as (type, message, index, field, code)."""
    try:
        return call()
    except Exception as exc:
        return (type(exc), str(exc), getattr(exc, "index", None), getattr(exc, "field", None),
                getattr(exc, "code", None))


def both_validate(buf: bytes | bytearray | memoryview, at: int = 0, **kw: Any) -> Any:
    """Validate ``buf`` with both twins; they must agree. Returns the common answer."""
    ref = result(lambda: v2_read.validate_py(buf, at, **kw))
    got = result(lambda: v2_read.validate(buf, at, **kw))
    assert got == ref
    return ref


def test_the_switch_follows_the_build_and_the_environment() -> None:
    """Built in place (or by pip) with gcc there, the compiled twin runs; the variable turns
    it off in a fresh interpreter."""
    if os.environ.get(_compiled.PURE_ENV, "") in ("", "0") and shutil.which("gcc"):
        assert _compiled.COMPILED, "gcc is here but the extension is not built: pip install -e ."
    probe = ("from tidemq.protocol.records import _compiled, v2, v2_read; "
             "print(_compiled.COMPILED, v2_read.validate is v2_read.validate_py, "
             "v2.append_record is v2.append_record_py)")
    env = {**os.environ, _compiled.PURE_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True", "True"]


@compiled
@FUZZ
@given(spec=batches, strict=st.booleans(), where=st.integers(0), mask=st.integers(0, 255),
       cut=st.integers(0, 40))
def test_validate_agrees_on_good_and_damaged_batches(spec: Spec, strict: bool, where: int,
                                                     mask: int, cut: int) -> None:
    raw = bytearray(build(spec))
    fill(raw, 0, 4096, 12, 1_767_225_600_000, b"\x7f\0\0\1\0\0\x27\x0f")
    both_validate(raw, strict=strict, offset=4096)
    both_validate(bytes(raw), strict=strict, offset=8192)  # the wrong offset
    raw[where % len(raw)] ^= mask  # mask 0: unchanged
    both_validate(raw, strict=strict)
    both_validate(raw[:len(raw) - cut], strict=strict)
    both_validate(memoryview(bytes(raw)), strict=strict)


@compiled
@FUZZ
@given(spec=batches, limits=st.builds(
    Limits, max_body_bytes=st.integers(0, 400), max_properties_bytes=st.integers(0, 60),
    max_batch_messages=st.integers(1, 9), max_batch_bytes=st.integers(0, 2000),
    max_message_id_chars=st.integers(1, 70), max_delay_level=st.integers(1, 18),
    max_delay_ms=st.integers(0, 10_000)),
    allowed=st.sampled_from([frozenset(), frozenset({"TIDE_X"})]))
def test_validate_agrees_on_every_limit(spec: Spec, limits: Limits,
                                        allowed: frozenset[str]) -> None:
    both_validate(build(spec), limits=limits, allowed=allowed)


@compiled
@FUZZ
@given(kind=st.integers(0, 5), value=st.integers(-(2**40), 2**40),
       mid=st.text(min_size=0, max_size=70), tag=st.none() | st.text(max_size=8),
       props=st.dictionaries(st.text(max_size=8) | st.sampled_from(
           ["TIDE_X", "TIDE_", "UNIQ_KEY", "TAGS", "KEYS", "region", "x\x01y"]),
           st.text(max_size=8), max_size=3),
       keys=st.lists(st.text(max_size=8) | st.sampled_from(["", "k" * 1024, "k" * 1025,
                                                            "é" * 600, "a\x1fb"]), max_size=3),
       tag_code=st.none() | st.integers(0, 2**33),
       at=st.integers(-80, 80), allowed=st.sampled_from([frozenset(), frozenset({"TIDE_X"})]))
def test_validate_agrees_on_what_a_strict_check_refuses(
        kind: int, value: int, mid: str, tag: str | None, props: dict[str, str],
        keys: list[str], tag_code: int | None, at: int, allowed: frozenset[str]) -> None:
    """Delays, ids, tags, keys and properties a client may not send (the encoder takes them),
    and batches read at odd places in a larger buffer."""
    b = BatchBuilder("Orders", 1)
    b.add(b"body", "ok1", tag="Paid", keys=["k1", "k2"], properties={"region": "eu"})
    b.add(b"x", mid, tag=tag, keys=keys, properties=props, delay_kind=kind, delay_value=value,
          code=tag_code)
    raw = b.finish()
    both_validate(raw)
    both_validate(raw, allowed=allowed, limits=Limits(max_properties_bytes=20))
    padded = bytes(80) + raw + bytes(16)
    both_validate(padded, 80 + at)
    both_validate(padded, 80, end=80 + len(raw))


@compiled
@FUZZ
@given(data=st.binary(max_size=400), strict=st.booleans(), at=st.integers(-8, 8))
def test_validate_agrees_on_random_bytes(data: bytes, strict: bool, at: int) -> None:
    both_validate(data, at, strict=strict)


ints = st.one_of(st.integers(-(2**64), 2**64), st.sampled_from(
    [0, 255, 256, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, True]))


@compiled
@FUZZ
@given(body=st.binary(max_size=200) | st.binary(max_size=20).map(bytearray),
       mid=st.text(max_size=40), tag=st.none() | st.text(max_size=10),
       keys=st.lists(st.text(max_size=10), max_size=3), fields=st.fixed_dictionaries({
           "born_timestamp": ints, "flag": ints, "reconsume_times": ints,
           "prepared_tx_offset": ints, "delay_value": ints,
           "delay_kind": st.integers(-2, 300)}), code=st.none() | ints)
def test_the_encoder_agrees_byte_for_byte_and_error_for_error(
        body: bytes, mid: str, tag: str | None, keys: list[str], fields: dict[str, Any],
        code: int | None) -> None:
    def encode() -> bytes:
        b = BatchBuilder("Orders", 3)
        b.add(b"first", "a1", born_timestamp=5)
        b.add(body, mid, tag=tag, keys=keys, code=code, **fields)
        return b.finish()

    got = result(encode)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(v2, "append_record", v2.append_record_py)
        ref = result(encode)
    assert got == ref


@compiled
def test_the_encoder_agrees_on_what_is_not_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    def encode(body: Any) -> Any:
        return result(lambda: BatchBuilder("T", 0).add(body, "id"))

    for odd in ("text", memoryview(b"view"), 3.5, None, b"x" * 70_000):
        got = encode(odd)
        with monkeypatch.context() as m:
            m.setattr(v2, "append_record", v2.append_record_py)
            assert encode(odd) == got
    half: Any = 0.5  # not an int: struct refuses it, and so must the compiled twin
    assert result(lambda: v2.append_record(bytearray(), 0, b"i", b"", b"", b"", b"", half, 0,
                                           0, 0, 0, 0, 0)) == result(
        lambda: v2.append_record_py(bytearray(), 0, b"i", b"", b"", b"", b"", half, 0, 0, 0, 0,
                                    0, 0))


@compiled
def test_a_delayed_batch_summary_is_the_same() -> None:
    b = BatchBuilder("Orders", 2)
    for i in range(5):
        b.add(b"b" * i, f"id{i}", tag="Paid" if i % 2 else None, keys=["k1", "k2"],
              properties={"region": "eu"}, delay_kind=DelayKind.LEVEL, delay_value=i + 1)
    s = both_validate(b.finish())
    assert s.delayed == [0, 1, 2, 3, 4] and s.keys[0] == "k1\x1fk2"


def seen(messages: Any) -> Any:
    """What a consumer sees of each decoded message (lazy parts read), or the error as is."""
    if not isinstance(messages, list):
        return messages
    return [(m.message_id, m.topic, m.queue_id, m.queue_offset, m.tag, m.born_timestamp_ms,
             m.store_timestamp_ms, m.reconsume_times, m.receipt_handle, m.state, m.failure,
             # decoded on first read: unverified damaged bytes may fail there, alike
             *(result(lambda m=m, name=name: getattr(m, name))  # type: ignore[misc]
               for name in ("body", "keys", "properties", "origin_topic")))
            for m in messages]


def both_decode(blob: bytes | bytearray, verify: bool = True) -> Any:
    ref = result(lambda: stored.decode_stored_py(blob, verify=verify))
    got = result(lambda: stored.decode_stored(blob, verify=verify))
    assert seen(got) == seen(ref)
    return ref


@compiled
@FUZZ
@given(specs=st.lists(batches, min_size=1, max_size=3), picks=st.lists(st.booleans()),
       verify=st.booleans(), where=st.integers(0), mask=st.integers(0, 255),
       cut=st.integers(0, 30))
def test_the_stored_decoder_agrees(specs: list[Spec], picks: list[bool], verify: bool,
                                   where: int, mask: int, cut: int) -> None:
    """Answers of several groups, some records left out (as tag filtering does), then a byte
    changed or the answer cut."""
    blob = bytearray()
    for n, spec in enumerate(specs):
        raw = bytearray(build(spec))
        fill(raw, 0, 4096 * n, 100 * n, 1_767_225_600_000 + n, bytes(8))
        s = v2_read.validate_py(raw, strict=False)
        keep = [(p, z) for i, (p, z) in enumerate(zip(s.positions, s.sizes, strict=True))
                if i >= len(picks) or picks[i]]
        stored.append_group(blob, raw[:s.head.records_at], [raw[p:p + z] for p, z in keep])
    both_decode(bytes(blob), verify)
    blob[where % len(blob)] ^= mask
    both_decode(blob, verify)
    both_decode(bytes(blob[:len(blob) - cut]), verify)


@compiled
@FUZZ
@given(data=st.binary(max_size=300), verify=st.booleans())
def test_the_stored_decoder_agrees_on_random_bytes(data: bytes, verify: bool) -> None:
    both_decode(data, verify)
    both_decode(b"\0\0\0\1" + data, verify)
