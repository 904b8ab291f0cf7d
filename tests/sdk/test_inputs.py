"""Loose inputs to the SDK (issue 34 items 3-6): delays as whole floats, ``timedelta`` and
``datetime`` are taken; a wrong type is a ``ConfigurationError`` naming the argument, raised
before anything is sent; endpoints as one URL, comma-separated URLs, a list or
``TIDEMQ_NAMESERVER_URL``; bad group, topic and tag names fail when the consumer is built."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from tidemq import (
    BadRequestError,
    ConfigurationError,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    Router,
    SimpleConsumer,
    TransactionProducer,
    TransactionState,
)

from tests.sdk.fakes import FakeCluster

#: (keyword argument, a value of the wrong type): each must be refused, naming the argument
BAD_OPTIONS: list[tuple[str, Any]] = [
    ("delay_ms", "1000"),
    ("delay_ms", 1000.5),  # not a whole number of milliseconds
    ("delay_ms", True),
    ("deliver_at_ms", "2030-01-01"),
    ("deliver_at_ms", datetime(2030, 1, 1).date()),
    ("keys", 123),
    ("keys", [1, 2]),
    ("properties", {"a": 1}),
    ("properties", ["a"]),
    ("tag", 5),
    ("queue_id", "0"),
    ("queue_id", True),
    ("message_id", 123),
    ("sharding_key", 7),
    ("delay_level", True),
    ("delay_level", "2"),
]
BAD_IDS = [f"{name}={value!r}" for name, value in BAD_OPTIONS]


class _Listener:
    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState.COMMIT

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.COMMIT


async def _handler(message: ReceivedMessage) -> None:
    return None


def _any(value: Any) -> Any:
    """``value`` with its type hidden from mypy: these tests pass wrong types on purpose."""
    return value


def _producer(cluster: FakeCluster, **kw: Any) -> Producer:
    kw.setdefault("broker_url", cluster.broker_url)
    return Producer(transport=cluster.transport, **kw)


# -- item 3: delays as whole floats, timedelta and datetime ---------------------------------

def test_delays_take_whole_floats_timedelta_and_datetime() -> None:
    assert Message(b"x", delay_ms=30 * 60 * 1000.0).delay_ms == 1_800_000
    assert type(Message(b"x", delay_ms=5.0).delay_ms) is int
    assert Message(b"x", delay_ms=timedelta(minutes=30)).delay_ms == 1_800_000
    assert Message(b"x", delay_ms=timedelta(microseconds=1500)).delay_ms == 1  # rounded down
    aware = datetime(2030, 1, 1, 12, 0, 0, 250_900, tzinfo=UTC)
    assert Message(b"x", deliver_at_ms=aware).deliver_at_ms == 1_893_499_200_250
    plus_two = aware.astimezone(timezone(timedelta(hours=2)))  # the same instant
    assert Message(b"x", deliver_at_ms=plus_two).deliver_at_ms == 1_893_499_200_250
    naive = datetime(2030, 1, 1, 12, 0, 0)  # local time, as datetime.timestamp() reads it
    assert Message(b"x", deliver_at_ms=naive).deliver_at_ms == int(naive.timestamp() * 1000)
    assert Message(b"x", deliver_at_ms=1_893_499_200_000.0).deliver_at_ms == 1_893_499_200_000


async def test_a_float_delay_is_sent_as_whole_milliseconds(cluster: FakeCluster) -> None:
    """Before: ``delay_ms=1800000.0`` failed deep in the batch encoder with ``UnfitBatch``."""
    due = datetime.now(UTC) + timedelta(hours=1)
    async with _producer(cluster) as producer:
        await producer.send(b"a", topic="orders", delay_ms=30 * 60 * 1000.0)
        await producer.send(b"b", topic="orders", delay_ms=timedelta(seconds=90))
        await producer.send(Message(b"c", topic="orders", deliver_at_ms=due))
        await producer.send_batch("orders", [Message(b"d", delay_ms=2000.0)])
    sent = [m for r in cluster.requests_to("/v1/topics/orders/messages")
            for m in r.body["messages"]]
    assert [m.get("delay_ms") for m in sent] == [1_800_000, 90_000, None, 2000]
    assert sent[2]["deliver_at_ms"] == int(due.timestamp() * 1000)


# -- item 4: wrong types are ConfigurationError naming the argument, nothing sent ------------

@pytest.mark.parametrize(("name", "value"), BAD_OPTIONS, ids=BAD_IDS)
def test_message_refuses_a_wrong_type(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Message(b"x", topic="orders", **{name: value})


@pytest.mark.parametrize(("name", "value"), BAD_OPTIONS, ids=BAD_IDS)
async def test_send_refuses_a_wrong_type_before_sending(cluster: FakeCluster, name: str,
                                                        value: Any) -> None:
    async with _producer(cluster) as producer:
        with pytest.raises(ConfigurationError, match=name):
            await producer.send(b"x", topic="orders", **{name: value})
        with pytest.raises(ConfigurationError, match=name):
            await producer.send_oneway(b"x", topic="orders", **{name: value})
    assert cluster.requests == []


@pytest.mark.parametrize(("name", "value"), [("message_id", 123), ("properties", {"a": 1}),
                                             ("properties", "a=1")])
async def test_the_bare_body_path_refuses_a_wrong_type(cluster: FakeCluster, name: str,
                                                       value: Any) -> None:
    """``send(body, topic=..., message_id=/properties=)`` skips building a Message."""
    async with _producer(cluster) as producer:
        with pytest.raises(ConfigurationError, match=name):
            await producer.send(b"x", topic="orders", **{name: value})
    assert cluster.requests == []


async def test_send_batch_refuses_a_message_of_another_topic(cluster: FakeCluster) -> None:
    cluster.create_topic("Bad")
    async with _producer(cluster) as producer:
        with pytest.raises(ConfigurationError, match=r"messages\[1\] has topic='Orders'.*'Bad'"):
            await producer.send_batch("Bad", [b"a", Message(b"b", topic="Orders")])
        for not_a_list in (b"ab", Message(b"a"), 5):
            with pytest.raises(ConfigurationError, match="send_batch: messages must be a list"):
                await producer.send_batch("Bad", _any(not_a_list))
        results = await producer.send_batch("Bad", [Message(b"c", topic="Bad")])  # its own
    assert [r.topic for r in results] == ["Bad"]
    assert len(cluster.requests_to("/v1/topics/Bad/messages")) == 1


async def test_transactional_send_refuses_a_wrong_type_before_sending(
    cluster: FakeCluster,
) -> None:
    async with TransactionProducer("tx-group", _Listener(), broker_url=cluster.broker_url,
                                   transport=cluster.transport) as producer:
        for name, value in [("keys", 123), ("properties", {"a": 1}), ("tag", 5),
                            ("message_id", 123), ("sharding_key", 7)]:
            with pytest.raises(ConfigurationError, match=name):
                await producer.send(b"x", topic="orders", **_any({name: value}))
        with pytest.raises(ConfigurationError, match="delay_ms"):
            await producer.send(Message(b"x", topic="orders", delay_ms=_any("1000")))
    assert cluster.requests_to("/v1/transactions") == []


# -- item 5: endpoints ---------------------------------------------------------------------

def _clients(endpoints: dict[str, Any], cluster: FakeCluster) -> list[Callable[[], Any]]:
    t = cluster.transport
    return [
        lambda: Producer(transport=t, **endpoints),
        lambda: TransactionProducer("tx-group", _Listener(), transport=t, **endpoints),
        lambda: PushConsumer("g1", handler=_handler, transport=t, **endpoints),
        lambda: SimpleConsumer("g1", topic="orders", transport=t, **endpoints),
    ]


CLIENTS = ["Producer", "TransactionProducer", "PushConsumer", "SimpleConsumer"]


@pytest.mark.parametrize("index", range(4), ids=CLIENTS)
def test_nameservers_as_one_url_or_comma_separated(cluster: FakeCluster, index: int) -> None:
    one = _clients({"nameservers": "http://ns0:9876/"}, cluster)[index]()
    assert one._endpoints.nameservers == ("http://ns0:9876",)
    two = _clients({"nameservers": " http://ns0:9876 , http://ns1:9876,"}, cluster)[index]()
    assert two._endpoints.nameservers == ("http://ns0:9876", "http://ns1:9876")


@pytest.mark.parametrize("index", range(4), ids=CLIENTS)
def test_missing_endpoints_say_what_is_missing(cluster: FakeCluster, index: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEMQ_NAMESERVER_URL", raising=False)
    with pytest.raises(ConfigurationError, match="nameservers: is empty") as empty:
        _clients({"nameservers": []}, cluster)[index]()
    with pytest.raises(ConfigurationError, match="TIDEMQ_NAMESERVER_URL") as none:
        _clients({}, cluster)[index]()
    assert "not both" not in str(empty.value) + str(none.value)
    with pytest.raises(ConfigurationError, match="not both"):
        _clients({"nameservers": ["http://ns0:9876"], "broker_url": "http://b:1"},
                 cluster)[index]()
    with pytest.raises(ConfigurationError, match="nameservers: every entry"):
        _clients({"nameservers": ["http://ns0:9876", 9876]}, cluster)[index]()
    # as before: an empty list beside a broker_url means the broker
    beside = _clients({"nameservers": [], "broker_url": cluster.broker_url}, cluster)[index]()
    assert beside._endpoints.broker_url == cluster.broker_url


@pytest.mark.parametrize("index", range(4), ids=CLIENTS)
def test_nameservers_from_the_environment(cluster: FakeCluster, index: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMQ_NAMESERVER_URL", "http://ns0:9876,http://ns1:9876/")
    client = _clients({}, cluster)[index]()
    assert client._endpoints.nameservers == ("http://ns0:9876", "http://ns1:9876")
    direct = _clients({"broker_url": cluster.broker_url}, cluster)[index]()  # given: it wins
    assert direct._endpoints.nameservers == () and direct._endpoints.broker_url


async def test_a_producer_given_one_nameserver_url_sends(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Before: the string was read as a list of characters (``tried http://h, http://t``)."""
    cluster = FakeCluster(nameservers=2)
    cluster.create_topic("orders")
    async with Producer(nameservers=cluster.nameservers[1], transport=cluster.transport,
                        ) as producer:
        await producer.send(b"x", topic="orders")
    monkeypatch.setenv("TIDEMQ_NAMESERVER_URL", cluster.nameservers[0])
    async with Producer(transport=cluster.transport) as producer:
        await producer.send(b"y", topic="orders")
    asked = [r.host for r in cluster.requests if r.path.startswith("/v1/routes/")]
    assert asked == [cluster.nameservers[1], cluster.nameservers[0]]


