"""One behaviour suite, two systems: the in-memory ``TestBroker`` and real processes.

Every test takes ``system``: "memory" (``tidemq.testing.memory.TestBroker``, a fresh one per
test, its clock moved by the test) or "real" (``tidemq.testing.TidemqSystem``: redis-server,
nameserver, broker, checker and scheduler, started once for this module). Both run the same
assertions through the SDK's clients and the public REST API, so the test broker cannot drift
from the real one. Time: ``elapse(s)`` moves the memory broker's clock; on the real system
time passes by itself, and the waits (``wait_for_message``, ``eventually``) cover it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from tidemq import (
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
    TopicNotFoundError,
    TransactionProducer,
    TransactionState,
)
from tidemq.protocol import CONSUME_FAILURE, CONTENT_JSON, decode_payload
from tidemq.testing import TidemqSystem
from tidemq.testing.memory import TestBroker

from tests.support.wait import wait_until_async

# the real test system's settings (tidemq.testing._system), mirrored by the memory broker
LEVELS_S = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1, 1, 1, 1, 1, 1, 1, 1)
MAX_RECONSUME = 3
TRANSACTION_TIMEOUT_S = 1.0
WAIT_S = 20.0  # a real system on a loaded 2-core machine


class System(ABC):
    """What a behaviour test needs of a system."""

    kind: str

    @abstractmethod
    async def create_topic(self) -> str: ...

    @abstractmethod
    def clients(self) -> dict[str, Any]:
        """Keyword arguments that connect any SDK client to this system."""

    @abstractmethod
    async def elapse(self, seconds: float) -> None:
        """Memory: move the clock; real: nothing (time passes while the test waits)."""

    @abstractmethod
    async def check_now(self) -> None:
        """Let due transaction checks happen now."""

    @abstractmethod
    async def wait_for_message(self, topic: str, message_id: str) -> ReceivedMessage: ...

    @abstractmethod
    async def rest(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                   body: Any = None) -> tuple[int, Any]:
        """One request to the broker's REST API: (status, decoded answer)."""

    async def eventually(self, check: Callable[[], Awaitable[Any]], step_s: float,
                         what: str) -> Any:
        """``check()`` until it answers something true; between tries the memory clock
        moves ``step_s`` (real time passes by itself)."""
        deadline = time.monotonic() + WAIT_S
        while not (got := await check()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await self.elapse(step_s)
            await asyncio.sleep(0.02)  # let the clients run
        return got


class Memory(System):
    kind = "memory"

    def __init__(self) -> None:
        self.broker = TestBroker(delay_levels_s=LEVELS_S, max_reconsume_times=MAX_RECONSUME,
                                 transaction_timeout_s=TRANSACTION_TIMEOUT_S)

    async def create_topic(self) -> str:
        return self.broker.create_topic()

    def clients(self) -> dict[str, Any]:
        return self.broker.client_options()

    async def elapse(self, seconds: float) -> None:
        self.broker.advance(seconds)

    async def check_now(self) -> None:
        self.broker.advance(TRANSACTION_TIMEOUT_S)

    async def wait_for_message(self, topic: str, message_id: str) -> ReceivedMessage:
        return await self.broker.wait_for_message(topic, message_id=message_id,
                                                  timeout_s=WAIT_S)

    async def rest(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                   body: Any = None) -> tuple[int, Any]:
        answer = await self.broker.transport.request(
            method, self.broker.broker_url + path,
            headers={"content-type": CONTENT_JSON, "accept": CONTENT_JSON},
            content=None if body is None else orjson.dumps(body),
            params=dict(params or {}), timeout_s=WAIT_S)
        return answer.status, decode_payload(answer.content, CONTENT_JSON)


class Real(System):
    kind = "real"

    def __init__(self, system: TidemqSystem) -> None:
        self.system = system

    async def create_topic(self) -> str:
        return await self.system.create_topic()

    def clients(self) -> dict[str, Any]:
        return {"nameservers": self.system.nameservers}

    async def elapse(self, seconds: float) -> None:
        pass  # real time passes while the test waits

    async def check_now(self) -> None:
        await self.system.check_now()

    async def wait_for_message(self, topic: str, message_id: str) -> ReceivedMessage:
        return await self.system.wait_for_message(topic, message_id=message_id,
                                                  timeout_s=WAIT_S)

    async def rest(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                   body: Any = None) -> tuple[int, Any]:
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            resp = await http.request(method, self.system.broker_url + path, params=params,
                                      json=body)
        return resp.status_code, resp.json()


@pytest.fixture(scope="module")
def real_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TidemqSystem]:
    with TidemqSystem(Path(tmp_path_factory.mktemp("behaviour"))) as system:
        yield system


