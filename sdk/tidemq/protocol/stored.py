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

from tidemq.protocol.batch import (
    CRC_AT,
    CRC_FROM,
    HEADER_FIXED,
    KEY_SEPARATOR,
    PLACE_AT,
    RECORD,
    RECORD_FIXED,
    decode_properties,
)
from tidemq.protocol.batch_read import BatchError, Buffer, read_head
from tidemq.protocol.message import ReceivedMessage
from tidemq.protocol.properties import RESERVED_PROPERTIES, RETRY_TOPIC

GROUP = struct.Struct(">I")

_SLOTS = {name: ReceivedMessage.__dict__[name] for name in (
    "message_id", "topic", "queue_id", "queue_offset", "body", "tag", "keys", "properties",
    "born_timestamp_ms", "store_timestamp_ms", "reconsume_times", "receipt_handle", "state",
    "origin_topic")}
_BODY, _KEYS, _PROPS, _ORIGIN = (_SLOTS["body"], _SLOTS["keys"], _SLOTS["properties"],
                                 _SLOTS["origin_topic"])


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

    __slots__ = ("_at", "_src")
    _src: Buffer | None  # the answer's bytes until every lazy field is decoded
    _at: int  # where this message's record starts in them

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # dataclasses.replace and copies
        self._src = None
        self._at = 0
        super().__init__(*args, **kwargs)

    def _field(self, slot: Any) -> Any:  # the slot's value, decoded on first use
        try:
            return slot.__get__(self, StoredMessage)
        except AttributeError:
            self._decode_rest()
            return slot.__get__(self, StoredMessage)

    def _decode_rest(self) -> None:
        src, p = self._src, self._at
        assert src is not None  # every lazy slot is set once the bytes are let go
        (size, _, _, _, _, _, _, _, _, _, _, id_len, tag_len, keys_len, props_len,
         _) = RECORD.unpack_from(src, p)
        c = p + RECORD_FIXED + id_len + tag_len
        d = c + keys_len
        e = d + props_len
        view = memoryview(src)
        raw_keys = str(view[c:d], "utf-8")
        props = decode_properties(view[d:e])
        origin = props.get(RETRY_TOPIC) or None
        if props and not props.keys().isdisjoint(RESERVED_PROPERTIES):
            props = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}
        for slot, value in ((_KEYS, raw_keys.split(KEY_SEPARATOR) if raw_keys else []),
                            (_PROPS, props), (_ORIGIN, origin),
                            (_BODY, bytes(view[e:p + size]))):
            try:
                slot.__get__(self, StoredMessage)
            except AttributeError:  # not set by hand meanwhile
                slot.__set__(self, value)
        self._src = None  # every lazy field is decoded: the answer's bytes may go

    @property
    def body(self) -> bytes:
        return self._field(_BODY)

    @body.setter
    def body(self, value: bytes) -> None:
        _BODY.__set__(self, value)

    @property
    def keys(self) -> list[str]:
        return self._field(_KEYS)

    @keys.setter
    def keys(self, value: list[str]) -> None:
        _KEYS.__set__(self, value)

    @property
    def properties(self) -> dict[str, str]:
        return self._field(_PROPS)

    @properties.setter
    def properties(self, value: dict[str, str]) -> None:
        _PROPS.__set__(self, value)

    @property
    def origin_topic(self) -> str | None:
        return self._field(_ORIGIN)

    @origin_topic.setter
    def origin_topic(self, value: str | None) -> None:
        _ORIGIN.__set__(self, value)


def decode_stored(blob: Buffer, *, verify: bool = True) -> list[StoredMessage]:
    """The messages of a stored-form answer, in order; BatchError naming the group and the
    record when the blob is not whole, well-formed groups (or a CRC fails, with ``verify``)."""
    out: list[StoredMessage] = []
    new = object.__new__
    s_id, s_topic, s_qid, s_qoff, s_tag, s_born, s_store, s_recon, s_handle, s_state = (
        _SLOTS[n] for n in ("message_id", "topic", "queue_id", "queue_offset", "tag",
                            "born_timestamp_ms", "store_timestamp_ms", "reconsume_times",
                            "receipt_handle", "state"))
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
            s_id.__set__(m, mid)
            s_topic.__set__(m, topic)
            s_qid.__set__(m, qid)
            s_qoff.__set__(m, base_q + ordinal)
            s_tag.__set__(m, tag)
            s_born.__set__(m, born)
            s_store.__set__(m, store_ts)
            s_recon.__set__(m, reconsume)
            s_handle.__set__(m, None)
            s_state.__set__(m, None)
            out.append(m)
            p += size
        group += 1
    return out

