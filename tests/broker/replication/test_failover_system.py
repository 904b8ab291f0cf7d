"""Failover of a 3-copy group decided by a real etcd, with real broker processes and the SDK:

- SIGKILL the primary under continuous sync-replicated sends, 10 rounds: nothing acknowledged
  is lost, nothing consumed vanishes, another broker is elected under a newer epoch, and the
  application sees no error (the SDK waits for the new primary); how long each election takes
  is bench/replication.py's failover figure, printed here (``-s``) for a look only;
- SIGSTOP the primary past its lease, a successor takes over, SIGCONT it: it acknowledges
  nothing (a send it held while paused is refused), and rejoins as a replica of the new epoch
  with the same log as the primary.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tidemq import ConsumeResult, Producer, PushConsumer, ReceivedMessage

from tests.support.procs import RedisServer
from tests.support.replicated import ReplicatedGroup, run_replicated_group
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"
QUEUES = 2
ROUNDS = 6  # SIGKILLed primaries per run (bench.replication and bench.faults kill more)


@pytest.fixture
def group(tmp_path: Path, redis_server: RedisServer) -> Iterator[ReplicatedGroup]:
    with run_replicated_group(tmp_path, redis_server.url, copies=3) as g:
        g.create_topic(TOPIC, QUEUES)
        yield g


def _all_in_sync(g: ReplicatedGroup, primary: int) -> bool:
    st = g.status(primary)
    return bool(st) and st["in_sync_copies"] == 3  # type: ignore[index]


def stored_ids(g: ReplicatedGroup, broker_id: int) -> list[str]:
    """Every message id of the topic, read from ``broker_id`` (queue by queue, from 0)."""
    ids: list[str] = []
    for q in range(QUEUES):
        offset = 0
        while True:
            resp = g.http.get(f"{g.brokers[broker_id].url}/v1/topics/{TOPIC}/queues/{q}/messages",
                              params={"offset": offset, "max": 1024})
            assert resp.status_code == 200, resp.text
            page = resp.json()
            ids += [m["message_id"] for m in page["messages"]]
            if not page["messages"]:
                break
            offset = page["next_offset"]
    return ids


class Traffic:
    """Continuous SDK sends (acknowledged ids, application errors) and a push consumer
    (consumed ids) through the nameserver, in the test's event loop."""

    def __init__(self, nameserver: str) -> None:
        self.nameserver = nameserver
        self.acked: list[str] = []
        self.errors: list[BaseException] = []
        self.consumed: set[str] = set()
        self._stop = asyncio.Event()

    async def _handle(self, message: ReceivedMessage) -> ConsumeResult:
        self.consumed.add(message.message_id)
        return ConsumeResult.SUCCESS

    async def _send_loop(self, producer: Producer, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                result = await producer.send(f"w{n}-{i}".encode(), topic=TOPIC)
            except Exception as exc:  # an application error: the test fails on any
                self.errors.append(exc)
            else:
                self.acked.append(result.message_id)
            i += 1
            await asyncio.sleep(0.005)

    async def run(self, body: Any) -> None:
        async with Producer(nameservers=[self.nameserver]) as producer, PushConsumer(
                "failover-readers", nameservers=[self.nameserver], handler=self._handle,
                subscriptions={TOPIC: "*"}, pull_wait_ms=500, heartbeat_interval_s=1.0,
                offset_commit_interval_s=0.5) as _:
            senders = [asyncio.create_task(self._send_loop(producer, n)) for n in range(3)]
            try:
                await body()
            finally:
                self._stop.set()
                await asyncio.gather(*senders)


async def test_sigkill_the_primary_again_and_again_under_sync_sends(
        group: ReplicatedGroup) -> None:
    traffic = Traffic(group.nameserver.url)
    elections: list[float] = []

    async def rounds() -> None:
        for n in range(ROUNDS):
            primary, epoch = await asyncio.to_thread(group.wait_primary)
            await asyncio.to_thread(wait_until, lambda p=primary: _all_in_sync(group, p), 20,
                                    "three copies in sync")
            before = len(traffic.acked)
            await asyncio.to_thread(wait_until, lambda b=before: len(traffic.acked) > b + 20, 20,
                                    "sends flowing")
            killed_at = time.monotonic()
            await asyncio.to_thread(group.kill, primary)
            new, new_epoch = await asyncio.to_thread(group.wait_primary, newer_than=epoch)
            elections.append(time.monotonic() - killed_at)
            assert new != primary and new_epoch > epoch, f"round {n}"
            await asyncio.to_thread(group.revive, primary)  # rejoins as a replica

    await traffic.run(rounds)
    final, _ = group.wait_primary()
    wait_until(lambda: _all_in_sync(group, final), 20, "three copies in sync at the end")
    stored = stored_ids(group, final)
    assert traffic.errors == []
    lost = set(traffic.acked) - set(stored)
    vanished = traffic.consumed - set(stored)
    assert len(traffic.acked) > ROUNDS * 20
    assert lost == set(), f"{len(lost)} acknowledged messages lost"
    assert vanished == set(), f"{len(vanished)} consumed messages vanished"
    print("elections (s):", ", ".join(f"{s:.1f}" for s in elections))
    for broker_id in range(3):  # every copy has the same history
        assert stored_ids(group, broker_id) == stored, f"copy {broker_id} differs"


async def test_sigstop_past_the_lease_then_sigcont_acknowledges_nothing_and_rejoins(
        group: ReplicatedGroup) -> None:
    old, epoch = group.wait_primary()
    old_url = group.brokers[old].url
    proc = group.brokers[old].proc
    assert proc is not None
    async with Producer(nameservers=[group.nameserver.url]) as producer:
        before = [(await producer.send(f"b{i}".encode(), topic=TOPIC)).message_id
                  for i in range(20)]
        wait_until(lambda: _all_in_sync(group, old), 15, "three copies in sync")
        proc.send_signal(signal.SIGSTOP)
        # a send that reaches the paused primary: it is answered only after SIGCONT
        held: dict[str, Any] = {}

        def send_to_old() -> None:
            try:
                held["resp"] = httpx.post(f"{old_url}/v1/topics/{TOPIC}/messages", timeout=60,
                                          json={"messages": [{"body": "held", "message_id":
                                                              "held-while-paused"}]})
            except httpx.HTTPError as exc:
                held["error"] = exc

        sender = threading.Thread(target=send_to_old)
        sender.start()
        new, new_epoch = await asyncio.to_thread(group.wait_primary, newer_than=epoch)
        assert new != old
        after = [(await producer.send(f"a{i}".encode(), topic=TOPIC)).message_id
                 for i in range(20)]
        await asyncio.sleep(1.0)
        proc.send_signal(signal.SIGCONT)
        await asyncio.to_thread(sender.join, 30)
        assert "resp" in held, held
        assert held["resp"].status_code == 503, held["resp"].text  # acknowledged nothing
        assert held["resp"].json()["code"] in ("NOT_PRIMARY", "NOT_ENOUGH_REPLICAS")

        def rejoined() -> bool:
            st = group.status(old)
            return bool(st) and st["role"] == "replica" and st["epoch"] == new_epoch  # type: ignore[index]

        await asyncio.to_thread(wait_until, rejoined, 15, "the old primary following")
        await asyncio.to_thread(wait_until, lambda: _all_in_sync(group, new), 20,
                                "the old primary in sync again")
    stored = stored_ids(group, new)
    assert "held-while-paused" not in stored
    assert set(before) | set(after) <= set(stored)
    assert stored_ids(group, old) == stored  # one history on every copy