@pytest.fixture(params=["memory", pytest.param("real", marks=pytest.mark.integration)])
async def system(request: pytest.FixtureRequest) -> AsyncIterator[System]:
    if request.param == "memory":
        memory = Memory()
        yield memory
        memory.broker.close()
    else:
        yield Real(request.getfixturevalue("real_system"))


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Listener:
    """A transaction listener: the local outcome by ``arg``, and what its checks answer."""

    def __init__(self, on_check: TransactionState = TransactionState.COMMIT) -> None:
        self.on_check = on_check
        self.checked: list[ReceivedMessage] = []

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState(arg)

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        self.checked.append(message)
        return self.on_check


async def _state(system: System, message_id: str) -> str | None:
    status, answer = await system.rest("GET", f"/v1/messages/{message_id}")
    return answer["state"] if status == 200 else None


async def _stored(system: System, topic: str) -> int:
    status, answer = await system.rest("GET", f"/v1/topics/{topic}")
    assert status == 200, answer
    return sum(q["max"] - q["min"] for q in answer["offsets"])


# -- sending and consuming ---------------------------------------------------------------------

async def test_round_trip_keeps_keys_tag_and_properties(system: System) -> None:
    topic = await system.create_topic()
    got: list[ReceivedMessage] = []

    async def handle(message: ReceivedMessage) -> None:
        got.append(message)

    async with Producer(**system.clients()) as producer:
        sent = await producer.send(b"order 42 paid", topic=topic, tag="Paid",
                                   keys=["order-42"], properties={"source": "web"})
    async with PushConsumer(_name("g"), handler=handle, subscriptions={topic: "*"},
                            **system.clients()):
        await wait_until_async(lambda: got, timeout=WAIT_S, what="the message consumed")
    m = got[0]
    assert (m.message_id, m.topic, m.body, m.tag) == (sent.message_id, topic,
                                                      b"order 42 paid", "Paid")
    assert m.keys == ["order-42"] and m.properties == {"source": "web"}
    assert (m.queue_id, m.queue_offset) == (sent.queue_id, sent.queue_offset)
    status, found = await system.rest("GET", "/v1/messages",
                                      params={"topic": topic, "key": "order-42"})
    assert status == 200 and [f["message_id"] for f in found["messages"]] == [sent.message_id]


async def test_other_tags_are_skipped(system: System) -> None:
    topic = await system.create_topic()
    async with Producer(**system.clients()) as producer:
        for tag in ("A", "B", None, "C", "A"):
            await producer.send(tag or b"untagged", topic=topic, tag=tag, queue_id=0)
    status, page = await system.rest("GET", f"/v1/topics/{topic}/queues/0/messages",
                                     params={"offset": 0, "tags": "A || C"})
    assert status == 200, page
    assert [m["tag"] for m in page["messages"]] == ["A", "C", "A"]
    assert page["next_offset"] == 5
    got: list[str | None] = []

    async def handle(message: ReceivedMessage) -> None:
        got.append(message.tag)

    async with PushConsumer(_name("g"), handler=handle, subscriptions={topic: "A || C"},
                            **system.clients()):
        await wait_until_async(lambda: len(got) >= 3, timeout=WAIT_S, what="A, C, A")
    assert sorted(t or "" for t in got) == ["A", "A", "C"]


