"""The producer's side of stored-form batches: messages become the log's own bytes.

A ``QueueBatch`` is the open batch of one (topic, queue): each message is encoded into it when
it is added (``tidemq.protocol.batch``), so sending costs one ``finish``. A send request's body
(content type ``application/x-tidemq-batch``) is one or more finished batches back to back, all
for the request's topic.

What a message says that the record has no field for rides in the properties the broker
allows from a client (``tidemq.protocol.batch.CLIENT_PROPERTIES``): the sharding key. Delays
are record fields.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidemq.protocol import SHARDING_KEY, OutgoingMessage
from tidemq.protocol.batch import BatchBuilder, DelayKind


def delay_of(msg: OutgoingMessage) -> tuple[int, int]:
    """``(delay_kind, delay_value)`` of a message (at most one delay field is set)."""
    if msg.delay_level:
        return DelayKind.LEVEL, msg.delay_level
    if msg.delay_ms is not None:
        return DelayKind.DELAY_MS, msg.delay_ms
    if msg.deliver_at_ms is not None:
        return DelayKind.DELIVER_AT_MS, msg.deliver_at_ms
    return DelayKind.NONE, 0


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
        if msg.message_id is None:
            raise ValueError("a batched message needs its message_id (to_outgoing sets one)")
        props = msg.properties
        if msg.sharding_key is not None:
            props = {**props, SHARDING_KEY: msg.sharding_key}
        kind, value = (DelayKind.NONE, 0) if not (
            msg.delay_level or msg.delay_ms is not None or msg.deliver_at_ms is not None
        ) else delay_of(msg)
        self._builder.add(msg.body, msg.message_id, tag=msg.tag, keys=msg.keys,
                          properties=props, born_timestamp=born_ms, delay_kind=kind,
                          delay_value=value)
        self.messages.append(msg)

    def finish(self) -> bytes:
        return self._builder.finish()


def encode_messages(topic: str, queue_id: int, messages: Iterable[OutgoingMessage],
                    born_ms: int) -> bytes:
    """One finished batch of ``messages`` for ``(topic, queue_id)``."""
    batch = QueueBatch(topic, queue_id)
    for msg in messages:
        batch.add(msg, born_ms)
    return batch.finish()

