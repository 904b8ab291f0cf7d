"""The broker's delay router (services/broker/delays/routing.py): due times, refused delays,
waiting copies (the state a delayed message shows: tests/broker/test_states.py)."""

from __future__ import annotations

import pytest
from tidemq.protocol import (
    DELAY,
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    ErrorCode,
    ProtocolError,
)

from tidemq_server.broker.consumers.retry import latest_copy
from tidemq_server.broker.delays.routing import (
    DELAY_LEVEL_TOPIC,
    INTAKE_TOPIC,
    DelayRouter,
)
from tidemq_server.broker.store.types import MessageRecord, StoredRecord
from tidemq_server.common.delaylevels import parse_delay_levels

DAY = 86_400_000
NOW = 1_800_000_000_000


def _router() -> DelayRouter:
    return DelayRouter(parse_delay_levels("1s 2s 3s"), max_delay_ms=30 * DAY)


def test_due_times_and_invalid_delays() -> None:
    d = _router()
    assert d.due_for(NOW, delay_level=2) == NOW + 2000
    assert d.due_for(NOW, delay_ms=1500) == NOW + 1500
    assert d.due_for(NOW, delay_ms=0) is None  # delivered at once
    assert d.due_for(NOW, deliver_at_ms=NOW - 5) is None  # in the past: at once
    assert d.due_for(NOW, deliver_at_ms=NOW + 30 * DAY) == NOW + 30 * DAY
    bad = [{"delay_level": 4}, {"delay_level": -1}, {"delay_ms": -1},
           {"delay_ms": 30 * DAY + 1}, {"deliver_at_ms": NOW + 30 * DAY + 1},
           {"deliver_at_ms": -3}, {"delay_level": 1, "delay_ms": 5}]
    for fields in bad:
        with pytest.raises(ProtocolError) as info:
            d.due_for(NOW, **fields)
        assert info.value.code is ErrorCode.INVALID_DELAY, fields
    with pytest.raises(ProtocolError, match=str(30 * DAY)):
        d.due_for(NOW, deliver_at_ms=NOW + 31 * DAY)  # the message names the limit


def test_waiting_copies_keep_the_message_whole() -> None:
    held: list[bool] = []
    d = DelayRouter(parse_delay_levels("1s 2s 3s"), max_delay_ms=30 * DAY,
                    on_first_delay=lambda: held.append(True))
    rec = MessageRecord(topic="Orders", queue_id=3, body=b"b", properties={"UNIQ_KEY": "m",
                        "TAGS": "t", "KEYS": "k"}, tag_code=7, flag=1, born_timestamp=5)
    level = d.route_record(rec, NOW, delay_level=3)
    assert (level.topic, level.queue_id, level.tag_code) == (DELAY_LEVEL_TOPIC, 2, NOW + 3000)
    assert level.properties[REAL_TOPIC] == "Orders" and level.properties[REAL_QID] == "3"
    assert level.properties[DELAY] == "3" and level.properties["TAGS"] == "t"
    timer = d.route_record(rec, NOW, delay_ms=90_000)
    assert (timer.topic, timer.queue_id) == (INTAKE_TOPIC, 0)
    assert timer.properties[TIMER_DELIVER_MS] == str(NOW + 90_000)
    assert d.route_record(rec, NOW) is rec
    assert held == [True]  # the retention hold is asked for once


def _stored(topic: str, props: dict[str, str], n: int = 0) -> StoredRecord:
    return StoredRecord(physical_offset=n, size=1, topic=topic, queue_id=0, queue_offset=n,
                        body=b"", properties={"UNIQ_KEY": "m", **props}, flag=0, sys_flag=0,
                        born_timestamp=1, born_host="", store_timestamp=n, store_host="",
                        reconsume_times=0, prepared_tx_offset=0)


def test_a_retry_waiting_out_its_back_off_is_the_groups_copy() -> None:
    delivered = _stored("Orders", {}, 3)
    retry_wait = _stored(DELAY_LEVEL_TOPIC, {REAL_TOPIC: "%RETRY%g"}, 5)
    assert latest_copy([delivered, retry_wait], "g") is retry_wait
    assert latest_copy([delivered, retry_wait], "other") is delivered
