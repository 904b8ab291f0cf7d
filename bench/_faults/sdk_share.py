"""The workload's SDK share: writers that use tidemq as an application does (``Producer.send``,
``send_batch``, delayed messages by level and by ``delay_ms``, ``Producer.cancel_delayed``,
``TransactionProducer.send`` several at once, so that their halves go as one batch), and two
consumer groups reading through the SDK (a ``PushConsumer``, ``cg-push``, and a
``SimpleConsumer`` receiving and acknowledging, ``cg-simple``), beside the raw REST writers and
readers of bench/_faults/workload.py. Their operations go into the same history with
``client="sdk"``; the SDK groups' reads are judged like the raw consumers' (every acknowledged
message must reach every group). A call that raised is recorded ``info`` (the application
cannot tell whether it was stored) or ``fail`` (a definite refusal), and the checker counts both
as ``app_errors`` and each call's duration into ``app_wait_s_max`` per fault.

The application chooses every message id and the history records that id: an SDK that
re-sent under another id stores a copy no operation used (``unexpected``), and an answer naming
another id is recorded ``info``.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from tidemq import (
    AlreadyDeliveredError,
    BadRequestError,
    ConfigurationError,
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SendResult,
    SimpleConsumer,
    TidemqError,
    TransactionProducer,
    TransactionState,
)

from bench._faults.history import FAIL, INFO, OK, Op, now_ms

if TYPE_CHECKING:
    from bench._faults.workload import Workload

SDK = "sdk"
LEVEL_MS = {1: 1_000, 2: 5_000}  # the default delay levels the share uses (ms)
DEFINITE = (ConfigurationError, BadRequestError, AlreadyDeliveredError)  # nothing was done
TX_GROUP = "faults-sdk-tx"  # the SDK share's transactional producer group
PUSH_GROUP, SIMPLE_GROUP = "cg-push", "cg-simple"  # consumer groups reading through the SDK
SDK_GROUPS = (PUSH_GROUP, SIMPLE_GROUP)
TX_AT_ONCE = (2, 9)  # transactions sent together (their halves share a batch): low, high excl.
RECEIVE_WAIT_MS = 1000  # the simple consumer's long poll (ms)
OFFSET_COMMIT_S = 1.0  # the push consumer commits its offsets this often (s)
STATES = {"commit": TransactionState.COMMIT, "rollback": TransactionState.ROLLBACK,
          "unknown": TransactionState.UNKNOWN}


class Intents:
    """The SDK share's local transactions: each ends as the writer decided (its ``arg``), and a
    check-back answers what the transaction's intent was (``Workload.intents``)."""

    def __init__(self, intents: dict[str, str]) -> None:
        self.intents = intents

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState(arg)

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        intent = self.intents.get(message.message_id, "rollback")
        return TransactionState.COMMIT if intent == "commit" else TransactionState.ROLLBACK


