"""Sends ride over a replicated group's failover (httpx.MockTransport): a dead primary or a
NOT_PRIMARY answer makes the producer ask the nameservers again and wait for the new primary
within its deadline, past its attempt count; a NOT_PRIMARY answer naming a primary the route
knows is followed at once; a route that is read-only (no primary yet) is waited out too;
without replicas a dead broker still fails after max_attempts (when one is given)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from tidemq import (
    Message,
    NotPrimaryError,
    Producer,
    ReceivedMessage,
    RetryPolicy,
    TransactionProducer,
    TransactionState,
    TransportError,
)
from tidemq._fault import electing
from tidemq._routes import parse_route
from tidemq.protocol import CONTENT_MSGPACK, ErrorCode
from tidemq.protocol.codec import encode_payload

from tests.sdk.fakes import FakeCluster, request_payload

TOPIC = "orders"
NS = "http://ns:1"
OLD, NEW = "http://old:1", "http://new:1"
B = "http://b:1"  # broker-b's only broker (WithB)
# 3 attempts only: a failover of a few hundred ms must not be limited by the attempt count
SILENT_TIMEOUT_S = 10.0  # a silent broker's request times out after this (the SDK's default)
FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05, deadline_s=5.0)


class Group:
    """A nameserver whose route names ``primary`` (None: read-only at a replica), and brokers
    that answer as ``answers`` says per address."""

    def __init__(self, *, replicas: bool = True) -> None:
        self.primary: str | None = OLD
        self.replicas = replicas
        self.route_asks = 0
        self.sent: dict[str, list[str]] = {OLD: [], NEW: []}
        self.dead: set[str] = set()
        self.not_primary: set[str] = set()
        self.after_asks: tuple[int, str | None] | None = None  # (asks, new primary)
        self.hint: str | None = None  # the primary a NOT_PRIMARY answer names

    def handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base == NS:
            self.route_asks += 1
            if self.after_asks and self.route_asks >= self.after_asks[0]:
                self.primary = self.after_asks[1]
            address, perm = (self.primary, "rw") if self.primary else (NEW, "r")
            return httpx.Response(200, json={"topic": TOPIC, "queues": [
                {"broker_name": "broker-a", "address": address, "queues": 2, "perm": perm,
                 "replicas": [NEW] if self.replicas else []}]})
        if base in self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        if base in self.not_primary:
            where = self.hint or "unknown"
            return httpx.Response(503, json={"code": "NOT_PRIMARY", "message": (
                f"this broker is a replica (epoch 2); the primary is {where}")})
        body = request_payload(request.content, request.headers.get("content-type"))
        results = []
        for m in body["messages"]:
            self.sent[base].append(m["message_id"])
            results.append({"message_id": m["message_id"], "queue_id": m.get("queue_id", 0),
                            "queue_offset": len(self.sent[base]) - 1, "state": "stored"})
        return httpx.Response(200, content=encode_payload({"results": results}, CONTENT_MSGPACK),
                              headers={"content-type": CONTENT_MSGPACK})


def producer(group: Group) -> Producer:
    return Producer(nameservers=[NS], transport=httpx.MockTransport(group.handler), retry=FAST)


async def test_a_dead_primary_is_waited_out_until_the_new_one_is_routed() -> None:
    group = Group()
    async with producer(group) as p:
        await p.send(b"before", topic=TOPIC)
        group.dead.add(OLD)
        group.after_asks = (group.route_asks + 6, NEW)  # elected after several lookups
        result = await p.send(b"during", topic=TOPIC)
    assert group.sent[NEW] == [result.message_id]
    assert group.route_asks >= 7


class Silent(Group):
    """``Group``, and brokers (``silent``) that take a request and answer nothing until
    ``release`` is set: a paused primary, or one cut off from the client (issue 32)."""

    def __init__(self) -> None:
        super().__init__()
        self.silent: set[str] = set()
        self.release = asyncio.Event()
        self.held = 0  # requests a silent broker took
        self.cancelled: list[str] = []  # where a cancel was answered

    async def async_handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base in self.silent:
            self.held += 1
            try:  # the request's own timeout, as httpcore would raise it (MockTransport: none)
                await asyncio.wait_for(self.release.wait(), SILENT_TIMEOUT_S)
            except TimeoutError:
                raise httpx.ReadTimeout("no answer", request=request) from None
        if request.method == "DELETE":
            self.cancelled.append(base)
            return httpx.Response(200, json={"state": "cancelled"})
        return self.handler(request)


async def test_a_silent_primary_is_left_once_the_nameservers_name_another() -> None:
    """A send and a cancel to a primary that answers nothing are given up once the route names
    the group's new primary, and made there (same message id), long before the request's own
    timeout (10 s) or the old primary's return."""
    group = Silent()
    try:
        async with Producer(nameservers=[NS], retry=FAST,
                            transport=httpx.MockTransport(group.async_handler)) as p:
            before = await p.send(b"before", topic=TOPIC)
            group.silent.add(OLD)
            group.after_asks = (group.route_asks + 1, NEW)  # the next lookup names NEW
            result = await p.send(b"during", topic=TOPIC, message_id="m-during")
            assert result.message_id == "m-during" and group.sent[NEW] == ["m-during"]
        group.primary, group.after_asks = OLD, (group.route_asks + 2, NEW)
        async with Producer(nameservers=[NS], retry=FAST,
                            transport=httpx.MockTransport(group.async_handler)) as p:
            done = await p.cancel_delayed(TOPIC, "d-1", broker_name="broker-a")
        assert done.state == "cancelled" and group.cancelled == [NEW]
        assert group.held == 2 and group.sent[OLD] == [before.message_id]
    finally:
        group.release.set()


