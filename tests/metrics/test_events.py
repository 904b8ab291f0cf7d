"""The fixed event schema (docs/api.md#system-topics): valid events become rows, anything else
a reason."""

from __future__ import annotations

import orjson
import pytest
from tidemq.protocol import EVENT_FIELDS, EventKind, make_event

from tests.support.metrics import MALFORMED, MALFORMED_BY_REASON, encode
from tidemq_server.metrics.events import COLUMNS, MalformedReason, parse_event


def _valid(**overrides: object) -> bytes:
    body = make_event("commit", producer_group="g", topic="Orders", transaction_id="tx-1",
                      message_id="m-1", source="check", check_times=2, born_ms=1000,
                      ts_ms=4500)
    return orjson.dumps({**body, **overrides})


def test_every_event_kind_parses_into_the_columns() -> None:
    assert len(EVENT_FIELDS) + 3 == len(COLUMNS)
    for kind in EventKind:
        row = parse_event(_valid(event=kind.value))
        assert row == (kind.value, "check", "g", "Orders", "tx-1", "m-1", 2, 1000, 4500, None)


def test_extra_fields_are_ignored_and_text_bodies_work() -> None:
    row = parse_event(_valid(extra={"nested": True}).decode())
    assert row[-1] is None and row[0] == "commit"


@pytest.mark.parametrize(("body", "reason"), [
    (b"", MalformedReason.NOT_JSON),
    (b"\xff", MalformedReason.NOT_JSON),
    (b'"half"', MalformedReason.NOT_OBJECT),
    (b"null", MalformedReason.NOT_OBJECT),
    (orjson.dumps({"event": "half", "source": "producer"}), MalformedReason.MISSING_FIELD),
    (_valid(event=3), MalformedReason.BAD_TYPE),
    (_valid(event="commited"), MalformedReason.UNKNOWN_EVENT),
    (_valid(source="consumer"), MalformedReason.UNKNOWN_EVENT),
    (_valid(producer_group=""), MalformedReason.BAD_TYPE),
    (_valid(topic=None), MalformedReason.BAD_TYPE),
    (_valid(transaction_id="x" * 300), MalformedReason.BAD_TYPE),
    (_valid(check_times=-1), MalformedReason.BAD_TYPE),
    (_valid(check_times=1.5), MalformedReason.BAD_TYPE),
    (_valid(born_ms=False), MalformedReason.BAD_TYPE),
    (_valid(ts_ms="5"), MalformedReason.BAD_TYPE),
])
def test_malformed_bodies_get_a_reason_and_never_raise(body: bytes,
                                                       reason: MalformedReason) -> None:
    row = parse_event(body)
    assert len(row) == len(EVENT_FIELDS) + 1
    assert row[-1] == reason.value
    assert row[0] == "" and row[2] == "" and row[6] == 0


def test_the_shared_malformed_set_matches_its_reasons() -> None:
    reasons: dict[str, int] = {}
    for body in MALFORMED:
        reason = parse_event(encode(body))[-1]
        reasons[reason] = reasons.get(reason, 0) + 1
    assert reasons == MALFORMED_BY_REASON
