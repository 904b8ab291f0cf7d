"""``cancel_delayed`` over two broker groups behind httpx.MockTransport: the hinted group is
asked first, the others after it; a group that does not answer is asked again at the primary a
refreshed route names (a failover); the answers map to ``CancelResult`` and the SDK's errors.
The same calls on real processes: tests/sdk/test_cancel_delayed_cluster.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tidemq import (
    AlreadyDeliveredError,
    CancelResult,
    CancelState,
    ConfigurationError,
    InvalidTopicNameError,
    Message,
    MessageNotFoundError,
    Producer,
    ReceivedMessage,
    RetryPolicy,
    TransactionProducer,
    TransactionState,
    UnavailableError,
)

from tests.sdk.fakes import FakeCluster

FAST = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.01, max_attempts=4)
NS = "http://ns:9876"
TOPIC = "orders"


class Groups:
    """A nameserver and broker groups: ``primary`` names each group's address, ``holds`` what
    each address answers a cancel with (status, code or state)."""

    def __init__(self) -> None:
        self.primary = {"g-a": "http://a1:10911", "g-b": "http://b1:10911"}
        self.answers: dict[str, tuple[int, str]] = {}
        self.down: set[str] = set()
        self.asked: list[tuple[str, dict[str, str]]] = []
        self.routes_asked = 0
        self.transport = httpx.MockTransport(self._serve)

    def _serve(self, request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if origin == NS:
            self.routes_asked += 1
            return httpx.Response(200, json={"topic": TOPIC, "queues": [
                {"broker_name": n, "address": a, "queues": 2, "perm": "rw"}
                for n, a in self.primary.items()]})
        assert request.method == "DELETE", request
        self.asked.append((origin, dict(request.url.params)))
        if origin in self.down:
            raise httpx.ConnectError("refused", request=request)
        status, what = self.answers.get(origin, (404, "MESSAGE_NOT_FOUND"))
        if status == 200:
            return httpx.Response(200, json={"message_id": "m1", "state": what})
        return httpx.Response(status, json={"code": what, "message": f"fake {what}"})


class NoTransactions:
    """A listener never called here (no transactional send)."""

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        raise AssertionError("not called")

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        raise AssertionError("not called")


def producer(g: Groups, cls: Any = Producer) -> Any:
    if cls is TransactionProducer:
        return TransactionProducer(group="tx", listener=NoTransactions(),
                                   nameservers=[NS], transport=g.transport, retry=FAST)
    return Producer(nameservers=[NS], transport=g.transport, retry=FAST)


async def test_the_hinted_group_first_then_the_others() -> None:
    g = Groups()
    g.answers["http://a1:10911"] = (200, "cancelled")
    async with producer(g) as p:
        result = await p.cancel_delayed(TOPIC, "m1", broker_name="g-b")
    assert result == CancelResult("m1", TOPIC, CancelState.CANCELLED, "g-a")
    assert [o for o, _ in g.asked] == ["http://b1:10911", "http://a1:10911"]
    assert all(params == {"topic": TOPIC} for _, params in g.asked)  # never another topic's
    g.asked.clear()
    async with producer(g) as p:
        assert (await p.cancel_delayed(TOPIC, "m1", broker_name="g-a")).broker_name == "g-a"
    assert [o for o, _ in g.asked] == ["http://a1:10911"]


async def test_a_failover_is_followed_to_the_new_primary() -> None:
    g = Groups()
    g.down.add("http://b1:10911")
    g.answers["http://b2:10911"] = (200, "cancelled")
    async with producer(g) as p:
        await p._routes.get(TOPIC)  # the route before the failover
        g.primary["g-b"] = "http://b2:10911"  # b2 promoted; the cached route names b1
        result = await p.cancel_delayed(TOPIC, "m1", broker_name="g-b")
    assert result.broker_name == "g-b" and result.state is CancelState.CANCELLED
    # a1 said not found once and is not asked again; b1 failed, b2 answered after a refresh
    assert [o for o, _ in g.asked] == ["http://b1:10911", "http://a1:10911", "http://b2:10911"]


async def test_a_group_that_never_answers_fails_the_cancel_retriably() -> None:
    g = Groups()
    g.answers["http://b1:10911"] = (503, "UNAVAILABLE")
    async with producer(g) as p:
        with pytest.raises(UnavailableError) as caught:
            await p.cancel_delayed(TOPIC, "m1")
    assert caught.value.retriable
    assert [o for o, _ in g.asked].count("http://b1:10911") == FAST.max_attempts
    assert [o for o, _ in g.asked].count("http://a1:10911") == 1


async def test_a_full_disk_is_waited_out_not_raised() -> None:
    """A cancel cannot move to another group: it retries DISK_FULL until space comes back."""
    g = Groups()
    g.answers["http://b1:10911"] = (503, "DISK_FULL")
    real_serve = g._serve

    def freed_after_two(request: httpx.Request) -> httpx.Response:
        if sum(o == "http://b1:10911" for o, _ in g.asked) == 2:
            g.answers["http://b1:10911"] = (200, "cancelled")  # retention freed space
        return real_serve(request)

    g.transport = httpx.MockTransport(freed_after_two)
    async with producer(g) as p:
        result = await p.cancel_delayed(TOPIC, "m1", broker_name="g-b")
    assert result == CancelResult("m1", TOPIC, CancelState.CANCELLED, "g-b")
    assert [o for o, _ in g.asked].count("http://b1:10911") == 3


@pytest.mark.parametrize("cls", [Producer, TransactionProducer])
async def test_delivered_and_not_found(cls: Any) -> None:
    g = Groups()
    p = producer(g, cls)  # not started: a transaction producer would poll for checks
    try:
        with pytest.raises(MessageNotFoundError, match="g-a, g-b"):
            await p.cancel_delayed(TOPIC, "m1")
        g.answers["http://b1:10911"] = (409, "ALREADY_DELIVERED")
        with pytest.raises(AlreadyDeliveredError):
            await p.cancel_delayed(TOPIC, "m1")
    finally:
        await p.close()


async def test_bad_arguments() -> None:
    g = Groups()
    async with producer(g) as p:
        with pytest.raises(ConfigurationError, match="message_id"):
            await p.cancel_delayed(TOPIC, "")
        with pytest.raises(ConfigurationError, match="message_id"):
            await p.cancel_delayed(TOPIC, "x" * 65)
        with pytest.raises(InvalidTopicNameError):
            await p.cancel_delayed("no spaces", "m1")
    assert g.asked == []


async def test_a_send_result_names_the_group_that_stored_it(two_brokers: FakeCluster) -> None:
    async with Producer(nameservers=two_brokers.nameservers, transport=two_brokers.transport,
                        retry=FAST) as p:
        results = [await p.send(f"m{i}", topic=TOPIC) for i in range(8)]
        results += await p.send_batch(TOPIC, [b"x", b"y"])
    stored = {m["message_id"]: b.name for b in two_brokers.iter_brokers()
              for m in b.all_messages(TOPIC)}
    assert {r.message_id: r.broker_name for r in results} == stored
    assert set(stored.values()) == {"broker-0", "broker-1"}
