"""Stored-form pull answers: the broker serves record bytes as the log holds them, the consumer
decodes them lazily.

Pure functions, no I/O. An answer's ``stored`` blob is a run of groups, one per batch the
answer touches::

    0   count      u32   records of this batch that follow
    4   header     the batch's header as stored (``batch`` layout: records_at bytes, the
                   broker part filled; its total_size is the stored batch's, not the group's)
        records    ``count`` records as stored (each starts with its own size)

A record's queue offset is the header's ``base_queue_offset`` + the record's ``ordinal``; its
store time, topic and queue come from the header. Tag filtering (by the consume queue's tag
code) picks which records of a batch a group carries, so a group may skip some.

``decode_stored`` checks each header's CRC and each record's CRC (the producer's, end to end)
and returns ``StoredMessage`` objects: a ``ReceivedMessage`` whose keys, properties and body are
decoded only when first read.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from typing import Any

from tidemq.protocol.message import ReceivedMessage
from tidemq.protocol.properties import RESERVED_PROPERTIES, RETRY_TOPIC
from tidemq.protocol.records._compiled import core
from tidemq.protocol.records.v2 import (
    CRC_AT,
    CRC_FROM,
    HEADER_FIXED,
    KEY_SEPARATOR,
    PLACE_AT,
    RECORD,
    RECORD_FIXED,
    decode_properties,
)
from tidemq.protocol.records.v2_read import BatchError, Buffer, read_head

GROUP = struct.Struct(">I")
BODY, REST = 1, 2  # a StoredMessage's lazy parts

# the base class's slots of the lazy fields (a subclass property reads and writes them)
_BODY, _KEYS, _PROPS, _ORIGIN = (ReceivedMessage.__dict__[name] for name in (
    "body", "keys", "properties", "origin_topic"))


def append_group(out: bytearray, head: Buffer, records: Iterable[Buffer]) -> int:
    """Append one group (a batch's stored ``head`` and some of its ``records``) to ``out``;
    returns how many records it holds."""
    at = len(out)
    out += b"\0\0\0\0"
    out += head
    n = 0
    for rec in records:
        out += rec
        n += 1
    GROUP.pack_into(out, at, n)
    return n


class StoredMessage(ReceivedMessage):
    """A received message over stored bytes: id, tag, offsets and times are read at once;
    ``keys``, ``properties`` (with ``origin_topic``) and ``body`` on first use."""

    __slots__ = ("_at", "_lazy", "_src")
    _src: Buffer | None  # the answer's bytes while a lazy field is not decoded yet
    _at: int  # where this message's record starts in them
    _lazy: int  # BODY | REST: the parts not decoded yet

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # dataclasses.replace and copies
        self._src = None
        self._at = 0
        self._lazy = 0
        super().__init__(*args, **kwargs)

    def _decode(self, part: int) -> None:
        """Decode ``part``: BODY (the body alone: what a handler reads) or REST (keys,
        properties, origin topic); the answer's bytes go once both are decoded."""
        src, p = self._src, self._at
        assert src is not None
        (size, _, _, _, _, _, _, _, _, _, _, id_len, tag_len, keys_len, props_len,
         body_len) = RECORD.unpack_from(src, p)
        self._lazy &= ~part
        if not self._lazy:
            self._src = None
        if part == BODY:
            _BODY.__set__(self, src[p + size - body_len:p + size])
            return
        c = p + RECORD_FIXED + id_len + tag_len
        d = c + keys_len
        view = memoryview(src)
        _KEYS.__set__(self, str(view[c:d], "utf-8").split(KEY_SEPARATOR) if keys_len else [])
        if props_len:
            props = decode_properties(view[d:d + props_len])
            _ORIGIN.__set__(self, props.get(RETRY_TOPIC) or None)
            if not props.keys().isdisjoint(RESERVED_PROPERTIES):
                props = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}
            _PROPS.__set__(self, props)
        else:
            _ORIGIN.__set__(self, None)
            _PROPS.__set__(self, {})

    # every lazy field: decoded on first read, and before a first write (so it is not undone)
    @property
    def body(self) -> bytes:
        if self._lazy & BODY:
            self._decode(BODY)
        return _BODY.__get__(self, StoredMessage)

    @body.setter
    def body(self, value: bytes) -> None:
        self._lazy &= ~BODY
        if not self._lazy:
            self._src = None
        _BODY.__set__(self, value)

    @property
    def keys(self) -> list[str]:
        if self._lazy & REST:
            self._decode(REST)
        return _KEYS.__get__(self, StoredMessage)

    @keys.setter
    def keys(self, value: list[str]) -> None:
        if self._lazy & REST:
            self._decode(REST)
        _KEYS.__set__(self, value)

    @property
    def properties(self) -> dict[str, str]:
        if self._lazy & REST:
            self._decode(REST)
        return _PROPS.__get__(self, StoredMessage)

    @properties.setter
    def properties(self, value: dict[str, str]) -> None:
        if self._lazy & REST:
            self._decode(REST)
        _PROPS.__set__(self, value)

    @property
    def origin_topic(self) -> str | None:
        if self._lazy & REST:
            self._decode(REST)
        return _ORIGIN.__get__(self, StoredMessage)

    @origin_topic.setter
    def origin_topic(self, value: str | None) -> None:
        if self._lazy & REST:
            self._decode(REST)
        _ORIGIN.__set__(self, value)


