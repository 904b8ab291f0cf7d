"""Sends ride over a replicated group's failover (httpx.MockTransport): a dead primary or a
NOT_PRIMARY answer makes the producer ask the nameservers again and wait for the new primary
within its deadline, past its attempt count; a route that is read-only (no primary yet) is
waited out too; without replicas a dead broker still fails after max_attempts."""

from __future__ import annotations

import json

import httpx
import pytest
from tidemq import NotPrimaryError, Producer, RetryPolicy, TransportError
from tidemq._fault import electing
from tidemq._routes import parse_route
from tidemq.protocol import CONTENT_MSGPACK, ErrorCode
from tidemq.protocol.codec import encode_payload

from tests.sdk.fakes import request_payload

TOPIC = "orders"
NS = "http://ns:1"
OLD, NEW = "http://old:1", "http://new:1"
# 3 attempts only: a failover of a few hundred ms must not be limited by the attempt count
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
            return httpx.Response(503, json={"code": "NOT_PRIMARY", "message": "a replica"})
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


async def test_not_primary_answers_are_waited_out() -> None:
    group = Group()
    async with producer(group) as p:
        group.not_primary.add(OLD)
        group.after_asks = (group.route_asks + 8, NEW)
        result = await p.send(b"m", topic=TOPIC)
    assert group.sent[NEW] == [result.message_id] and group.sent[OLD] == []


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
