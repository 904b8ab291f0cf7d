"""Producer heartbeat and leave on a real broker: a heartbeat wakes the producer's waiting check
poll at once, a producer that left gets no checks until it heartbeats again.

The broker runs without a checker: the test asks for each check itself through the checker's
internal API, so no periodic scan offers checks (and wakes polls) behind the test's back.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer
from tests.support.wait import wait_until
from tidemq_server.common.constants import TOKEN_HEADER

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[BrokerHandle]:
    with run_broker(tmp_path_factory.mktemp("liveness"), redis_server.url) as handle:
        yield handle


def offer_check(b: BrokerHandle, group: str, topic: str) -> str:
    """Store a half message of ``group`` and ask the broker to check it; its transaction id."""
    resp = b.http.post("/v1/transactions", json={"producer_group": group, "topic": topic,
                                                 "message": {"body": "half"}})
    assert resp.status_code == 200, resp.text
    txid = str(resp.json()["transaction_id"])
    auth = {TOKEN_HEADER: TOKEN}
    halves = b.http.get("/internal/v1/transactions/halves", params={"max": 1024}, headers=auth)
    assert halves.status_code == 200, halves.text
    [entry] = [e for e in halves.json()["entries"] if e["transaction_id"] == txid]
    resp = b.http.post("/internal/v1/transactions/actions", headers=auth, json={"actions": [
        {"transaction_id": txid, "physical_offset": entry["physical_offset"],
         "action": "check"}]})
    assert resp.status_code == 200, resp.text
    return txid


def heartbeat(b: BrokerHandle, group: str, client_id: str) -> None:
    resp = b.http.post(f"/v1/producers/{group}/heartbeat", json={"client_id": client_id})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {}


def poll(b: BrokerHandle, group: str, client_id: str, wait_ms: int) -> list[dict[str, Any]]:
    resp = b.http.get(f"/v1/producers/{group}/checks",
                      params={"client_id": client_id, "wait_ms": wait_ms})
    assert resp.status_code == 200, resp.text
    checks: list[dict[str, Any]] = resp.json()["checks"]
    return checks


def test_heartbeat_wakes_the_waiting_check_poll(broker: BrokerHandle) -> None:
    """A poll waiting for a producer that is not live looks again every second on its own; the
    heartbeat wakes it: the broker counts the poll as woken, not as having looked again."""
    group, topic = unique("PG"), broker.create_topic(queues=1)
    txid = offer_check(broker, group, topic)
    woken = broker.gauge("tidemq_broker_transactions_check_polls_woken_total")
    with ThreadPoolExecutor(1) as pool:
        # the producer has never heartbeated: it is not live, its poll waits
        waiting: Future[list[dict[str, Any]]] = pool.submit(poll, broker, group, "p1", 30_000)
        wait_until(lambda: broker.gauge("tidemq_broker_transactions_check_pollers") == 1,
                   what="the poll waiting")
        assert not waiting.done(), "a producer that never heartbeated got checks"
        heartbeat(broker, group, "p1")
        checks = waiting.result()
    assert [c["transaction_id"] for c in checks] == [txid]
    assert checks[0]["check_times"] == 1
    assert broker.gauge("tidemq_broker_transactions_check_polls_woken_total") == woken + 1


def test_a_producer_that_left_gets_no_checks_until_it_heartbeats(broker: BrokerHandle) -> None:
    group, topic = unique("PG"), broker.create_topic(queues=1)
    heartbeat(broker, group, "p1")
    resp = broker.http.delete(f"/v1/producers/{group}/members/p1")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {}
    txid = offer_check(broker, group, topic)
    assert poll(broker, group, "p1", 300) == []
    heartbeat(broker, group, "p1")
    assert [c["transaction_id"] for c in poll(broker, group, "p1", 5_000)] == [txid]


def test_heartbeat_and_leave_validate_their_input(broker: BrokerHandle) -> None:
    for body in ({}, {"client_id": ""}, {"client_id": "x" * 256}, [1]):
        broker.error(broker.http.post("/v1/producers/PG/heartbeat", json=body),
                     400, "BAD_REQUEST")
    broker.error(broker.http.post("/v1/producers/bad%20group/heartbeat",
                                  json={"client_id": "p1"}), 400, "BAD_REQUEST")
    broker.error(broker.http.delete("/v1/producers/bad%20group/members/p1"), 400, "BAD_REQUEST")
