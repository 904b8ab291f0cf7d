"""What a killed primary held is carried on by its successor: half messages are checked and
timers delivered (a 3-copy group elected by a real etcd, with its checker and scheduler
processes finding the primary through the nameserver by broker name, never by a fixed URL);
simple-consumer messages in flight stay invisible and their receipts ack on the successor; a
send repeated with the same message id is answered from the dedup window, stored once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import TOKEN
from tests.support.clock import now_ms
from tests.support.groups import DEAD_URL, FAST_SCHEDULER, CheckAnswerer
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tests.support.replicated import GROUP, ReplicatedGroup, run_replicated_group
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

TOPIC = "payments"
INFLIGHT = "inflight"
CONSUMERS = "workers"
PRODUCER_GROUP = "payers"
DELAY_MS = 6_000


@pytest.fixture
def group(tmp_path: Path, redis_server: RedisServer) -> Iterator[ReplicatedGroup]:
    scheduler_port = free_port()
    with run_replicated_group(tmp_path, redis_server.url, copies=3,
                              scheduler_url=f"http://127.0.0.1:{scheduler_port}") as g:
        common = {"CLUSTER": g.env["TIDEMQ_BROKER_CLUSTER"], "TOKEN": TOKEN,
                  "REDIS_URL": redis_server.url, "BROKER_NAME": GROUP,
                  "NAMESERVERS": g.nameserver.url, "BROKER_URL": DEAD_URL, "LOG_LEVEL": "info"}
        checker_port = free_port()
        checker = ServiceProcess("checker", checker_port, {f"TIDEMQ_CHECKER_{k}": v for k, v in {
            **common, "PORT": str(checker_port), "CHECK_INTERVAL_MS": "300",
            "TRANSACTION_TIMEOUT_MS": "800"}.items()}, tmp_path).start()
        scheduler = ServiceProcess("scheduler", scheduler_port, {
            f"TIDEMQ_SCHEDULER_{k}": v for k, v in {
                **common, "PORT": str(scheduler_port), **FAST_SCHEDULER,
                "DATA_DIR": str(tmp_path / "scheduler")}.items()}, tmp_path).start()
        try:
            yield g
        finally:
            checker.stop()
            scheduler.stop()


def _primary_url(g: ReplicatedGroup) -> str:
    primary = g.primary()
    return g.brokers[primary[0]].url if primary else DEAD_URL


def _messages(g: ReplicatedGroup, broker_id: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for q in range(2):
        resp = g.http.get(f"{g.brokers[broker_id].url}/v1/topics/{TOPIC}/queues/{q}/messages",
                          params={"offset": 0, "max": 1024})
        assert resp.status_code == 200, resp.text
        out += resp.json()["messages"]
    return out


def test_a_successor_checks_half_messages_and_delivers_timers_of_its_killed_primary(
        group: ReplicatedGroup) -> None:
    old, epoch = group.wait_primary()
    url = group.brokers[old].url
    assert group.http.put(f"{url}/v1/topics/{TOPIC}", json={"queues": 2}).status_code == 200
    half = group.http.post(f"{url}/v1/transactions", json={
        "producer_group": PRODUCER_GROUP, "topic": TOPIC,
        "message": {"body": "half on the old primary"}, "check_immunity_s": 3})
    assert half.status_code == 200, half.text
    txid, half_id = half.json()["transaction_id"], half.json()["message_id"]
    sent_ms = now_ms()
    timer = group.http.post(f"{url}/v1/topics/{TOPIC}/messages", json={"messages": [
        {"body": "timer on the old primary", "delay_ms": DELAY_MS}]})
    assert timer.status_code == 200, timer.text
    timer_id = timer.json()["results"][0]["message_id"]
    first = group.http.post(f"{url}/v1/topics/{TOPIC}/messages", json={"messages": [
        {"body": "once", "message_id": "dedup-1"}]}).json()["results"][0]
    assert group.http.put(f"{url}/v1/topics/{INFLIGHT}", json={"queues": 1}).status_code == 200
    for body in ("w1", "w2"):
        assert group.http.post(f"{url}/v1/topics/{INFLIGHT}/messages",
                               json={"messages": [{"body": body}]}).status_code == 200
    received = group.http.post(f"{url}/v1/groups/{CONSUMERS}/receive", json={
        "topic": INFLIGHT, "max": 16, "invisible_ms": 60_000, "wait_ms": 2000}).json()
    handles = [m["receipt_handle"] for m in received["messages"]]
    assert len(handles) == 2
    wait_until(lambda: (group.status(old) or {}).get("in_sync_copies") == 3, 15,
               "both records on every copy")

    group.kill(old)
    new, _ = group.wait_primary(newer_than=epoch)
    assert new != old
    new_url = group.brokers[new].url

    def resend() -> dict[str, Any] | None:
        resp = group.http.post(f"{new_url}/v1/topics/{TOPIC}/messages", json={"messages": [
            {"body": "once", "message_id": "dedup-1"}]})
        return resp.json()["results"][0] if resp.status_code == 200 else None

    again = wait_until(resend, 15, "the new primary taking sends")
    assert (again["queue_id"], again["queue_offset"]) == (first["queue_id"],
                                                          first["queue_offset"])
    still = group.http.post(f"{new_url}/v1/groups/{CONSUMERS}/receive", json={
        "topic": INFLIGHT, "max": 16, "invisible_ms": 60_000, "wait_ms": 0})
    assert still.status_code == 200 and still.json()["messages"] == []  # still in flight
    acked = group.http.post(f"{new_url}/v1/groups/{CONSUMERS}/ack",
                            json={"receipt_handles": handles})
    assert acked.status_code == 200 and acked.json()["acked"] == 2, acked.text
    with CheckAnswerer(lambda: _primary_url(group), PRODUCER_GROUP) as answerer:
        wait_until(lambda: txid in answerer.answered_ids(), 40,
                   "the checker to ask the producer about the half through the new primary")

        def delivered() -> dict[str, dict[str, Any]]:
            found = {m["message_id"]: m for m in _messages(group, new)}
            return found if {half_id, timer_id} <= set(found) else {}

        found = wait_until(delivered, 40, "the committed half and the due timer on the new primary")
    assert found[timer_id]["store_timestamp_ms"] >= sent_ms + DELAY_MS  # never early
    ids = [m["message_id"] for m in _messages(group, new)]
    assert ids.count(half_id) == 1 and ids.count(timer_id) == 1  # never twice
    assert ids.count("dedup-1") == 1
