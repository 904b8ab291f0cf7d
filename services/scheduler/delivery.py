"""Delivery of due timers: from the wheel to the broker in large batches, marked durably.

Each batch (up to ``batch_size`` timers, several in flight) goes through three steps:

1. an INTENT mark per timer, fsynced — after a crash, a timer with an intent and no outcome is
   delivered ``strict``: the broker stores it only if that delivery is not already stored;
2. one ``deliver`` request (msgpack, the records spliced in as the timer log holds them);
3. a DELIVERED mark per timer, fsynced.

A failed request (broker down, busy) keeps the batch and retries it with back-off, strict.
Nothing is delivered before its due time by the scheduler's clock: the due time is checked
again on the entry read from the timer log. ``state``/``drop``/``wait`` let a cancel settle
its race with delivery: a queued timer can still be dropped; a timer in a request in flight
is waited for, and then it is delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from tidemq_server.common.broker_client import BrokerClient, BrokerDown, BrokerError, deliver_body
from tidemq_server.common.loop import cancel_tasks
from tidemq_server.scheduler.buckets import Mark
from tidemq_server.scheduler.clock import Clock
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.rolls import strip_roll
from tidemq_server.scheduler.timerlog import Entry
from tidemq_server.scheduler.timers import TimerStore
from tidemq_server.scheduler.wheel import Due

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.05  # first pause after a failed delivery (s), doubling
# the longest pause between delivery attempts (s): a timer due while its group has no primary
# goes out within about this after the new primary is routable (issue 32: within 1 s)
RETRY_MAX_S = 0.5
IDLE_S = 1.0  # the loop looks at the wheel (and buckets to load) at least this often


class Where(StrEnum):
    QUEUED = "queued"  # due, waiting for a batch: a cancel may still drop it
    SENDING = "sending"  # in a request in flight: a cancel waits for the outcome


@dataclass(slots=True)
class Batch:
    items: list[tuple[int, int, int, int]]  # (bucket, due, pos, size)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Deliverer:
    def __init__(self, store: TimerStore, broker: BrokerClient, clock: Clock,
                 metrics: SchedulerMetrics, batch_size: int, parallelism: int) -> None:
        self.store = store
        self.broker = broker
        self.clock = clock
        self.metrics = metrics
        self.batch_size = batch_size
        self.parallelism = parallelism
        self.queue: deque[Due] = deque()
        self._head = 0  # index of the next timer in queue[0]
        self.queued = 0
        self.dropped: set[int] = set()  # queued positions cancelled
        self.sending: dict[int, Batch] = {}  # position → its batch in flight
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="deliverer")

    def wakeup(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        await cancel_tasks(self._task, *self._tasks)
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("delivery loop failed; retrying")
                await asyncio.sleep(IDLE_S)
            now = self.clock.now_ms()
            nxt = self.store.wheel.next_due()
            wait = IDLE_S if nxt is None else min(IDLE_S, max(0.0, (nxt - now) / 1000))
            if self.queued and len(self._tasks) < self.parallelism:
                wait = 0
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()

    async def run_once(self) -> None:
        """Load near buckets, take what is due, start batches up to the parallelism."""
        now = self.clock.now_ms()
        for bucket in self.store.to_load(now):
            await self.store.load(bucket)
        for due in self.store.wheel.pop_due(now):
            self.queue.append(due)
            self.queued += len(due.dues)
        while self.queued and len(self._tasks) < self.parallelism:
            batch = self._next_batch()
            if not batch.items:
                continue
            for item in batch.items:
                self.sending[item[2]] = batch
            task = asyncio.create_task(self._deliver(batch), name="deliver-batch")
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a delivery batch failed: %r", task.exception())
        self._wake.set()

    def _next_batch(self) -> Batch:
        items: list[tuple[int, int, int, int]] = []
        while self.queue and len(items) < self.batch_size:
            due = self.queue[0]
            end = min(len(due.dues), self._head + self.batch_size - len(items))
            for i in range(self._head, end):
                pos = due.positions[i]
                if pos in self.dropped:
                    self.dropped.discard(pos)
                    continue
                items.append((due.bucket, due.dues[i], pos, due.sizes[i]))
            self.queued -= end - self._head
            self._head = end
            if end == len(due.dues):
                self.queue.popleft()
                self._head = 0
        return Batch(items)

    # --- one batch ----------------------------------------------------------------------------
    async def _deliver(self, batch: Batch) -> None:
        try:
            await self._deliver_batch(batch)
        except Exception:
            # e.g. a mark could not be written: the batch goes back to the wheel, strict
            log.exception("delivery of %d timer(s) failed; they go back to the wheel",
                          len(batch.items))
            for bucket, due, pos, size in batch.items:
                self.store.uncertain.add(pos)
                self.store.wheel.add(due, pos, size, bucket)
            await asyncio.sleep(RETRY_MAX_S)
        finally:
            for item in batch.items:
                self.sending.pop(item[2], None)
            batch.done.set()

    async def _deliver_batch(self, batch: Batch) -> None:
        store = self.store
        now = self.clock.now_ms()
        entries = store.read([(pos, size) for _, _, pos, size in batch.items])
        ready: list[tuple[int, int, int, Entry]] = []  # (bucket, due, pos, entry)
        skipped: dict[int, list[tuple[int, Mark]]] = {}
        for (bucket, _due, pos, _), entry in zip(batch.items, entries, strict=True):
            if not isinstance(entry, Entry) or entry.bucket != bucket:
                log.error("timer at %d of bucket %d is unreadable (%s): skipped", pos, bucket,
                          entry if not isinstance(entry, Entry) else "filed elsewhere")
                skipped.setdefault(bucket, []).append((pos, Mark.SKIPPED))
            elif entry.due_ms > now:  # never early: the log's due time is the truth
                store.wheel.add(entry.due_ms, pos, entry.size, bucket)
            else:
                ready.append((bucket, entry.due_ms, pos, entry))
        if skipped:
            await store.add_marks(skipped)
            for bucket, items in skipped.items():
                store.finished(bucket, len(items))
        if not ready:
            return
        intents: dict[int, list[tuple[int, Mark]]] = {}
        for bucket, _, pos, _ in ready:
            intents.setdefault(bucket, []).append((pos, Mark.INTENT))
        await store.add_marks(intents)
        strict = [i for i, item in enumerate(ready) if item[2] in store.uncertain]
        payloads = [strip_roll(item[3].payload) for item in ready]
        await self._send(payloads, strict)
        done: dict[int, list[tuple[int, Mark]]] = {}
        for bucket, _, pos, _ in ready:
            done.setdefault(bucket, []).append((pos, Mark.DELIVERED))
            store.uncertain.discard(pos)
        await store.add_marks(done)
        acked = self.clock.now_ms()
        for bucket, items in done.items():
            store.finished(bucket, len(items))
        self.metrics.delivered(len(ready), [acked - due for _, due, _, _ in ready], "timer")

    async def _send(self, payloads: list[bytes], strict: list[int]) -> None:
        """Deliver until the broker takes it; after a failure every record goes strict."""
        delay = RETRY_MIN_S
        while True:
            try:
                answer = await self.broker.deliver(deliver_body(payloads, strict))
                if answer.get("duplicates"):
                    self.metrics.duplicates.inc(answer["duplicates"])
                return
            except BrokerError as exc:
                level = logging.WARNING if isinstance(exc, BrokerDown) else logging.ERROR
                log.log(level, "delivering %d timer(s) failed (%s); retrying in %.2fs",
                        len(payloads), exc, delay)
                self.metrics.delivery_failures.inc()
                if not isinstance(exc, BrokerDown) or exc.maybe_done:
                    strict = list(range(len(payloads)))  # it may be stored: look first
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    # --- for cancel -------------------------------------------------------------------------
    def state(self, pos: int) -> Where | None:
        if pos in self.sending:
            return Where.SENDING
        if pos in self.dropped:
            return None
        for i, due in enumerate(self.queue):
            if pos in due.positions:
                k = due.positions.index(pos)
                if i > 0 or k >= self._head:
                    return Where.QUEUED
        return None

    def drop(self, pos: int) -> None:
        """A queued timer was cancelled: leave it out of its batch."""
        self.dropped.add(pos)

    async def wait(self, pos: int) -> None:
        batch = self.sending.get(pos)
        if batch is not None:
            await batch.done.wait()

    def queued_due(self) -> int | None:
        """Earliest due time among timers queued or in flight (overdue ones)."""
        dues = [min(d.dues) for d in self.queue if len(d.dues)]
        dues += [item[1] for b in {id(b): b for b in self.sending.values()}.values()
                 for item in b.items[:1]]
        return min(dues, default=None)
