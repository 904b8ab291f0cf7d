"""Short failover windows, on real processes (issue 32): a 3-copy group elected by a real etcd,
its scheduler following the primary through the nameserver.

- a rolling restart (`tidemq broker restart broker-a`: replicas first, the primary last, each
  stopped cleanly and started again by a supervisor, here a thread of this test standing in
  for `tidemq up`'s) under SDK sends from several tasks with the default retry policy: the
  application sees no error and every acknowledged message is consumed;
- timers due while the group has no primary (SIGKILLed) are delivered within 1 s of the new
  primary taking over, never early and once each: the scheduler's delivery retries back off to
  0.5 s at most, and a ``NOT_PRIMARY`` or a refused connection makes it ask the nameservers
  again at once; the new primary registers with them as soon as it is elected.

One group serves both tests (in this order: the second kills a member for good).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tidemq import ConsumeResult, Producer, PushConsumer, ReceivedMessage

from tests.support.broker import TOKEN
from tests.support.clock import now_ms
from tests.support.groups import DEAD_URL, FAST_SCHEDULER
from tests.support.procs import REPO, RedisServer, ServiceProcess, free_port
from tests.support.replicated import GROUP, ReplicatedGroup, run_replicated_group
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"  # the rolling restart's traffic
TIMER_TOPIC = "reminders"
QUEUES = 2
TIMERS = 10
DELAY_MS = 4_000  # long enough to be taken in and copied everywhere before the kill
KILL_BEFORE_DUE_MS = 300  # the primary dies this long before the timers come due
WITHIN_MS = 1_000  # the bound after the new primary took over
SENDERS = 4  # SDK tasks sending during the rolling restart


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory,
          redis_server: RedisServer) -> Iterator[tuple[ReplicatedGroup, str]]:
    tmp_path = tmp_path_factory.mktemp("windows")
    scheduler_port = free_port()
    scheduler_url = f"http://127.0.0.1:{scheduler_port}"
    with run_replicated_group(tmp_path, redis_server.url, copies=3,
                              scheduler_url=scheduler_url) as g:
        scheduler = ServiceProcess("scheduler", scheduler_port, {
            f"TIDEMQ_SCHEDULER_{k}": v for k, v in {
                "CLUSTER": g.env["TIDEMQ_BROKER_CLUSTER"], "TOKEN": TOKEN,
                "REDIS_URL": redis_server.url, "BROKER_NAME": GROUP,
                "NAMESERVERS": g.nameserver.url, "BROKER_URL": DEAD_URL, "LOG_LEVEL": "info",
                "PORT": str(scheduler_port), **FAST_SCHEDULER,
                "DATA_DIR": str(tmp_path / "scheduler")}.items()}, tmp_path).start()
        try:
            primary, _ = g.wait_primary()
            for topic in (TOPIC, TIMER_TOPIC):
                resp = g.http.put(f"{g.brokers[primary].url}/v1/topics/{topic}",
                                  json={"queues": QUEUES})
                assert resp.status_code == 200, resp.text
            wait_until(lambda: _in_sync(g), 15, "the topic on every copy")
            yield g, scheduler_url
        finally:
            scheduler.stop()


def _in_sync(g: ReplicatedGroup) -> bool:
    found = g.primary()
    st = g.status(found[0]) if found else None
    return bool(st) and st["in_sync_copies"] == g.copies  # type: ignore[index]


class Restarter(threading.Thread):
    """What `tidemq up`'s supervisor does for a broker: start it again when it exits."""

    def __init__(self, g: ReplicatedGroup) -> None:
        super().__init__(daemon=True)
        self.g = g
        self.done = threading.Event()
        self.restarts = 0

    def run(self) -> None:
        while not self.done.is_set():
            for proc in self.g.brokers:
                if proc.proc is not None and proc.proc.poll() is not None:
                    proc.proc = None
                    proc.start()
                    self.restarts += 1
            self.done.wait(0.05)


