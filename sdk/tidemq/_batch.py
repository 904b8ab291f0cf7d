"""The producer's side of stored-form batches: messages become the log's own bytes.

A ``QueueBatch`` is the open batch of one (topic, queue): each message is encoded into it when
it is added (``tidemq.protocol.records.v2``), so sending costs one ``finish``. A send request's body
(content type ``application/x-tidemq-batch``) is one or more finished batches back to back, all
for the request's topic (``encode_request``: one batch per queue the request's messages go
to). The broker answers per batch (``{"batches": [[queue_id, first queue offset, count]]}``),
or per message as a JSON send when it stored the request another way (a delayed message, a
duplicate); ``results_of`` reads either.

What a message says that the record has no field for rides in the properties the broker
allows from a client (``tidemq.protocol.records.v2.CLIENT_PROPERTIES``): the sharding key. Delays
are record fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidemq._exceptions import UnexpectedResponseError
from tidemq._message import SendResult, stored_result
from tidemq.protocol import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    SHARDING_KEY,
    TRAN_MSG,
    TRANSACTION_ID,
    OutgoingMessage,
    SystemTopic,
)
from tidemq.protocol.records.v2 import BatchBuilder, DelayKind

#: ``DelayKind`` as plain ints: the compiled encoder takes exact ints only (an ``IntEnum``
#: member sent every record to the pure-Python reference: 4.6 µs a record instead of 1.1)
_LEVEL, _DELAY_MS, _DELIVER_AT_MS = (int(DelayKind.LEVEL), int(DelayKind.DELAY_MS),
                                     int(DelayKind.DELIVER_AT_MS))


def delay_of(msg: OutgoingMessage) -> tuple[int, int]:
    """``(delay_kind, delay_value)`` of a message (at most one delay field is set), plain ints."""
    if msg.delay_level:
        return _LEVEL, msg.delay_level
    if msg.delay_ms is not None:
        return _DELAY_MS, msg.delay_ms
    if msg.deliver_at_ms is not None:
        return _DELIVER_AT_MS, msg.deliver_at_ms
    return 0, 0


class QueueBatch:
    """The open batch of one (topic, queue), filled as messages arrive."""

    __slots__ = ("_builder", "messages", "queue_id", "topic")

    def __init__(self, topic: str, queue_id: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self._builder = BatchBuilder(topic, queue_id)
        self.messages: list[OutgoingMessage] = []  # in record order (the answer's order)

    @property
    def count(self) -> int:
        return self._builder.count

    @property
    def nbytes(self) -> int:
        return self._builder.nbytes

    def add(self, msg: OutgoingMessage, born_ms: int) -> None:
        """Encode ``msg`` (which has its message id) as the batch's next record."""
        add_record(self._builder, msg, born_ms)
        self.messages.append(msg)

    def finish(self) -> bytes:
        return self._builder.finish()


def add_record(builder: BatchBuilder, msg: OutgoingMessage, born_ms: int) -> None:
    """Encode ``msg`` (which has its message id) as ``builder``'s next record."""
    mid = msg.message_id
    if mid is None:
        raise ValueError("a batched message needs its message_id (to_outgoing sets one)")
    if not (msg.tag or msg.keys or msg.properties or msg.sharding_key is not None
            or msg.delay_level or msg.delay_ms is not None or msg.deliver_at_ms is not None):
        builder.add_body(msg.body, mid, born_ms)  # most messages: a body and its id
        return
    props = msg.properties
    if msg.sharding_key is not None:
        props = {**props, SHARDING_KEY: msg.sharding_key}
    kind, value = delay_of(msg)
    builder.add(msg.body, mid, tag=msg.tag, keys=msg.keys, properties=props,
                born_timestamp=born_ms, delay_kind=kind, delay_value=value)


def encode_messages(topic: str, queue_id: int, messages: Iterable[OutgoingMessage],
                    born_ms: int) -> bytes:
    """One finished batch of ``messages`` for ``(topic, queue_id)``."""
    batch = QueueBatch(topic, queue_id)
    for msg in messages:
        batch.add(msg, born_ms)
    return batch.finish()



