"""Checkers and schedulers per broker group, found through the nameserver (no broker_url).

Two groups, a nameserver and Redis; each group's checker and scheduler know only their
``broker_name`` and the nameserver list (``tests/support/groups.py``). Every group's half
messages are checked and its timers delivered, none early; a group whose broker is SIGKILLed
comes back with its pending half and timers served, on the same port or on a new one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import unique
from tests.support.clock import now_ms
from tests.support.groups import CheckAnswerer, GroupProcs, Groups, run_groups
from tests.support.procs import RedisServer, free_port
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

PG = "orders"  # the producer group of every transaction here


@pytest.fixture
def groups(tmp_path: Path, redis_server: RedisServer) -> Iterator[Groups]:
    with run_groups(tmp_path, redis_server.url, groups=2) as running:
        yield running


def delivered(group: GroupProcs, topic: str, message_id: str) -> dict[str, Any] | None:
    found = [m for m in group.messages(topic) if m["message_id"] == message_id]
    assert len(found) <= 1, found  # delivered once
    return found[0] if found else None


def wait_delivered(group: GroupProcs, topic: str, message_id: str, due_ms: int,
                   timeout: float = 30.0) -> dict[str, Any]:
    msg: dict[str, Any] = wait_until(lambda: delivered(group, topic, message_id), timeout,
                     f"delayed message {message_id} on {group.name}")
    assert msg["store_timestamp_ms"] >= due_ms, (group.name, msg, due_ms)  # never early
    return msg


def test_every_groups_halves_are_checked_and_timers_delivered(groups: Groups) -> None:
    a, b = groups.groups["broker-a"], groups.groups["broker-b"]
    topic = unique("T")
    view = groups.cluster_view()
    assert {view[g.name]["address"] for g in (a, b)} == {a.url, b.url}
    for g in (a, b):
        g.create_topic(topic)
    with CheckAnswerer(lambda: a.url, PG) as on_a, CheckAnswerer(lambda: b.url, PG) as on_b:
        halves = {g.name: g.half(PG, topic, f"half-{g.name}") for g in (a, b)}
        due = now_ms() + 2500
        timers = {g.name: g.send(topic, {"body": f"late-{g.name}", "deliver_at_ms": due})
                  for g in (a, b)}
        for g, answerer in ((a, on_a), (b, on_b)):
            tx = halves[g.name]
            wait_until(lambda: g.state(tx["message_id"]) == "committed",  # noqa: B023
                       30, f"the half on {g.name} checked and committed")
            answerer.answer_ms(tx["transaction_id"])  # its own group's check
        assert halves["broker-a"]["transaction_id"] not in on_b.answered_ids()
        for g in (a, b):
            wait_delivered(g, topic, timers[g.name]["message_id"], due)
            assert delivered(g, topic, halves[g.name]["message_id"]) is not None
    for g in (a, b):
        assert g.checker is not None and g.scheduler is not None
        assert f"checking transactions of broker {g.name} at {g.url}" in g.checker.logs()
        assert f"scheduler serving broker {g.name} at {g.url}" in g.scheduler.logs()


def test_a_killed_broker_returns_on_its_port_with_its_half_and_timers(groups: Groups) -> None:
    a, b = groups.groups["broker-a"], groups.groups["broker-b"]
    topic = unique("T")
    for g in (a, b):
        g.create_topic(topic)
    with CheckAnswerer(lambda: a.url, PG), CheckAnswerer(lambda: b.url, PG) as on_b:
        pending = b.half(PG, topic, "pending-on-b", immunity_s=3)
        soon = now_ms() + 1500  # falls due while broker-b is down
        later = now_ms() + 6000  # falls due after it is back
        timers = [(b.send(topic, {"body": "soon", "deliver_at_ms": soon}), soon),
                  (b.send(topic, {"body": "later", "deliver_at_ms": later}), later)]
        port = b.broker.port if b.broker else 0
        b.kill_broker()
        # broker-a's group keeps working while broker-b is down
        on_a_half = a.half(PG, topic, "on-a-meanwhile")
        wait_until(lambda: a.state(on_a_half["message_id"]) == "committed", 20,
                   "broker-a's half checked while broker-b is down")
        time.sleep(max(0.0, (soon + 1000 - now_ms()) / 1000))
        b.start_broker(port)
        back = now_ms()
        wait_until(lambda: b.state(pending["message_id"]) == "committed", 30,
                   "the pending half on broker-b checked after its return")
        assert on_b.answer_ms(pending["transaction_id"]) >= back
        for result, due in timers:
            wait_delivered(b, topic, result["message_id"], due)


def test_checker_and_scheduler_follow_a_broker_to_a_new_port(groups: Groups) -> None:
    b = groups.groups["broker-b"]
    topic = unique("T")
    b.create_topic(topic)
    with CheckAnswerer(lambda: b.url, PG) as on_b:
        pending = b.half(PG, topic, "moves-with-b", immunity_s=3)
        due = now_ms() + 4000
        timer = b.send(topic, {"body": "timer", "deliver_at_ms": due})
        old = b.url
        b.kill_broker()
        b.start_broker(free_port())
        assert b.url != old
        wait_until(lambda: groups.cluster_view()["broker-b"]["address"] == b.url, 10,
                   "the nameserver learns broker-b's new address")
        wait_until(lambda: b.state(pending["message_id"]) == "committed", 30,
                   "the half checked at broker-b's new address")
        on_b.answer_ms(pending["transaction_id"])
        wait_delivered(b, topic, timer["message_id"], due)
    assert b.checker is not None and b.scheduler is not None
    assert "new address" in b.checker.logs() or "moved" in b.checker.logs()
    assert "moved" in b.scheduler.logs()