async def test_a_resent_message_id_is_stored_once(system: System) -> None:
    topic = await system.create_topic()
    async with Producer(**system.clients()) as producer:
        first = await producer.send(b"once", topic=topic, message_id="resent-1")
        again = await producer.send(b"once", topic=topic, message_id="resent-1")
    assert (again.queue_id, again.queue_offset) == (first.queue_id, first.queue_offset)
    assert await _stored(system, topic) == 1


async def test_a_batch_is_stored_in_order(system: System) -> None:
    topic = await system.create_topic()
    async with Producer(**system.clients()) as producer:
        results = await producer.send_batch(topic, [b"one", b"two", b"three"])
    assert len({r.message_id for r in results}) == 3
    for result, body in zip(results, (b"one", b"two", b"three"), strict=True):
        got = await system.wait_for_message(topic, result.message_id)
        assert got.body == body and got.queue_offset == result.queue_offset


async def test_failures_are_retried_then_dead_lettered(system: System) -> None:
    topic, group = await system.create_topic(), _name("billing")
    seen: list[int] = []

    async def fail(message: ReceivedMessage) -> None:
        seen.append(message.reconsume_times)
        raise RuntimeError("cannot bill this")

    async def dead_letters() -> list[dict[str, Any]]:
        status, page = await system.rest("GET", f"/v1/topics/%25DLQ%25{group}/queues/0/messages",
                                         params={"offset": 0})
        return page["messages"] if status == 200 else []

    async with Producer(**system.clients()) as producer:
        sent = await producer.send(b"poison", topic=topic)
    async with PushConsumer(group, handler=fail, subscriptions={topic: "*"},
                            heartbeat_interval_s=0.2, pull_wait_ms=1000, **system.clients()):
        letters = await system.eventually(dead_letters, 1.0, "the dead letter")
    assert seen == list(range(MAX_RECONSUME + 1))  # the first try and every retry
    assert [(m["message_id"], m["reconsume_times"], m["origin_topic"]) for m in letters] \
        == [(sent.message_id, MAX_RECONSUME + 1, topic)]
    assert "cannot bill this" in letters[0]["properties"][CONSUME_FAILURE]


# -- transactions ------------------------------------------------------------------------------

async def test_commit_is_delivered_once_and_rollback_never(system: System) -> None:
    topic = await system.create_topic()
    async with TransactionProducer(_name("tx"), Listener(), **system.clients()) as producer:
        committed = await producer.send(b"commit", TransactionState.COMMIT, topic=topic)
        rolled = await producer.send(b"rollback", TransactionState.ROLLBACK, topic=topic)
    got = await system.wait_for_message(topic, committed.message_id)
    assert got.body == b"commit"
    assert await _state(system, committed.message_id) == "committed"
    assert await _state(system, rolled.message_id) == "rolled_back"
    assert await _stored(system, topic) == 1


async def test_an_unknown_transaction_is_checked_then_committed(system: System) -> None:
    topic = await system.create_topic()
    listener = Listener(on_check=TransactionState.COMMIT)
    async with TransactionProducer(_name("tx"), listener, heartbeat_interval_s=1.0,
                                   check_wait_ms=1000, **system.clients()) as producer:
        sent = await producer.send(b"later", TransactionState.UNKNOWN, topic=topic,
                                   check_immunity_s=3)
        assert await _state(system, sent.message_id) == "half"  # not consumable yet
        assert await _stored(system, topic) == 0

        async def checked() -> bool:
            await system.check_now()
            return bool(listener.checked)

        await system.eventually(checked, 1.0, "a check of the unknown transaction")
        got = await system.wait_for_message(topic, sent.message_id)
    assert got.body == b"later"
    assert listener.checked[0].message_id == sent.message_id
    assert await _state(system, sent.message_id) == "committed"


# -- delays ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("delay", "delay_s"), [({"delay_ms": 1500}, 1.5),
                                                ({"delay_level": 10}, 1.0)],  # 1 s in both
                         ids=["delay_ms", "delay_level"])
