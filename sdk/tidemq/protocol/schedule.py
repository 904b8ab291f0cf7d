"""The rows the broker and the scheduler exchange on ``/internal/v1/schedule/*`` (msgpack).

Rows are flat arrays, cheap to encode and decode in bulk; the tuples below fix their field order
and names for both sides. Build one by calling the class, read a decoded array with ``_make``
(a wrong field count raises ``TypeError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypedDict


class DeliveryRow(NamedTuple):
    """A delayed message as it will be stored when due: what ``deliver`` takes, what a level's
    due record and an intake timer carry, and what the scheduler's timer log keeps."""

    topic: str  # the real topic it is delivered to
    queue_id: int  # ... and its queue
    body: bytes
    properties: dict[str, str]  # the message's own (UNIQ_KEY included), no waiting properties
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: str
    reconsume_times: int
    prepared_tx_offset: int


class IntakeRow(NamedTuple):
    """One timer of the intake topic (arbitrary delays), as ``intake`` hands it over."""

    queue_offset: int  # its offset in the intake queue
    due_ms: int  # delivery time (epoch ms)
    message_id: str
    topic: str  # the real topic
    record: bytes  # its DeliveryRow, msgpack-encoded (the scheduler files it as it is)


class DueRecord(TypedDict):
    """One due record of a delay-level queue, as ``levels/due`` hands it over."""

    offset: int  # its offset in the level queue
    due_ms: int  # delivery time (epoch ms)
    message_id: str
    record: Sequence[Any]  # its DeliveryRow (a list once decoded)


DELIVERY_FIELDS = DeliveryRow._fields
