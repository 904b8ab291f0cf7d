"""Records copied from their stored bytes into a new batch: the commit copy of a half message.

A half message sent in a producer's batch is stored as the producer made it (record format v2,
``tidemq.protocol.records.v2``). Its commit copy is the same message in another batch — the real
topic and queue, sys_flag COMMIT — with a few fields changed. Decoding the half into a
``MessageRecord`` and encoding that again (``v2_own.encode_records``) cost about a quarter of
the broker's work per transaction (issue 33); ``copy_record`` writes the copy from the stored
record's bytes instead, changing only:

- the keys: without ``drop_key`` (the transaction id a half copy carries among them);
- the properties: without the names in ``drop`` (the half-only ones), the rest as stored and in
  their order;
- the tag code: that of the stored tag (crc32 + 1, 0 without a tag), as every encoder sets it;
- flag, reconsume times and delay: 0; ``prepared_tx_offset``: given;
- its place (``batch_pos``, ordinal) and so its CRC: those of the new batch.

The message id, tag, born timestamp and body are the stored bytes. For a record whose property
names are distinct (``ingest/halves.py`` keeps only such halves for this path), the copy is byte
for byte what ``encode_records`` makes of the decoded record with the same changes (the tests
hold this). ``CopyBatch`` collects copies into one batch with the summary dispatch needs, as
``encode_records`` does for the broker's own records.

``copy_record`` has a compiled twin (``store/_cstore.pyx``) that gives the same bytes and
answers; the twin hands anything unusual back to this reference.
"""

from __future__ import annotations

import zlib

from tidemq.protocol.records.v2 import (
    HEADER_FIXED,
    MAX_BATCH_POS,
    MAX_COUNT,
    MAX_TOPIC_BYTES,
    RECORD,
    RECORD_FIXED,
    UnfitBatch,
    append_record,
    close_batch,
)
from tidemq.protocol.records.v2_read import BatchSummary

from tidemq_server.broker.store.records.v2_own import Batch, head_of
from tidemq_server.broker.store.twin import cstore

KEY_SEP = b"\x1f"  # between keys (v2.KEY_SEPARATOR)
PROPERTY_END = b"\x02"  # after each property (v2.PROPERTY_END)
PROPERTY_SEP = b"\x01"  # between a property's name and value (v2.PROPERTY_SEPARATOR)


def copy_record(buf: bytearray, ordinal: int, src: bytes, drop_key: bytes,
                drop: frozenset[bytes], prepared: int) -> tuple[int, int, str, str]:
    """Append to ``buf`` (a batch being built) the copy of the v2 record ``src`` (its bytes,
    whole) as record ``ordinal``, changed as the module docstring says; its size, tag code,
    message id and keys (joined), for the batch's summary. ValueError for bytes that are not
    one whole record (UnicodeDecodeError: an id or keys not utf-8)."""
    if len(src) < RECORD_FIXED:
        raise ValueError(f"a record needs {RECORD_FIXED} bytes, got {len(src)}")
    (size, _, _, _, _, _, born, _, _, _, _, id_len, tag_len, keys_len, props_len,
     body_len) = RECORD.unpack_from(src, 0)
    if size != len(src) or RECORD_FIXED + id_len + tag_len + keys_len + props_len \
            + body_len != size:
        raise ValueError(f"the record's lengths disagree with its {len(src)} bytes")
    at = RECORD_FIXED
    mid = src[at:at + id_len]
    at += id_len
    tag = src[at:at + tag_len]
    at += tag_len
    keys = src[at:at + keys_len]
    at += keys_len
    props = src[at:at + props_len]
    body = src[at + props_len:]
    if keys:
        keys = KEY_SEP.join([k for k in keys.split(KEY_SEP) if k != drop_key])
    if props:
        props = b"".join([item + PROPERTY_END for item in props.split(PROPERTY_END)
                          if item and item.partition(PROPERTY_SEP)[0] not in drop])
    code = zlib.crc32(tag) + 1 if tag else 0
    text = str(mid, "utf-8"), str(keys, "utf-8")  # before appending: ``buf`` stays as it was
    n = append_record(buf, ordinal, mid, tag, keys, props, body, 0, 0, born, code, prepared,
                      0, 0)
    return n, code, text[0], text[1]


copy_record_py = copy_record  # the reference (tests run it beside the compiled twin)
if cstore is not None:  # the compiled twin (_cstore.pyx), falling back on the reference
    cstore.use_copy(copy_record_py)
    copy_record = cstore.copy_record


class CopyBatch:
    """One batch of records written from bytes for one (topic, queue, sys_flag, born host):
    copies (``add``) or plain records (``add_plain``), a record at a time, then ``finish``.
    Used once."""

    __slots__ = ("_buf", "_records_at", "_topic", "born_host", "queue_id", "summary",
                 "sys_flag")

    def __init__(self, topic: str, queue_id: int, sys_flag: int, born_host: bytes) -> None:
        raw = topic.encode("utf-8")
        if not raw or len(raw) > MAX_TOPIC_BYTES:
            raise UnfitBatch(f"topic: {len(raw)} bytes; a batch holds 1-{MAX_TOPIC_BYTES}")
        self._topic = raw
        self.queue_id, self.sys_flag, self.born_host = queue_id, sys_flag, born_host
        self._records_at = HEADER_FIXED + len(raw)
        self._buf = bytearray(self._records_at)  # the header is written by finish()
        self.summary = BatchSummary(head_of(b"", 0, 0, 0, ""))  # its head: at finish()

    @property
    def nbytes(self) -> int:
        return len(self._buf)

    def add(self, src: bytes, drop_key: bytes, drop: frozenset[bytes], prepared: int) -> None:
        """The copy of record ``src`` (see ``copy_record``); UnfitBatch when the batch is
        full."""
        pos, count = self._room()
        size, code, mid, keys = copy_record(self._buf, count, src, drop_key, drop, prepared)
        self._summed(pos, size, code, mid, keys)

    def add_plain(self, tag: bytes, code: int, body: bytes, born: int) -> None:
        """A record of a tag (``code``: its tag code) and a body, born at ``born``, with no
        id, keys or properties (a transaction event): what ``BatchBuilder.add`` writes for it,
        without its per-record encoding."""
        pos, count = self._room()
        size = append_record(self._buf, count, b"", tag, b"", b"", body, 0, 0, born, code, 0,
                             0, 0)
        self._summed(pos, size, code, "", "")

    def _room(self) -> tuple[int, int]:
        """Where the next record goes and its ordinal; UnfitBatch when the batch is full."""
        pos, count = len(self._buf), len(self.summary.positions)
        if count >= MAX_COUNT or pos > MAX_BATCH_POS:
            raise UnfitBatch(f"a batch holds at most {MAX_COUNT} records and "
                             f"{MAX_BATCH_POS} bytes before its last")
        return pos, count

    def _summed(self, pos: int, size: int, code: int, mid: str, keys: str) -> None:
        """The record just written at ``pos``, in the batch's summary."""
        s = self.summary
        s.positions.append(pos)
        s.sizes.append(size)
        s.tag_codes.append(code)
        s.message_ids.append(mid)
        s.keys.append(keys)

    def finish(self) -> Batch:
        """The batch, its header written, ready to append; UnfitBatch without records."""
        count = len(self.summary.positions)
        raw = close_batch(self._buf, count, self.queue_id, self.sys_flag, self._topic,
                          self._records_at)
        self.summary.head = head_of(raw, count, self.queue_id, self.sys_flag,
                                    str(self._topic, "utf-8"))
        return Batch(raw, self.summary, self.born_host)