# -- item 6: names checked when a consumer or route is built --------------------------------

def test_consumers_refuse_bad_group_topic_and_tag_names(cluster: FakeCluster) -> None:
    t, url = cluster.transport, cluster.broker_url
    with pytest.raises(ConfigurationError, match="group: group name 'bad g'"):
        PushConsumer("bad g", handler=_handler, broker_url=url, transport=t)
    with pytest.raises(ConfigurationError, match="topic: topic name 'bad t'"):
        PushConsumer("g1", handler=_handler, broker_url=url, transport=t,
                     subscriptions={"bad t": "*"})
    consumer = PushConsumer("g1", handler=_handler, broker_url=url, transport=t)
    with pytest.raises(ConfigurationError, match="topic: topic name 'bad t'"):
        consumer.subscribe("bad t")
    with pytest.raises(ConfigurationError, match="tag_expression: must be a string"):
        consumer.subscribe("orders", _any(5))
    with pytest.raises(ConfigurationError, match=re.escape("tag expression 'a || '")):
        consumer.subscribe("orders", "a || ")
    assert consumer.subscriptions == {}
    with pytest.raises(ConfigurationError, match="group: group name 'bad g'"):
        SimpleConsumer("bad g", topic="orders", broker_url=url, transport=t)
    with pytest.raises(ConfigurationError, match="topic: topic name 'bad t'"):
        SimpleConsumer("g1", topic="bad t", broker_url=url, transport=t)
    with pytest.raises(ConfigurationError, match="tag expression"):
        SimpleConsumer("g1", topic="orders", tag_expression="a ||| b", broker_url=url,
                       transport=t)
    with pytest.raises(ConfigurationError, match="producer group: group name 'bad g'"):
        TransactionProducer("bad g", _Listener(), broker_url=url, transport=t)
    assert cluster.requests == []


