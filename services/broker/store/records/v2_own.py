"""The broker's own records as format v2 batches: what the writer appends for every put.

A producer's batch arrives in format v2 already (``tidemq.protocol.records.v2``); a record the
broker makes itself (a send in JSON or msgpack, a commit copy, an op record, an event, a retry, a
delayed message's copies) arrives as a ``MessageRecord``. ``encode_records`` turns a put's
records into batches before the put is queued, so the writer handles one kind of entry:

- records going to the same (topic, queue, sys_flag, born host) share a batch, in the order
  they come (a batch's records take consecutive queue offsets); a batch is cut at
  ``max_bytes`` so it always fits a segment;
- a record's message id, tag and keys (the ``UNIQ_KEY``, ``TAGS`` and ``KEYS`` properties)
  go into the record's own fields and every other property stays a property; its
  ``tag_code`` is kept as it is (a delay-level queue's slot holds the due time);
- each batch comes with the ``BatchSummary`` dispatch needs, made while encoding (nothing is
  read back); the writer fills the broker part and the summary's head when it appends.

A record whose fields the layout cannot hold raises ``UnfitRecord`` naming the field.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tidemq.protocol import KEYS, TAGS, UNIQ_KEY
from tidemq.protocol.records.v2 import HEADER_FIXED, NO_HOST, BatchBuilder, UnfitBatch
from tidemq.protocol.records.v2_read import BatchHead, BatchSummary

from tidemq_server.broker.store.records import v1 as record
from tidemq_server.broker.store.records.v1 import UnfitRecord
from tidemq_server.broker.store.types import MessageRecord

_OWN_FIELDS = (UNIQ_KEY, TAGS, KEYS)


@dataclass(slots=True)
class Batch:
    """One v2 batch waiting to be appended: its bytes (broker part still zero), its summary
    and the born host the writer fills in."""

    raw: bytes | bytearray
    summary: BatchSummary
    born_host: bytes = NO_HOST


def head_of(raw: bytes | bytearray, count: int, queue_id: int, sys_flag: int,
            topic: str) -> BatchHead:
    """The head of a batch just built (its broker part not filled yet)."""
    return BatchHead(len(raw), 0, 0, 0, NO_HOST, NO_HOST, count, queue_id, sys_flag, topic,
                     HEADER_FIXED + len(topic.encode("utf-8")))


class _Open:
    __slots__ = ("builder", "host", "summary")

    def __init__(self, rec: MessageRecord, host: bytes) -> None:
        self.builder = BatchBuilder(rec.topic, rec.queue_id, rec.sys_flag)
        self.host = host
        self.summary = BatchSummary(head_of(b"", 0, 0, 0, ""))  # its head: at the end


def encode_records(records: list[MessageRecord], max_bytes: int
                   ) -> tuple[list[Batch], list[tuple[int, int]]]:
    """The batches holding ``records`` and, per record, ``(batch index, ordinal)``."""
    done: list[Batch] = []
    where: list[tuple[int, int]] = []
    open_: dict[tuple[str, int, int, str], tuple[int, _Open]] = {}
    order: list[_Open] = []  # open batches, index = their place in the answer
    for rec in records:
        key = (rec.topic, rec.queue_id, rec.sys_flag, rec.born_host)
        slot = open_.get(key)
        size = len(rec.body) + 512
        if slot is not None and slot[1].builder.nbytes + size > max_bytes:
            slot = None  # cut: a batch always fits a segment
        try:
            if slot is None:
                record.validate_fits(rec)  # queue_id and sys_flag: the batch header's
                slot = open_[key] = (len(order), _Open(rec, record.encode_host(rec.born_host)))
                order.append(slot[1])
            ob = slot[1]
            b, s = ob.builder, ob.summary
            props = rec.properties
            mid, tag, keys = props.get(UNIQ_KEY, ""), props.get(TAGS), props.get(KEYS, "")
            if mid or tag is not None or keys:
                props = {k: v for k, v in props.items() if k not in _OWN_FIELDS}
            pos = b.nbytes
            where.append((slot[0], b.count))
            n = b.add(rec.body, mid, tag=tag, keys=keys, properties=props,
                      born_timestamp=rec.born_timestamp, flag=rec.flag,
                      reconsume_times=rec.reconsume_times,
                      prepared_tx_offset=rec.prepared_tx_offset, code=rec.tag_code)
        except (UnfitBatch, struct.error, TypeError, ValueError, AttributeError) as exc:
            record.validate_fits(rec)  # names the header field, when that is the one
            raise UnfitRecord(str(exc)) from None
        s.positions.append(pos)
        s.sizes.append(n)
        s.tag_codes.append(rec.tag_code)
        s.message_ids.append(mid)
        s.keys.append(keys)
    for ob in order:
        b = ob.builder
        try:
            raw = b.finish()
        except UnfitBatch as exc:
            raise UnfitRecord(str(exc)) from None
        ob.summary.head = head_of(raw, b.count, b.queue_id, b.sys_flag, _topic(raw))
        done.append(Batch(raw, ob.summary, ob.host))
    return done, where


def _topic(raw: bytes) -> str:
    return str(raw[HEADER_FIXED:HEADER_FIXED + raw[HEADER_FIXED - 1]], "utf-8")