class SdkShare:
    def __init__(self, wl: Workload) -> None:
        self.wl = wl
        self.cfg = wl.cfg
        self.rng = random.Random(wl.cfg.seed + 1)
        self.producer = Producer(nameservers=self.cfg.nameservers)
        self.txp = TransactionProducer(TX_GROUP, Intents(wl.intents),
                                       nameservers=self.cfg.nameservers)

    async def writer(self, w: int) -> None:
        await self.producer.start()
        await self.txp.start()
        while not self.wl.stop.is_set():
            roll = self.rng.random()
            if roll < 0.35:
                await self.send()
            elif roll < 0.55:
                await self.send_batch(self.rng.randrange(4, 17))
            elif roll < 0.8:
                await self.delayed()
            else:
                await self.transactions(self.rng.randrange(*TX_AT_ONCE))
            await asyncio.sleep(self.cfg.pace_s)

    async def close_producer(self) -> None:
        """The writers stopped: the cancels they scheduled are made, then the plain producer
        goes (closed under a cancel still waiting to start, it made that cancel raise
        ``ClientClosedError``: an application error the harness caused)."""
        await asyncio.gather(*list(_tasks), return_exceptions=True)
        await self.producer.close()

    async def close(self) -> None:
        """Reading stopped: the transactional producer goes too. It answers the check-backs of
        its transactions until then (one ended UNKNOWN just before the writers stopped was
        committed by nobody when it closed with them: a lost commit the harness made)."""
        await self.producer.close()
        await self.txp.close()

    # --- transactions -------------------------------------------------------------------------
    async def transactions(self, n: int) -> None:
        """``n`` transactions sent at once: the producer coalesces their halves (and ends)."""
        await asyncio.gather(*(self.transaction() for _ in range(n)))

    async def transaction(self) -> None:
        mid = f"u-{uuid.uuid4().hex[:12]}"
        intent = "commit" if self.rng.random() < 0.6 else "rollback"
        end = intent if self.rng.random() < 0.6 else "unknown"
        self.wl.intents[mid] = intent  # before the half: a check may come at once
        t0, dups = now_ms(), self.txp.possible_duplicates
        try:
            res = await self.txp.send(json.dumps({"intent": intent}), STATES[end],
                                      topic=self.cfg.topic, message_id=mid,
                                      check_immunity_s=2)
        except TidemqError as exc:
            self.wl.rec.add(Op("txn", self._kind(exc), t0, now_ms(), id=mid,
                               topic=self.cfg.topic, intent=intent, end=end,
                               error=repr(exc)[:200], client=SDK,
                               possible_dup=dups < self.txp.possible_duplicates))
            return
        kind, error = OK, repr(res.end_error)[:200] if res.end_error else ""
        if res.message_id != mid:
            error, kind = f"the SDK answered for {res.message_id}, sent as {mid}", INFO
        self.wl.rec.add(Op("txn", kind, t0, now_ms(), id=mid, topic=self.cfg.topic,
                           intent=intent, end=end, group=res.broker_name or "", error=error,
                           client=SDK, possible_dup=dups < self.txp.possible_duplicates))

    # --- consumers ----------------------------------------------------------------------------
    def _read(self, cgroup: str, m: ReceivedMessage) -> None:
        """One message an SDK consumer got (its broker group is not told: positions are per
        queue id and offset only)."""
        t = now_ms()
        self.wl.rec.add(Op("read", OK, t, t, id=m.message_id, topic=m.topic, cgroup=cgroup,
                           queue=m.queue_id, offset=m.queue_offset,
                           store_ms=m.store_timestamp_ms, client=SDK))

    async def push_reader(self) -> None:
        """A ``PushConsumer`` of every queue of the topic until the workload stops reading."""
        async def handle(m: ReceivedMessage) -> ConsumeResult:
            self._read(PUSH_GROUP, m)
            return ConsumeResult.SUCCESS

        consumer = PushConsumer(PUSH_GROUP, handler=handle, nameservers=self.cfg.nameservers,
                                subscriptions={self.cfg.topic: "*"},
                                offset_commit_interval_s=OFFSET_COMMIT_S)
        await consumer.start()
        try:
            await self.wl.reading.wait()
        finally:
            await consumer.close()

    async def simple_reader(self) -> None:
        """A ``SimpleConsumer`` receiving and acknowledging until the workload stops reading."""
        consumer = SimpleConsumer(SIMPLE_GROUP, topic=self.cfg.topic,
                                  nameservers=self.cfg.nameservers)
        await consumer.start()
        try:
            while not self.wl.reading.is_set():
                try:
                    got = await consumer.receive(32, wait_ms=RECEIVE_WAIT_MS)
                except TidemqError:
                    await asyncio.sleep(0.2)
                    continue
                for m in got:
                    self._read(SIMPLE_GROUP, m)
                if got:
                    try:
                        await consumer.ack(got)
                    except TidemqError:
                        pass  # unacknowledged: they come back after their invisibility
        finally:
            await consumer.close()

    def _kind(self, exc: BaseException) -> str:
        return FAIL if isinstance(exc, DEFINITE) else INFO

    async def send(self) -> None:
        mid = f"p-{uuid.uuid4().hex[:12]}"
        t0, dups = now_ms(), self.producer.possible_duplicates
        try:
            res = await self.producer.send(json.dumps({"sdk": 1}), topic=self.cfg.topic,
                                           message_id=mid)
        except TidemqError as exc:
            self._record("send", self._kind(exc), t0, mid, error=repr(exc)[:200], dups=dups)
            return
        self._record("send", OK, t0, mid, res, dups=dups)

    async def send_batch(self, n: int) -> None:
        mids = [f"p-{uuid.uuid4().hex[:12]}" for _ in range(n)]
        t0, dups = now_ms(), self.producer.possible_duplicates
        try:
            results = await self.producer.send_batch(
                self.cfg.topic, [Message(json.dumps({"batch": n}), message_id=m) for m in mids])
        except TidemqError as exc:
            for mid in mids:
                self._record("send", self._kind(exc), t0, mid, error=repr(exc)[:200], batch=n,
                             dups=dups)
            return
        for mid, res in zip(mids, results, strict=True):
            self._record("send", OK, t0, mid, res, batch=n, dups=dups)

    async def delayed(self) -> None:
        mid = f"q-{uuid.uuid4().hex[:12]}"
        t0, dups = now_ms(), self.producer.possible_duplicates
        level = delay = None
        if self.rng.random() < 0.5:
            level = self.rng.choice(sorted(LEVEL_MS))
            due = t0 + LEVEL_MS[level]
        else:
            delay = self.rng.randrange(1000, self.cfg.delay_max_ms)
            due = t0 + delay
        try:
            res = await self.producer.send(json.dumps({"sdk": "delay"}), topic=self.cfg.topic,
                                           message_id=mid, delay_level=level, delay_ms=delay)
        except TidemqError as exc:
            self._record("delay", self._kind(exc), t0, mid, error=repr(exc)[:200], due=due,
                         dups=dups)
            return
        self._record("delay", OK, t0, mid, res, due=due, dups=dups)
        self.wl.timers[mid] = max(due, res.deliver_at_ms or 0)
        if self.rng.random() < 0.25:
            spawn(self.cancel(mid, res.broker_name, due - t0))

    async def cancel(self, mid: str, broker: str | None, delay_ms: int) -> None:
        await asyncio.sleep(self.rng.uniform(0.1, 0.6) * delay_ms / 1000)
        t0 = now_ms()
        try:
            await self.producer.cancel_delayed(self.cfg.topic, mid, broker_name=broker)
        except AlreadyDeliveredError as exc:
            self._record("cancel", FAIL, t0, mid, error=f"409 ALREADY_DELIVERED ({exc})"[:200])
            return
        except TidemqError as exc:
            self._record("cancel", self._kind(exc), t0, mid, error=repr(exc)[:200])
        else:
            self._record("cancel", OK, t0, mid)
        self.wl.timers.pop(mid, None)

    def _record(self, f: str, kind: str, t0: int, mid: str, res: SendResult | None = None, *,
                error: str = "", batch: int = 0, due: int = 0, dups: int = -1) -> None:
        """One operation; ``dups``: the producer's ``possible_duplicates`` before the call."""
        if res is not None and res.message_id != mid:
            error, kind = f"the SDK answered for {res.message_id}, sent as {mid}", INFO
        self.wl.rec.add(Op(
            f, kind, t0, now_ms(), id=mid, topic=self.cfg.topic, group=getattr(
                res, "broker_name", None) or "", queue=res.queue_id if res else -1,
            offset=(res.queue_offset if res and res.queue_offset is not None else -1),
            due_ms=due, deliver_at_ms=(res.deliver_at_ms or 0) if res else 0, error=error,
            batch=batch, client=SDK,
            possible_dup=0 <= dups < self.producer.possible_duplicates))


_tasks: set[asyncio.Task[None]] = set()


def spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