class WithB(Group):
    """``Group``, and a second group ``broker-b`` (no replicas), writable at ``B``, in the
    routes while ``b_listed``."""

    b_listed = False

    def handler(self, request: httpx.Request) -> httpx.Response:
        resp = super().handler(request)
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base != NS or not self.b_listed:
            return resp
        route = json.loads(resp.content)
        route["queues"].append({"broker_name": "broker-b", "address": B, "queues": 2,
                                "perm": "rw", "replicas": []})
        return httpx.Response(200, json=route)


async def test_a_batch_kept_to_its_group_waits_while_the_group_has_no_primary() -> None:
    """A batch whose answer may have stored it stays with its group; while that group's route
    is read-only (electing) and the other group writable, the batch waits for the group's new
    primary: the route's missing primary is not a missing topic (TOPIC_NOT_FOUND, final)."""
    group = WithB()
    group.sent[B] = []
    async with Producer(nameservers=[NS], retry=FAST,
                        transport=httpx.MockTransport(group.handler)) as p:
        await p.send(b"before", topic=TOPIC)  # routed: broker-a only, at OLD
        group.not_primary.add(OLD)  # the batch's answer: NOT_PRIMARY (it may be stored)
        group.primary, group.b_listed = None, True  # then broker-a read-only, b writable
        group.after_asks = (group.route_asks + 4, NEW)  # then NEW is elected
        batch = [Message(b"x", message_id=f"b-{i}") for i in range(3)]
        got = await p.send_batch(TOPIC, batch)
    assert [r.message_id for r in got] == ["b-0", "b-1", "b-2"]
    assert sorted(group.sent[NEW]) == ["b-0", "b-1", "b-2"] and group.sent[B] == []


async def test_not_primary_answers_are_waited_out() -> None:
    group = Group()
    async with producer(group) as p:
        group.not_primary.add(OLD)
        group.after_asks = (group.route_asks + 8, NEW)
        result = await p.send(b"m", topic=TOPIC)
    assert group.sent[NEW] == [result.message_id] and group.sent[OLD] == []


async def test_a_not_primary_answer_naming_a_known_primary_is_followed_at_once() -> None:
    group = Group()
    async with producer(group) as p:
        await p.send(b"before", topic=TOPIC)  # routed: OLD the primary, NEW its replica
        asks = group.route_asks
        group.not_primary.add(OLD)  # NEW was promoted; the nameservers still name OLD
        group.hint = NEW
        result = await p.send(b"m", topic=TOPIC)
        again = await p.send(b"next", topic=TOPIC)  # the route now names NEW
    assert group.sent[NEW] == [result.message_id, again.message_id]
    assert group.route_asks == asks  # followed from the answer, no lookup needed


async def test_a_not_primary_hint_to_an_unknown_address_waits_for_the_nameservers() -> None:
    group = Group()
    async with producer(group) as p:
        await p.send(b"before", topic=TOPIC)
        group.not_primary.add(OLD)
        group.hint = "http://internal-only:1"  # not an address the route gave: not followed
        group.after_asks = (group.route_asks + 3, NEW)
        result = await p.send(b"m", topic=TOPIC)
    assert group.sent[NEW] == [result.message_id]
    assert group.route_asks >= 3