def encode_request(topic: str, messages: list[OutgoingMessage], born_ms: int
                   ) -> tuple[bytes, list[tuple[int, int]]]:
    """A send request's body for ``messages`` (each with its queue id) and, per message, its
    ``(batch, ordinal)``: the batches go in the order their queues first appear."""
    slots: dict[int, int] = {}  # queue id → its batch's index
    builders: list[BatchBuilder] = []
    counts: list[int] = []  # records in each batch so far
    where: list[tuple[int, int]] = []
    for msg in messages:
        qid = msg.queue_id
        b = slots.get(qid)  # type: ignore[arg-type]
        if b is None:
            if qid is None:
                raise ValueError("a batched message needs its queue_id (the selector sets one)")
            b = slots[qid] = len(builders)
            builders.append(BatchBuilder(topic, qid))
            counts.append(0)
        add_record(builders[b], msg, born_ms)
        where.append((b, counts[b]))
        counts[b] += 1
    return b"".join([b.finish() for b in builders]), where


def results_of(answer: Any, topic: str, messages: list[OutgoingMessage],
               where: list[tuple[int, int]], broker_name: str | None = None
               ) -> list[SendResult]:
    """The results of a batch send in message order, from either answer: per batch, or per
    message in the request's record order (batch by batch); stored by group ``broker_name``."""
    try:
        placed = answer.get("batches")
        if placed is not None:
            # each batch's queue and first offset read once (batches are numbered 0..last in
            # ``where``), then one result per message (``stored_result``: no frozen __init__)
            firsts = [(int(placed[b][0]), int(placed[b][1]))
                      for b in range(max(where)[0] + 1)] if where else []
            return [stored_result(str(msg.message_id), topic, firsts[b][0], firsts[b][1] + k,
                                  broker_name)
                    for msg, (b, k) in zip(messages, where, strict=True)]
        results = answer["results"]
        starts = [0] * (max(b for b, _ in where) + 1)  # where each batch's results begin
        for b, k in where:
            if b + 1 < len(starts):
                starts[b + 1] = max(starts[b + 1], k + 1)
        for b in range(1, len(starts)):
            starts[b] += starts[b - 1]
        return [send_result(results[starts[b] + k], topic, broker_name) for b, k in where]
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise UnexpectedResponseError(f"malformed send answer: {exc!r}") from exc


def send_result(r: dict[str, Any], topic: str, broker_name: str | None = None) -> SendResult:
    """One result of a send answer (docs/api.md); a delayed message's has no queue offset."""
    offset = r["queue_offset"]
    due = r.get("deliver_at_ms")
    return SendResult(str(r["message_id"]), topic, int(r["queue_id"]),
                      None if offset is None else int(offset), str(r.get("state") or "stored"),
                      None if due is None else int(due), broker_name)


HALF_TOPIC = SystemTopic.TRANS_HALF.value


def encode_halves(group: str, topic: str, immunity: float | None,
                  messages: list[OutgoingMessage], txids: list[str], born_ms: int) -> bytes:
    """A half-message request's body (``POST /v1/transactions``, docs/api.md): one batch for
    the half queue whose records are the half copies of ``messages`` (each with its queue id
    and no delay), transaction ``txids[i]`` for message i."""
    batch = BatchBuilder(HALF_TOPIC, 0)
    fixed = {TRAN_MSG: "true", PGROUP: group, REAL_TOPIC: topic}
    if immunity is not None:
        fixed[CHECK_IMMUNITY_TIME_IN_SECONDS] = str(int(immunity)) \
            if float(immunity).is_integer() else str(immunity)
    for msg, txid in zip(messages, txids, strict=True):
        if msg.message_id is None or msg.queue_id is None:
            raise ValueError("a half message needs its message_id and queue_id")
        props = {**msg.properties, **fixed, REAL_QID: str(msg.queue_id),
                 TRANSACTION_ID: txid}
        if msg.sharding_key is not None:
            props[SHARDING_KEY] = msg.sharding_key
        batch.add(msg.body, msg.message_id, tag=msg.tag, keys=[*msg.keys, txid],
                  properties=props, born_timestamp=born_ms)
    return batch.finish()