class Traffic:
    """SDK sends from ``SENDERS`` tasks (default retry policy) and a push consumer."""

    def __init__(self, nameserver: str) -> None:
        self.nameserver = nameserver
        self.acked: list[str] = []
        self.errors: list[BaseException] = []
        self.consumed: set[str] = set()
        self.stop = asyncio.Event()

    async def _handle(self, message: ReceivedMessage) -> ConsumeResult:
        self.consumed.add(message.message_id)
        return ConsumeResult.SUCCESS

    async def _send_loop(self, producer: Producer, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                result = await producer.send(f"r{n}-{i}".encode(), topic=TOPIC)
            except Exception as exc:  # an application error: the test fails on any
                self.errors.append(exc)
            else:
                self.acked.append(result.message_id)
            i += 1
            await asyncio.sleep(0.005)


def _cli(g: ReplicatedGroup, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemq_server.cli", "--nameserver",
                           g.nameserver.url, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TIDEMQ_TOKEN": TOKEN})


async def test_a_rolling_restart_under_sdk_sends_shows_no_error_and_loses_nothing(
        group: tuple[ReplicatedGroup, str]) -> None:
    g, _ = group
    old_primary, old_epoch = g.wait_primary()
    url = g.brokers[old_primary].url
    pid = g.http.get(url + "/internal/v1/replication/status").json()["pid"]
    wrong = g.http.post(url + "/internal/v1/replication/restart", json={"pid": pid + 1})
    assert wrong.status_code == 400 and str(pid) in wrong.json()["message"], wrong.text
    assert g.status(old_primary) is not None  # a restart naming another process stops nothing
    traffic = Traffic(g.nameserver.url)
    restarter = Restarter(g)
    restarter.start()
    try:
        async with Producer(nameservers=[g.nameserver.url]) as producer, PushConsumer(
                "rolling-readers", nameservers=[g.nameserver.url], handler=traffic._handle,
                subscriptions={TOPIC: "*"}, pull_wait_ms=500, heartbeat_interval_s=1.0,
                offset_commit_interval_s=0.5):
            senders = [asyncio.create_task(traffic._send_loop(producer, n))
                       for n in range(SENDERS)]
            try:
                await asyncio.to_thread(wait_until, lambda: len(traffic.acked) > 50, 20,
                                        "sends flowing")
                done = await asyncio.to_thread(_cli, g, "broker", "restart", GROUP, "--json")
                sent_during = len(traffic.acked)
                await asyncio.to_thread(wait_until, lambda: len(traffic.acked) > sent_during + 20,
                                        20, "sends flowing after the restart")
            finally:
                traffic.stop.set()
                await asyncio.gather(*senders)
            assert done.returncode == 0, (done.stdout, done.stderr, g.logs())
            acked = set(traffic.acked)
            await asyncio.to_thread(wait_until, lambda: acked <= traffic.consumed, 30,
                                    "every acknowledged message consumed")
    finally:
        restarter.done.set()
        restarter.join()
    report = json.loads(done.stdout)
    order = [r["broker_id"] for r in report["restarted"]]
    assert sorted(order) == [0, 1, 2] and order[-1] == old_primary  # the primary last
    assert restarter.restarts == 3
    assert traffic.errors == [], traffic.errors[:3]
    new_primary, new_epoch = g.wait_primary()
    assert new_primary != old_primary and new_epoch > old_epoch
    assert len(traffic.acked) == len(acked)  # no id acknowledged twice


def _pending(g: ReplicatedGroup, scheduler_url: str) -> int:
    resp = g.http.get(scheduler_url + "/internal/v1/status")
    return int(resp.json().get("pending_timers", 0)) if resp.status_code == 200 else 0


def _stored(g: ReplicatedGroup, broker_id: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for q in range(QUEUES):
        resp = g.http.get(f"{g.brokers[broker_id].url}/v1/topics/{TIMER_TOPIC}/queues/{q}"
                          "/messages",
                          params={"offset": 0, "max": 1024})
        assert resp.status_code == 200, resp.text
        out += resp.json()["messages"]
    return out


def test_timers_due_without_a_primary_go_out_within_1s_of_the_successor(
        group: tuple[ReplicatedGroup, str]) -> None:
    g, scheduler_url = group
    old, epoch = g.wait_primary()
    url = g.brokers[old].url
    wait_until(lambda: _in_sync(g), 30, "every copy in sync")
    earliest_ms = now_ms() + DELAY_MS  # none may be stored before this
    sent = g.http.post(f"{url}/v1/topics/{TIMER_TOPIC}/messages", json={"messages": [
        {"body": f"timer {i}", "delay_ms": DELAY_MS} for i in range(TIMERS)]})
    assert sent.status_code == 200, sent.text
    due_ms = now_ms() + DELAY_MS
    ids = {r["message_id"] for r in sent.json()["results"]}
    wait_until(lambda: _pending(g, scheduler_url) >= TIMERS, 15, "the scheduler taking them in")
    wait_until(lambda: (g.status(old) or {}).get("in_sync_copies") == 3, 15, "every copy")
    assert now_ms() < due_ms - KILL_BEFORE_DUE_MS, "too slow to kill before the timers are due"
    wait_until(lambda: now_ms() >= due_ms - KILL_BEFORE_DUE_MS, DELAY_MS / 1000,
               "the moment to kill", every=0.01)

    g.kill(old)
    new, _ = g.wait_primary(newer_than=epoch)
    took_over_ms = now_ms()  # at most a status poll after it really did (in the bound's favour)
    assert new != old

    def delivered() -> list[dict[str, Any]]:
        found = [m for m in _stored(g, new) if m["message_id"] in ids]
        return found if {m["message_id"] for m in found} == ids else []

    found = wait_until(delivered, 30, "every timer on the new primary")
    assert len(found) == TIMERS  # once each
    stored_ms = [int(m["store_timestamp_ms"]) for m in found]
    assert min(stored_ms) >= earliest_ms  # never early
    late = max(stored_ms) - took_over_ms
    assert late <= WITHIN_MS, (f"the last timer was stored {late} ms after the new primary "
                               f"took over\n{g.logs()}")
