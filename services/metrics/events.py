"""Validation of the transaction events the job reads (schema: ``tidemq.protocol.records.events``).

``parse_event`` turns one record body into the row the data source emits: the event's fields,
or, for a body that breaks the schema, empty fields and a ``MalformedReason`` — such a row is
counted by the job and skipped by every aggregation. Pure: no Spark, no I/O, so the rules are
unit-tested directly and run unchanged in Spark's Python workers.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson
from tidemq.protocol.records.events import (
    EVENT_FIELDS,
    INT_FIELDS,
    STRING_FIELDS,
    EventKind,
    EventSource,
)


class MalformedReason(StrEnum):
    NOT_JSON = "not_json"  # the body is not valid UTF-8 JSON
    NOT_OBJECT = "not_object"  # valid JSON, but not an object
    MISSING_FIELD = "missing_field"  # a required field is absent
    BAD_TYPE = "bad_type"  # a field has the wrong type or an impossible value
    UNKNOWN_EVENT = "unknown_event"  # "event" or "source" outside the fixed values


EVENTS = frozenset(e.value for e in EventKind)
SOURCES = frozenset(s.value for s in EventSource)
RESOLUTIONS = (EventKind.COMMIT.value, EventKind.ROLLBACK.value, EventKind.DISCARD.value)
"""Events that end a transaction: the half-to-resolution time is ``ts_ms - born_ms``."""

INT_BOUNDS = (2**31, 2**62, 2**62)  # exclusive upper bounds (check_times is a 32-bit column)
MAX_FIELD_CHARS = 255  # longer names are rejected: they would only bloat label sets

#: Spark type of each body field (check_times is a 32-bit column: see INT_BOUNDS).
_FIELD_TYPES = {"event": "string", "source": "string", "producer_group": "string",
                "topic": "string", "transaction_id": "string", "message_id": "string",
                "check_times": "int", "born_ms": "bigint", "ts_ms": "bigint"}

# The rows the data source emits, in column order (Spark DDL and Arrow share this list): the
# event's position, the body's fields, and why it is malformed (None for a valid event).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("queue_id", "int"),
    ("queue_offset", "bigint"),
    *((name, _FIELD_TYPES[name]) for name in EVENT_FIELDS),
    ("malformed", "string"),
)
SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)

EventRow = tuple[Any, ...]  # the EVENT_FIELDS values followed by the malformed reason


def _malformed(reason: MalformedReason) -> EventRow:
    return ("", "", "", "", "", "", 0, 0, 0, reason.value)


def parse_event(body: bytes | str) -> EventRow:
    """One record body → ``(event, source, producer_group, topic, transaction_id, message_id,
    check_times, born_ms, ts_ms, malformed)``; never raises."""
    try:
        obj = orjson.loads(body)
    except (orjson.JSONDecodeError, TypeError):
        return _malformed(MalformedReason.NOT_JSON)
    if not isinstance(obj, dict):
        return _malformed(MalformedReason.NOT_OBJECT)
    return validate_event(obj)


def validate_event(obj: dict[str, Any]) -> EventRow:
    """A decoded body checked against the fixed schema (see ``parse_event``)."""
    try:
        event = obj["event"]
        source = obj["source"]
        strings = [obj[name] for name in STRING_FIELDS]
        ints = [obj[name] for name in INT_FIELDS]
    except KeyError:
        return _malformed(MalformedReason.MISSING_FIELD)
    if not isinstance(event, str) or not isinstance(source, str):
        return _malformed(MalformedReason.BAD_TYPE)
    if event not in EVENTS or source not in SOURCES:
        return _malformed(MalformedReason.UNKNOWN_EVENT)
    for value in strings:
        if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
            return _malformed(MalformedReason.BAD_TYPE)
    if not strings[0] or not strings[1] or not strings[2]:  # group, topic, transaction id
        return _malformed(MalformedReason.BAD_TYPE)
    for value, bound in zip(ints, INT_BOUNDS, strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
            return _malformed(MalformedReason.BAD_TYPE)
    return (event, source, *strings, *ints, None)

