"""What the broker's ``/internal/`` endpoints answer, as models for the OpenAPI document.

Documentation only (see answers.py). Bytes travel raw in msgpack answers and as base64 text in
JSON answers: message bodies (with ``body_encoding``), the bodies of ``/bodies`` (with
``body_encoding: "base64"``), the msgpack-encoded delivery row of an intake timer, and the body
inside a due record's delivery row. Maps keyed by queue id have string keys in JSON.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from tidemq_server.broker.routes.answers import MessageBase, Position, QueueBounds


class PutPosition(Position):
    """Where a written record was stored."""


class PutResults(BaseModel):
    results: list[PutPosition]


class RawRecord(MessageBase):
    """A stored record with every field, raw properties included."""

    physical_offset: int
    size: int
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: str
    store_timestamp_ms: int
    store_host: str
    reconsume_times: int
    prepared_tx_offset: int


class RawPull(QueueBounds):
    messages: list[RawRecord]


class Bodies(QueueBounds):
    offsets: list[int] = Field(description="queue offset of each body")
    bodies: list[str] = Field(description="base64 text (JSON); raw bytes (msgpack)")
    body_encoding: Literal["base64", "bytes"]


# --- /internal/v1/schedule ----------------------------------------------------------------------

class ScheduleInfo(BaseModel):
    broker_name: str
    delay_levels_ms: list[int] = Field(description="delay of level 1, 2, ... (ms)")
    max_delay_ms: int
    schedule_topic: str
    intake_topic: str


class Intake(QueueBounds):
    timers: list[list[int | str]] = Field(
        description="[queue offset, due ms, message id, real topic, delivery row encoded in "
                    "msgpack (raw bytes in msgpack, base64 text in JSON)]")


class TimerCancels(QueueBounds):
    message_ids: list[str] = Field(description="ids of delayed messages cancelled, in order")
    topics: list[str | None] = Field(default_factory=list, description="the topic of each "
                                     "id (null: a record naming none, any topic)")


class DueRecordOut(BaseModel):
    offset: int = Field(description="offset in the level queue")
    due_ms: int
    message_id: str
    record: list[Any] = Field(description="the delivery row (body: raw bytes in msgpack, base64 "
                                          "text in JSON)")


class LevelDue(QueueBounds):
    records: list[DueRecordOut]
    next_due_ms: int | None = Field(description="due time of the first record not due yet")


class LevelsDue(BaseModel):
    levels: dict[str, LevelDue] = Field(description="level queue id → its due records")
    now_ms: int


class Delivered(BaseModel):
    stored: int
    duplicates: int = Field(description="strict records found already delivered")


class Floor(BaseModel):
    floor: int = Field(description="the physical offset retention now keeps")


class Pending(BaseModel):
    by_queue: dict[str, int] = Field(description="level queue id → waiting records")
    next_due_ms: int | None
    intake_pending: int
    intake_next_due_ms: int | None


# --- /internal/v1/transactions ------------------------------------------------------------------

class BrokerIdentity(BaseModel):
    broker_name: str
    cluster: str


class HalfEntry(BaseModel):
    queue_offset: int
    physical_offset: int
    transaction_id: str
    message_id: str
    producer_group: str
    topic: str
    check_times: int
    store_timestamp_ms: int
    born_ms: int
    check_immunity_s: float | None


class Halves(QueueBounds):
    entries: list[HalfEntry]
    next_physical_offset: int


class Ops(QueueBounds):
    transaction_ids: list[str] = Field(description="transactions the op records end")
    next_physical_offset: int


class ActionResult(BaseModel):
    transaction_id: str
    outcome: Literal["checked", "deferred", "discarded", "not_found", "ended", "superseded"]


class ActionResults(BaseModel):
    results: list[ActionResult]