def test_router_refuses_bad_topic_and_tag_names() -> None:
    router = Router()
    with pytest.raises(ConfigurationError, match="topic: topic name 'bad name'"):
        router.handler("bad name")
    with pytest.raises(ConfigurationError, match="tag: one tag"):
        router.handler("orders", tag="a|b")
    with pytest.raises(ConfigurationError, match="tag: one tag"):
        router.handler("orders", tag=" a")
    with pytest.raises(ConfigurationError, match="tag: must be a string"):
        router.handler("orders", tag=_any(5))
    assert router.subscriptions == {}


async def test_bools_and_strings_are_not_integers_anywhere(cluster: FakeCluster) -> None:
    """``True`` passes for 1 in Python; no integer argument of the SDK takes it."""
    t, url = cluster.transport, cluster.broker_url
    for name in ("max_batch", "max_in_flight"):
        with pytest.raises(ConfigurationError, match=name):
            Producer(broker_url=url, transport=t, **_any({name: True}))
    for name in ("max_concurrency", "pull_batch", "pull_wait_ms"):
        with pytest.raises(ConfigurationError, match=name):
            PushConsumer("g1", handler=_handler, broker_url=url, transport=t,
                         **_any({name: True}))
    with pytest.raises(ConfigurationError, match="check_max"):
        TransactionProducer("tx-group", _Listener(), broker_url=url, transport=t,
                            check_max=True)
    with pytest.raises(ConfigurationError, match="invisible_ms"):
        SimpleConsumer("g1", topic="orders", broker_url=url, transport=t,
                       invisible_ms=_any("30000"))
    async with SimpleConsumer("g1", topic="orders", broker_url=url, transport=t) as simple:
        for kwargs in ({"max": True}, {"invisible_ms": "1000"}, {"wait_ms": 1.5}):
            with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
                await simple.receive(**kwargs)
    assert cluster.requests == []


@pytest.mark.parametrize("name", ["TIDE_CONSUME_FAILURE", "TIDE_ANYTHING", "TRAN_MSG"])
async def test_a_reserved_property_is_refused_before_sending(cluster: FakeCluster,
                                                             name: str) -> None:
    """The broker refuses ``TIDE_*`` and system property names (400): the SDK says so first,
    e.g. for a consumer forwarding a received message with its properties."""
    async with _producer(cluster) as producer:
        for call in (lambda: producer.send(b"x", topic="orders", properties={name: "v"}),
                     lambda: producer.send(Message(b"x", topic="orders",
                                                   properties={"ok": "1", name: "v"})),
                     lambda: producer.send_batch("orders", [Message(b"x",
                                                                    properties={name: "v"})])):
            with pytest.raises(BadRequestError, match=name):
                await call()
    assert cluster.requests == []