def decode_stored(blob: Buffer, *, verify: bool = True) -> list[StoredMessage]:
    """The messages of a stored-form answer, in order; BatchError naming the group and the
    record when the blob is not whole, well-formed groups (or a CRC fails, with ``verify``)."""
    if type(blob) is not bytes:
        blob = bytes(blob)  # a body is sliced from it: bytes, whatever the answer came as
    out: list[StoredMessage] = []
    new = object.__new__
    crc32 = zlib.crc32
    view = memoryview(blob)
    p, end = 0, len(blob)
    group = 0
    while p < end:
        if end - p < GROUP.size + HEADER_FIXED:
            raise BatchError("count", f"group {group}: {end - p} bytes left, a group needs at "
                             f"least {GROUP.size + HEADER_FIXED} (answer cut short?)")
        (count,) = GROUP.unpack_from(blob, p)
        h = p + GROUP.size
        head = read_head(blob, h, whole=False)  # the group holds the header, not the batch
        p = h + head.records_at
        base_q, store_ts, topic, qid = (head.base_queue_offset, head.store_timestamp,
                                        head.topic, head.queue_id)
        for k in range(count):
            if end - p < RECORD_FIXED:
                raise BatchError("size", f"group {group}: record {k} truncated", k)
            (size, _, ordinal, crc, _, reconsume, born, _, _, _, _, id_len, tag_len, keys_len,
             props_len, body_len) = RECORD.unpack_from(blob, p)
            if size > end - p or (RECORD_FIXED + id_len + tag_len + keys_len + props_len
                                  + body_len != size):
                raise BatchError("size", f"group {group}: {size} bytes disagree with the "
                                 "answer or the field lengths (truncated record)", k)
            if verify and crc32(view[p + CRC_FROM:p + size],
                                crc32(view[p + PLACE_AT:p + CRC_AT])) != crc:
                raise BatchError("crc", f"group {group}: the record's CRC does not match its "
                                 "bytes", k)
            a = p + RECORD_FIXED
            b = a + id_len
            try:
                mid = str(view[a:b], "utf-8")
                tag = str(view[b:b + tag_len], "utf-8") if tag_len else None
            except UnicodeDecodeError:
                raise BatchError("message_id", f"group {group}: not utf-8", k) from None
            m = new(StoredMessage)
            m._src = blob
            m._at = p
            m._lazy = BODY | REST
            m.message_id = mid
            m.topic = topic
            m.queue_id = qid
            m.queue_offset = base_q + ordinal
            m.tag = tag
            m.born_timestamp_ms = born
            m.store_timestamp_ms = store_ts
            m.reconsume_times = reconsume
            m.receipt_handle = None
            m.state = None
            m.failure = None
            out.append(m)
            p += size
        group += 1
    return out



decode_stored_py = decode_stored  # the reference (tests run it beside the compiled twin)
if core is not None:  # the compiled twin (_crecords.pyx), falling back on the reference
    core.use_stored(decode_stored_py, read_head, StoredMessage, BODY | REST)
    decode_stored = core.decode_stored
