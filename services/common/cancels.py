"""Cancels of delayed messages are keyed by (topic, message id): ids are unique per topic only.

Broker and scheduler refuse a cancel that names no topic when the id waits in several topics,
with the same words (409 AMBIGUOUS_MESSAGE_ID); nothing is cancelled then.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidemq.protocol import ErrorCode, ProtocolError


def ambiguous_id(message_id: str, topics: Iterable[str]) -> ProtocolError:
    """The refusal of a cancel without a topic for an id delayed in ``topics`` (2 or more)."""
    names = sorted(set(topics))
    return ProtocolError(ErrorCode.AMBIGUOUS_MESSAGE_ID,
                         f"message id {message_id!r} is a delayed message in {len(names)} "
                         f"topics ({', '.join(names)}): nothing was cancelled; name one with "
                         "?topic=")