async def test_a_delayed_message_comes_on_time_never_early(
        system: System, delay: dict[str, int], delay_s: float) -> None:
    topic = await system.create_topic()
    async with Producer(**system.clients()) as producer:
        sent = await producer.send(b"later", topic=topic, delay_ms=delay.get("delay_ms"),
                                   delay_level=delay.get("delay_level"))
    assert sent.state == "scheduled" and sent.deliver_at_ms is not None
    assert await _state(system, sent.message_id) == "scheduled"
    await system.elapse(delay_s - 0.5)
    assert await _stored(system, topic) == 0  # not before its time
    await system.elapse(0.6)
    got = await system.wait_for_message(topic, sent.message_id)
    assert got.body == b"later"
    assert got.store_timestamp_ms >= sent.deliver_at_ms
    assert await _state(system, sent.message_id) == "stored"


async def test_a_cancelled_delay_is_never_delivered(system: System) -> None:
    topic = await system.create_topic()
    async with Producer(**system.clients()) as producer:
        sent = await producer.send(b"never", topic=topic, delay_ms=60_000)
    path = f"/v1/messages/{sent.message_id}/schedule"
    status, answer = await system.rest("DELETE", path)
    assert (status, answer["state"]) == (200, "cancelled"), answer
    status, answer = await system.rest("DELETE", path)  # again: the same answer
    assert (status, answer["state"]) == (200, "cancelled"), answer
    await system.elapse(61)
    status, scheduled = await system.rest("GET", "/v1/scheduled", params={"topic": topic})
    assert status == 200 and scheduled["pending"] == 0
    assert await _state(system, sent.message_id) == "cancelled"
    assert await _stored(system, topic) == 0
    status, answer = await system.rest("DELETE", "/v1/messages/no-such-id/schedule")
    assert (status, answer["code"]) == (404, "MESSAGE_NOT_FOUND")


# -- simple consumer ---------------------------------------------------------------------------

async def test_an_unacked_message_comes_back_after_its_invisibility(system: System) -> None:
    topic = await system.create_topic()
    async with Producer(**system.clients()) as producer:
        sent = await producer.send(b"work", topic=topic)
    async with SimpleConsumer(_name("sc"), topic=topic, **system.clients()) as consumer:
        first = await consumer.receive(max=4, invisible_ms=1000, wait_ms=5000)
        assert [m.message_id for m in first] == [sent.message_id]
        assert first[0].reconsume_times == 0
        assert await consumer.receive(max=4, wait_ms=0) == []  # invisible now

        async def again() -> list[ReceivedMessage]:
            return await consumer.receive(max=4, invisible_ms=1000, wait_ms=200)

        await system.elapse(1.0)
        second = await system.eventually(again, 1.0, "the redelivery")
        assert [m.message_id for m in second] == [sent.message_id]
        assert second[0].reconsume_times == 1
        assert await consumer.ack(second) == 1
        assert await consumer.ack(first) == 0  # superseded by the redelivery
        await system.elapse(1.5)
        assert await consumer.receive(max=4, wait_ms=0) == []


# -- errors ------------------------------------------------------------------------------------

async def test_errors_name_what_is_wrong(system: System) -> None:
    async with Producer(**system.clients()) as producer:
        with pytest.raises(TopicNotFoundError):
            await producer.send(b"x", topic=_name("NoSuchTopic"))
    topic = await system.create_topic()
    for path, body, expected in [
        (f"/v1/topics/{_name('Missing')}/messages", {"messages": [{"body": "x"}]},
         (404, "TOPIC_NOT_FOUND")),
        ("/v1/topics/bad%20name/messages", {"messages": [{"body": "x"}]},
         (400, "INVALID_TOPIC_NAME")),
        (f"/v1/topics/{topic}/messages", {"messages": [{"body": "x", "delay_level": 19}]},
         (400, "INVALID_DELAY")),
        (f"/v1/topics/{topic}/messages", {"messages": [{"body": "x", "delay_ms": -1}]},
         (400, "INVALID_DELAY")),
        ("/v1/topics/%25RETRY%25g/messages", {"messages": [{"body": "x"}]},
         (403, "FORBIDDEN_SYSTEM_TOPIC")),
    ]:
        status, answer = await system.rest("POST", path, body=body)
        assert (status, answer.get("code")) == expected, (path, answer)
        assert answer["message"]
    assert await _stored(system, topic) == 0
