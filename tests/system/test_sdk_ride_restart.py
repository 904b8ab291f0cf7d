"""The SDK rides through a broker restart with its default retry policy (issue 32 item 1).

One broker serves the topic (the only one of its group). While ``Producer.send`` runs from many
tasks, ``send_batch`` from another and ``TransactionProducer.send`` (committing) from a few more,
the broker is SIGKILLed and started again on the same port and data directory, then stopped
with SIGTERM and started again. The test learns that the broker is back only from the SDK's own
traffic succeeding again. Asserted: no call raised (every one returned, no transaction end
failed), and a fresh consumer group reads every acknowledged message id exactly once — nothing
lost, nothing stored twice by the SDK's retries — with each transaction executed and committed
once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tidemq import (
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    TransactionProducer,
    TransactionState,
)

from tests.support.procs import RedisServer
from tests.support.wait import wait_until_async
from tests.system.sdk_harness import FAST_CONSUMER, SdkCluster, run_cluster, unique

pytestmark = pytest.mark.integration

SENDERS = 12  # tasks calling Producer.send in a loop
TX_SENDERS = 3  # tasks calling TransactionProducer.send in a loop
BATCH = 8  # messages per send_batch
BACK_AFTER = 60  # acknowledged sends after a restart that show the broker is back


class Committing:
    """Every local transaction commits; counts executions per message id."""

    def __init__(self) -> None:
        self.executed: Counter[str] = Counter()

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        assert message.message_id is not None
        self.executed[message.message_id] += 1
        return TransactionState.COMMIT

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.COMMIT


@dataclass
class Traffic:
    """SDK calls in loops until stopped; every acknowledged message id and every error."""

    producer: Producer
    tx: TransactionProducer
    topic: str
    acked: list[str] = field(default_factory=list)
    tx_acked: list[str] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    slowest_s: float = 0.0  # the longest call: it rode through an outage
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    def _ack(self, ids: list[str]) -> None:
        self.acked.extend(ids)
        now = time.monotonic()
        self.acked_at.extend(now for _ in ids)

    async def _loop(self, name: str, call: Any) -> None:
        seq = 0
        while not self.stopped.is_set():
            began = time.monotonic()
            try:
                await call(f"{name}-{seq}")
                self.slowest_s = max(self.slowest_s, time.monotonic() - began)
            except Exception as exc:  # an application error: what the SDK must not raise
                self.errors.append(exc)
                return
            seq += 1
            await asyncio.sleep(0.01)

    async def _send(self, body: str) -> None:
        self._ack([(await self.producer.send(body, topic=self.topic)).message_id])

    async def _batch(self, body: str) -> None:
        results = await self.producer.send_batch(
            self.topic, [f"{body}.{i}".encode() for i in range(BATCH)])
        self._ack([r.message_id for r in results])

    async def _transact(self, body: str) -> None:
        result = await self.tx.send(Message(body.encode(), topic=self.topic))
        assert result.end_error is None and result.local_state is TransactionState.COMMIT
        self.tx_acked.append(result.message_id)
        self._ack([result.message_id])

    async def run(self) -> None:
        await asyncio.gather(
            *(self._loop(f"s{i}", self._send) for i in range(SENDERS)),
            self._loop("b", self._batch),
            *(self._loop(f"t{i}", self._transact) for i in range(TX_SENDERS)))

    def acked_since(self, moment: float) -> int:
        return sum(at >= moment for at in self.acked_at)


async def restart(cluster: SdkCluster, traffic: Traffic, sig: signal.Signals) -> None:
    """Stop the broker with ``sig``, start it again at once (same port, same data) without
    waiting for it, and wait until the SDK's traffic is acknowledged again."""
    before = len(traffic.acked)
    await asyncio.to_thread(cluster.broker.proc.stop, sig)
    down = time.monotonic()
    cluster.broker.proc.start(wait=False)
    await wait_until_async(lambda: traffic.acked_since(down) >= BACK_AFTER or traffic.errors,
                           45, f"SDK traffic to be acknowledged after the {sig.name} restart")
    assert not traffic.errors, traffic.errors
    assert len(traffic.acked) > before


async def test_sdk_calls_ride_through_broker_restarts(tmp_path: Path,
                                                      redis_server: RedisServer) -> None:
    with run_cluster(tmp_path, redis_server.url) as cluster:
        topic = cluster.create_topic(queues=4)
        listener = Committing()
        producer = Producer(nameservers=cluster.nameservers)  # the default retry policy
        tx = TransactionProducer(unique("TXG"), listener, nameservers=cluster.nameservers)
        traffic = Traffic(producer, tx, topic)
        runner = None
        try:
            await producer.start()
            await tx.start()
            runner = asyncio.create_task(traffic.run())
            await wait_until_async(lambda: len(traffic.tx_acked) >= 20 or traffic.errors, 20,
                                   "traffic to flow")
            await restart(cluster, traffic, signal.SIGKILL)
            await restart(cluster, traffic, signal.SIGTERM)
            traffic.stopped.set()
            await runner
        finally:
            traffic.stopped.set()
            if runner is not None:
                await asyncio.gather(runner, return_exceptions=True)
            await tx.close()
            await producer.close()

        assert traffic.errors == []
        assert traffic.slowest_s > 1.0, "no call was waiting while the broker was down"
        acked = Counter(traffic.acked)
        assert max(acked.values()) == 1, "one message id acknowledged twice"
        assert all(listener.executed[m] == 1 for m in traffic.tx_acked)

        seen: list[str] = []

        async def handle(message: ReceivedMessage) -> ConsumeResult:
            seen.append(message.message_id)
            return ConsumeResult.SUCCESS

        fresh = PushConsumer(unique("G"), handler=handle, nameservers=cluster.nameservers,
                             **FAST_CONSUMER)
        fresh.subscribe(topic)
        async with fresh:
            await wait_until_async(lambda: set(seen) >= acked.keys(), 30,
                                   "every acknowledged message to be consumed")
            total = sum(cluster.max_offsets(topic).values())
            await wait_until_async(lambda: len(seen) >= total, 10, "every stored message")
        duplicates = [m for m, n in Counter(seen).items() if n > 1]
        assert duplicates == [], f"{len(duplicates)} message ids consumed twice"
        assert set(seen) == acked.keys(), "a stored message that no call acknowledged"
        assert total == len(acked), "a retry stored a second copy"
