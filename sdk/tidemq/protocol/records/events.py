"""The transaction event: one record per state change in ``TIDE_SYS_TRANS_EVENTS``
(docs/api.md#system-topics).

The broker writes them; the metrics job reads them. The body is JSON with a **fixed** set of
fields::

    {"event": EventKind, "source": EventSource, "producer_group": str, "topic": str,
     "transaction_id": str, "message_id": str, "check_times": int, "born_ms": int,
     "ts_ms": int}
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class EventKind(StrEnum):
    HALF = "half"  # a half message was stored (invisible until it ends)
    COMMIT = "commit"  # committed: delivered into its topic
    ROLLBACK = "rollback"  # rolled back: never delivered
    UNKNOWN = "unknown"  # the producer could not tell yet: a check follows
    CHECK = "check"  # the checker asked a producer of the group for the state
    DISCARD = "discard"  # too many checks (or too old): moved to TRANS_CHECK_MAX_TIME_TOPIC


class EventSource(StrEnum):
    PRODUCER = "producer"  # sent by the producer on its own (end-transaction)
    CHECK = "check"  # an answer to a check, or the checker itself


STRING_FIELDS = ("producer_group", "topic", "transaction_id", "message_id")  # text fields
INT_FIELDS = ("check_times", "born_ms", "ts_ms")  # checks so far, half stored (ms), event (ms)
EVENT_FIELDS = ("event", "source", *STRING_FIELDS, *INT_FIELDS)  # every field, in body order


def make_event(event: str, *, producer_group: str, topic: str, transaction_id: str,
               message_id: str = "", source: str = EventSource.PRODUCER.value,
               check_times: int = 0, born_ms: int, ts_ms: int) -> dict[str, Any]:
    """An event body in the fixed schema (keys in ``EVENT_FIELDS`` order)."""
    return {"event": event, "source": source, "producer_group": producer_group, "topic": topic,
            "transaction_id": transaction_id, "message_id": message_id,
            "check_times": check_times, "born_ms": born_ms, "ts_ms": ts_ms}
