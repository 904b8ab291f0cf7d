"""What state a message is in (services/broker/states.py), read from its copies."""

from __future__ import annotations

from tidemq.protocol import REAL_QID, REAL_TOPIC, TIMER_DELIVER_MS, SystemTopic

from tidemq_server.broker.delays.routing import INTAKE_TOPIC
from tidemq_server.broker.messaging.query import MessageState
from tidemq_server.broker.states import copy_kind, delay_standing, delay_view
from tidemq_server.broker.store.types import StoredRecord


def _stored(topic: str, props: dict[str, str], n: int = 0) -> StoredRecord:
    return StoredRecord(physical_offset=n, size=1, topic=topic, queue_id=0, queue_offset=n,
                        body=b"", properties={"UNIQ_KEY": "m", **props}, flag=0, sys_flag=0,
                        born_timestamp=1, born_host="", store_timestamp=n, store_host="",
                        reconsume_times=0, prepared_tx_offset=0)


WAITING = _stored(INTAKE_TOPIC, {REAL_TOPIC: "Orders", REAL_QID: "2", TIMER_DELIVER_MS: "9"})


def test_message_state_of_a_delayed_message() -> None:
    shown, state = delay_view([WAITING]) or (None, None)
    assert state is MessageState.SCHEDULED and shown is not None
    assert (shown.topic, shown.queue_id) == ("Orders", 2)
    cancel = _stored(SystemTopic.TIMER_CANCELS, {REAL_TOPIC: "Orders"}, 2)
    assert delay_view([WAITING, cancel])[1] is MessageState.CANCELLED  # type: ignore[index]
    delivered = _stored("Orders", {}, 3)
    assert delay_view([WAITING, delivered]) is None  # stored: the default view
    half = _stored("RMQ_SYS_TRANS_HALF_TOPIC", {}, 4)
    assert delay_view([WAITING, half])[1] is MessageState.SCHEDULED  # type: ignore[index]


def test_a_repeated_delayed_send_learns_its_standing() -> None:
    assert delay_standing([WAITING], "Orders") is None  # still waiting
    cancel = _stored(SystemTopic.TIMER_CANCELS, {REAL_TOPIC: "Orders"}, 2)
    assert delay_standing([WAITING, cancel], "Orders") == {"state": "cancelled"}
    delivered = _stored("Orders", {}, 3)
    assert delay_standing([WAITING, delivered], "Orders") == {
        "state": "stored", "queue_id": 0, "queue_offset": 3}
    assert delay_standing([WAITING, delivered], "Other") is None  # another topic's message
    assert delay_standing([WAITING, delivered]) == {
        "state": "stored", "queue_id": 0, "queue_offset": 3}


def test_each_copy_of_a_trace_is_named() -> None:
    assert copy_kind(WAITING, "", False) == "delayed"
    assert copy_kind(_stored("Orders", {}, 3), "", True) == "delivered"
    assert copy_kind(_stored("Orders", {}, 3), "", False) == "stored"
    assert copy_kind(_stored("RMQ_SYS_TRANS_HALF_TOPIC", {}, 4), "t", False) == "half"
    assert copy_kind(_stored("%DLQ%g", {"RETRY_TOPIC": "Orders"}, 5), "", False) == "dlq"
    assert copy_kind(_stored("%RETRY%g", {"RETRY_TOPIC": "Orders"}, 5), "", False) == "retry"
