"""Pure checks of a request of producer-made batches (``application/x-tidemq-batch``, record
format v2: ``tidemq.protocol.records.v2``), made before anything is stored: no I/O, no state.

- ``parse_batches``: every batch of a public send validated whole (sizes, CRCs, ids, tags,
  keys, properties with no reserved name but the sharding key, delays, limits), then against
  the request: its topic, one of the topic's queues, sys_flag 0;
- ``check_limits``: the API's batch limits over every batch of a request together.

A failure is a ``BatchError`` (400, or 413) naming the batch, the record index and the field,
e.g. ``batches[1].records[3].crc: ...``. The checks of half records are in ``halves.py``.
"""

from __future__ import annotations

from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.message import Limits
from tidemq.protocol.records.v2 import CLIENT_PROPERTIES
from tidemq.protocol.records.v2_read import BatchError, BatchSummary, split, validate


def parse_batches(topic: str, raw: bytes, queues: int, limits: Limits) -> list[BatchSummary]:
    """Validate every batch of ``raw``, a public send to ``topic`` (``queues`` queues); the
    summaries in order."""
    summaries: list[BatchSummary] = []
    for k, (at, size) in enumerate(split(raw)):
        try:
            s = validate(raw, at, strict=True, allowed=CLIENT_PROPERTIES, limits=limits,
                         end=at + size)
        except BatchError as exc:
            raise BatchError(exc.field, exc.why, exc.index, exc.code, batch=k) from None
        head = s.head
        if head.topic != topic:
            raise BatchError("topic", f"{head.topic!r}, but the request is for {topic!r}",
                             batch=k)
        if not 0 <= head.queue_id < queues:
            raise BatchError("queue_id", f"{head.queue_id} does not exist: topic "
                             f"{topic!r} has queues 0-{queues - 1}", batch=k)
        if head.sys_flag:
            raise BatchError("sys_flag", f"{head.sys_flag}: a public send writes plain "
                             "messages (0)", batch=k)
        summaries.append(s)
    check_limits(summaries, limits)
    return summaries


def check_limits(summaries: list[BatchSummary], limits: Limits) -> None:
    """The API's batch limits over every batch of a request together (413)."""
    count = sum(s.head.count for s in summaries)
    if count > limits.max_batch_messages:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"batches: {count} messages "
                            f"exceeds the batch limit of {limits.max_batch_messages}")
    payload = sum(s.payload_bytes for s in summaries)
    if payload > limits.max_batch_bytes:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"batches: {payload} bytes "
                            f"(bodies and properties) exceeds the limit of "
                            f"{limits.max_batch_bytes} bytes")
