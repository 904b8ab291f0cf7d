"""Resending dead letters, shared by `tidemq dlq resend` and the web console (no I/O here).

A message lands in ``%DLQ%{group}`` after too many failed consumes; the broker shows its
original topic (the ``RETRY_TOPIC`` property) as ``origin_topic``. Resending stores a new message
in that topic with the same body, tag, keys and user properties (not the broker's ``TIDE_*``
ones, such as the failure reason ``TIDE_CONSUME_FAILURE``: no client may send those), the
message id ``dlq-<40 hex>`` derived from the DLQ copy (``resent_id``: the first 40 hex digits
of SHA-256 over ``{message_id}|{dlq topic}|{queue_id}|{queue_offset}``) and the property
``dlq_message_id`` naming the dead-lettered message. The DLQ copy stays where it is; since the
resent id is known from it, the original's trace names the resent copy and a DLQ entry whose
copy exists already is not resent again (``Outcome.earlier``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tidemq.protocol.properties import is_reserved

PAGE = 256  # messages per pull of a DLQ
RESENT_FROM = "dlq_message_id"  # user property of a resent message: the DLQ message's id
NO_ORIGIN = "NO_ORIGIN: the DLQ copy does not name its original topic"


@dataclass
class Outcome:
    """What resending one DLQ entry did: ``result`` (the send result) or ``error``."""

    queue_id: int
    queue_offset: int
    message_id: str
    topic: str  # the original topic ("" when the DLQ copy does not name one)
    result: dict[str, Any] | None = None
    error: str = ""
    earlier: bool = False  # resent before: ``result`` is that copy, nothing was sent now

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dlq_queue_id": self.queue_id,
                               "dlq_queue_offset": self.queue_offset,
                               "message_id": self.message_id, "topic": self.topic}
        if self.result is not None:
            out["resent"] = self.result
            if self.earlier:
                out["earlier"] = True
        else:
            out["error"] = self.error
        return out


def resent_id(message_id: str, dlq: str, queue_id: int, offset: int) -> str:
    """A stable id for the resent copy of one DLQ entry (≤ 64 characters)."""
    digest = hashlib.sha256(f"{message_id}|{dlq}|{queue_id}|{offset}".encode()).hexdigest()
    return f"dlq-{digest[:40]}"


def copy_id(dlq: str, m: dict[str, Any]) -> str:
    """The id the resent copy of the pulled DLQ message ``m`` gets."""
    return resent_id(str(m.get("message_id", "")), dlq, int(m.get("queue_id", 0)),
                     int(m.get("queue_offset", 0)))


def plan_resend(dlq: str, m: dict[str, Any]) -> tuple[Outcome, dict[str, Any] | None]:
    """The outcome to fill in and the message to send to ``outcome.topic`` for the pulled DLQ
    message ``m``; no message (and ``outcome.error`` set) when it names no original topic."""
    qid, offset = int(m.get("queue_id", 0)), int(m.get("queue_offset", 0))
    mid = str(m.get("message_id", ""))
    outcome = Outcome(qid, offset, mid, str(m.get("origin_topic") or ""))
    if not outcome.topic:
        outcome.error = NO_ORIGIN
        return outcome, None
    kept = {k: v for k, v in (m.get("properties") or {}).items() if not is_reserved(k)}
    message: dict[str, Any] = {"message_id": copy_id(dlq, m), "body": m.get("body", ""),
                               "properties": {**kept, RESENT_FROM: mid}}
    if m.get("body_encoding") == "base64":
        message["body_encoding"] = "base64"
    if m.get("tag"):
        message["tag"] = m["tag"]
    if m.get("keys"):
        message["keys"] = m["keys"]
    return outcome, message
