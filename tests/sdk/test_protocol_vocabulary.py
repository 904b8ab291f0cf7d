"""The shared vocabulary of tidemq.protocol: property names, system topics, topic permission,
the transaction event and the broker ↔ scheduler rows. Literals here are the wire contract."""

from __future__ import annotations

import pytest
from tidemq.protocol import (
    DELIVERY_FIELDS,
    EVENT_FIELDS,
    RESERVED_PROPERTIES,
    DeliveryRow,
    ErrorCode,
    EventKind,
    EventSource,
    IntakeRow,
    Perm,
    ProtocolError,
    SystemTopic,
    is_system_topic,
    make_event,
    parse_message,
    parse_perm,
)
from tidemq.protocol import properties as prop

NAMES = {name: value for name, value in vars(prop).items()
         if name.isupper() and isinstance(value, str) and name != "RESERVED_PREFIX"}


def test_each_property_is_named_by_its_wire_name_and_reserved() -> None:
    assert NAMES["UNIQ_KEY"] == "UNIQ_KEY" and NAMES["TIMER_DELIVER_MS"] == "TIMER_DELIVER_MS"
    assert all(name == value for name, value in NAMES.items())
    assert set(NAMES.values()) == RESERVED_PROPERTIES


@pytest.mark.parametrize("name", sorted(RESERVED_PROPERTIES))
def test_a_reserved_name_is_refused_as_a_user_property(name: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_message({"body": "x", "properties": {name: "v"}})
    assert err.value.code is ErrorCode.BAD_REQUEST and name in err.value.message


@pytest.mark.parametrize("name", ["TIDE_CONSUME_FAILURE", "TIDE_SOMETHING_LATER", "TIDE_"])
def test_every_tide_name_is_refused_as_a_user_property(name: str) -> None:
    assert prop.RESERVED_PREFIX == "TIDE_" and prop.is_reserved(name)
    with pytest.raises(ProtocolError) as err:
        parse_message({"body": "x", "properties": {name: "v"}})
    assert err.value.code is ErrorCode.BAD_REQUEST and repr(name) in err.value.message
    assert "TIDE_" in err.value.message


def test_a_name_merely_containing_tide_is_the_users() -> None:
    msg = parse_message({"body": "x", "properties": {"MY_TIDE_X": "1", "tide_x": "2"}})
    assert msg.properties == {"MY_TIDE_X": "1", "tide_x": "2"}


def test_system_topics() -> None:
    assert SystemTopic.TIMER_CANCELS == "TIDE_SYS_TIMER_CANCELS"
    assert all(is_system_topic(t) for t in SystemTopic)


def test_perm() -> None:
    assert [p.value for p in Perm] == ["rw", "r", "w"]
    assert parse_perm("r") is Perm.READ and not Perm.READ.writable and Perm.READ.readable
    assert Perm.WRITE.writable and not Perm.WRITE.readable
    with pytest.raises(ProtocolError) as err:
        parse_perm("rwx")
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_event_body_has_the_fixed_fields_in_order() -> None:
    body = make_event(EventKind.DISCARD, source=EventSource.CHECK, producer_group="g",
                      topic="t", transaction_id="x", born_ms=1, ts_ms=2)
    assert tuple(body) == EVENT_FIELDS == (
        "event", "source", "producer_group", "topic", "transaction_id", "message_id",
        "check_times", "born_ms", "ts_ms")
    assert body["event"] == "discard" and body["source"] == "check"
    assert {k.value for k in EventKind} == {"half", "commit", "rollback", "unknown", "check",
                                             "discard"}
    assert {s.value for s in EventSource} == {"producer", "check"}


def test_rows_fix_field_order() -> None:
    assert DELIVERY_FIELDS == ("topic", "queue_id", "body", "properties", "flag", "sys_flag",
                               "born_timestamp_ms", "born_host", "reconsume_times",
                               "prepared_tx_offset")
    row = DeliveryRow._make(["T", 1, b"b", {}, 0, 0, 5, "h:1", 0, 0])
    assert row.topic == "T" and row.born_host == "h:1"
    with pytest.raises(TypeError):
        DeliveryRow._make(["T", 1])
    assert IntakeRow._fields == ("queue_offset", "due_ms", "message_id", "topic", "record")