async def test_a_read_only_route_waits_for_a_primary() -> None:
    group = Group()
    group.primary = None  # electing: the route is readable only
    group.after_asks = (5, NEW)
    async with producer(group) as p:
        result = await p.send(b"m", topic=TOPIC)
    assert group.sent[NEW] == [result.message_id]


async def test_the_wait_is_bounded_by_the_deadline() -> None:
    group = Group()
    group.not_primary.add(OLD)
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05,
                         deadline_s=0.6)
    async with Producer(nameservers=[NS], transport=httpx.MockTransport(group.handler),
                        retry=policy) as p:
        with pytest.raises(NotPrimaryError):
            await p.send(b"m", topic=TOPIC)
    assert group.route_asks > 3  # it kept asking for the new primary until the deadline


async def test_without_replicas_a_dead_broker_fails_after_max_attempts() -> None:
    group = Group(replicas=False)
    group.dead.add(OLD)
    async with producer(group) as p:
        with pytest.raises(TransportError):
            await p.send(b"m", topic=TOPIC)


def test_electing_and_route_parsing() -> None:
    route = parse_route(TOPIC, json.loads(json.dumps({"queues": [
        {"broker_name": "a", "address": "x:1", "queues": 1, "perm": "r", "replicas": ["y:1"]},
        {"broker_name": "b", "address": "z:1", "queues": 1, "perm": "rw"}]})))
    assert route.replicated("a") and not route.replicated("b")
    assert not route.electing()
    only_read = parse_route(TOPIC, {"queues": [{"broker_name": "a", "address": "y:1",
                                                "queues": 1, "perm": "r"}]})
    assert only_read.electing()
    refused = TransportError("refused", sent=False)
    assert electing(refused, replicated=True) and not electing(refused, replicated=False)
    assert electing(NotPrimaryError(ErrorCode.NOT_PRIMARY, "x", 503), replicated=False)


class PromotedDuringTheLocalTransaction:
    """The group's primary moves to its replica while the local transaction runs."""

    def __init__(self) -> None:
        self.moved = False

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        self.moved = True
        return TransactionState.COMMIT

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.COMMIT


@pytest.mark.parametrize("old_primary", ["answers NOT_PRIMARY", "goes silent"])
async def test_an_end_follows_its_groups_new_primary(cluster: FakeCluster,
                                                     old_primary: str) -> None:
    """The group's primary moves to its replica while the local transaction runs. The old one
    answers the end NOT_PRIMARY naming the replica (followed at once), or goes silent (paused,
    cut off): then the end it took is given up as soon as the nameservers name the replica, and
    made there, not after the request's own timeout (10 s) or the old primary's return."""
    silent = old_primary == "goes silent"
    old, replica = cluster.broker_url, "http://replica:10911"
    listener = PromotedDuringTheLocalTransaction()
    serve = cluster.transport.handle_async_request
    ends: list[str] = []
    given_up = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if request.url.path.startswith("/v1/routes/"):
            primary, other = (replica, old) if silent and listener.moved else (old, replica)
            return httpx.Response(200, json={"topic": TOPIC, "queues": [
                {"broker_name": "broker-a", "address": primary, "queues": 4, "perm": "rw",
                 "replicas": [other]}]})
        if request.url.path == "/v1/transactions/end":
            ends.append(base)
            if listener.moved and base == old and not silent:
                return httpx.Response(503, json={"code": "NOT_PRIMARY", "message": (
                    f"this broker is a replica (epoch 2); the primary is {replica}")})
            if listener.moved and base == old:
                try:  # silent until its own timeout
                    await asyncio.sleep(SILENT_TIMEOUT_S)
                except asyncio.CancelledError:
                    given_up.set()
                    raise
                raise httpx.ReadTimeout("no answer", request=request)
        if base == replica:  # the promoted replica holds the same log
            request = httpx.Request(request.method, request.url.copy_with(host="broker0"),
                                    headers=request.headers, content=request.content)
        return await serve(request)

    async with TransactionProducer("tx-group", listener, nameservers=cluster.nameservers,
                                   transport=httpx.MockTransport(handler), retry=FAST) as tx:
        result = await tx.send(b"m", topic=TOPIC)
    assert result.end_error is None and result.local_state is TransactionState.COMMIT
    assert ends == [old, replica]  # then at once at the new primary
    assert given_up.is_set() == silent
    assert [e["transaction_id"] for e in cluster.broker.ends] == [result.transaction_id]
