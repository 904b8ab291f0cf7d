"""One outstanding long poll per broker for all of a push consumer's queues on it.

A consumer with a pull per queue keeps N requests held and pays N round trips when messages
trickle in (each queue's answer carries one message and its next pull must travel before the
queue can answer again). ``BrokerPuller`` names every ready queue of its broker in one
``POST /v1/pull``: the broker answers the moment any of them has a message, with every queue
that has one. The next poll leaves as soon as an answer's offsets are recorded, before its
messages are handed out, so one poll is always outstanding while handlers run.

The queues keep what is theirs (``QueuePuller``): offsets, flow control (a queue whose handlers
hold ``max_span`` offsets sits out the polls until they finish; while one does, polls are held
for at most ``_PAUSED_WAIT_MS`` so that it rejoins soon), tag filtering, failure handling and
hand-back to the retry topic. An error of one queue in the answer (topic gone, offset out of
range) is that queue's alone; a failed request (broker unreachable, 503) backs the broker off as
before. A queue added while a poll is held cancels that poll so the next one names it.

Ordered consumers keep one loop per queue: each queue's messages must run one at a time, and
waiting for one queue's handler must not hold the others back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tidemq._broker_api import BrokerApi, PullResult, QueueAsk
from tidemq._exceptions import ServerError, TidemqError, TopicNotFoundError, TransportError
from tidemq._fault import BrokerHealth
from tidemq._http import NO_RETRY
from tidemq._puller import _PULL_BACKOFF, PullerSettings, QueuePuller, broker_down
from tidemq._routes import MessageQueue

log = logging.getLogger("tidemq.consumer")

_PAUSED_WAIT_MS = 100  # poll hold while a queue sits out for flow control
_IDLE_PAUSE_S = 0.05  # no queue is ready: look again after this


class BrokerPuller:
    """The shared long poll of one broker's queues (see module doc)."""

    def __init__(self, address: str, api: BrokerApi, settings: PullerSettings,
                 health: BrokerHealth, on_route_error: Callable[[str], None] | None) -> None:
        self.address = address
        self._api = api
        self._s = settings
        self._health = health
        self._on_route_error = on_route_error
        self._queues: dict[MessageQueue, QueuePuller] = {}
        self._task: asyncio.Task[None] | None = None
        self._poll: asyncio.Task[list[tuple[MessageQueue, PullResult | ServerError]]] | None \
            = None
        self._asked: frozenset[MessageQueue] = frozenset()  # the queues of the poll out
        self._nudge = asyncio.Event()
        self._rotate = 0  # the queue the next poll names first (fair share of MAX_PULL_TOTAL)
        self.failures = 0

    def __len__(self) -> int:
        return len(self._queues)

    def add(self, puller: QueuePuller) -> None:
        puller.shared = self._detach
        self._queues[puller.queue] = puller
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"tidemq-pull-{self.address}")
        elif self._poll is not None and not self._poll.done() and \
                puller.queue not in self._asked:
            self._poll.cancel()  # held without the new queue: ask again, naming it
        self._nudge.set()

    def _detach(self, puller: QueuePuller) -> None:
        if self._queues.get(puller.queue) is puller:
            del self._queues[puller.queue]
        if not self._queues and self._poll is not None:
            self._poll.cancel()  # nothing left to poll for: release the held request

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self._queues:
                if self._poll is None and not await self._start_poll():
                    continue
                poll = self._poll
                assert poll is not None
                await asyncio.wait((poll,))
                self._poll = None
                if poll.cancelled():
                    continue  # a queue was added: ask again
                exc = poll.exception()
                if exc is not None:
                    if not isinstance(exc, TidemqError):
                        raise exc
                    await self._failed(exc)
                    continue
                await self._answered(poll.result())
        finally:
            if self._poll is not None:
                self._poll.cancel()
                self._poll = None
            self._task = None if self._task is asyncio.current_task() else self._task

    async def _start_poll(self) -> bool:
        """Send the next poll over the ready queues; False (after a pause) when none is."""
        if wait := self._health.wait_s(self.address):
            await asyncio.sleep(wait)  # the broker is backing off: its queues pause
            return False
        if self._send_poll():
            return True
        self._nudge.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._nudge.wait(), _IDLE_PAUSE_S)
        return False

    def _send_poll(self) -> bool:
        """Send a poll over the ready queues now; False when none is ready (flow control)."""
        now = time.monotonic()
        pullers = list(self._queues.values())
        ready = [p for p in pullers if p.ready(now)]
        if not ready:
            return False
        if len(ready) > 1:  # a different queue first each time: fair share of a full answer
            self._rotate = (self._rotate + 1) % len(ready)
            ready = ready[self._rotate:] + ready[:self._rotate]
        wait_ms = self._s.pull_wait_ms
        if len(ready) < len(pullers):
            wait_ms = min(wait_ms, _PAUSED_WAIT_MS)  # let a paused queue rejoin soon
        asks = [QueueAsk(p.queue, p.tracker.next_offset, p.wire_tags()) for p in ready]
        self._asked = frozenset(p.queue for p in ready)
        self._poll = asyncio.create_task(self._api.pull_many(
            self.address, asks, max_messages=self._s.pull_batch, wait_ms=wait_ms,
            group=self._s.group if self._s.clustering else None, retry=NO_RETRY))
        return True

    async def _answered(self, entries: list[tuple[MessageQueue, PullResult | ServerError]],
                        ) -> None:
        self.failures = 0
        if self._health.succeeded(self.address):
            log.info("broker %s is back: its queues resume", self.address)
        now = time.monotonic()
        deliveries: list[tuple[QueuePuller, PullResult]] = []
        for queue, result in entries:
            puller = self._queues.get(queue)
            if puller is None or puller.stopping:
                continue  # revoked meanwhile: the next owner reads these again
            if isinstance(result, PullResult):
                puller.accept(result)
                if result.messages:
                    deliveries.append((puller, result))
            else:
                puller.queue_failed(result, now)
        if deliveries and self._queues:  # the next poll is out while these are handed over
            self._send_poll()
        for puller, result in deliveries:
            await puller.deliver(result)

    async def _failed(self, exc: TidemqError) -> None:
        self.failures += 1
        if self._on_route_error and isinstance(exc, TopicNotFoundError | TransportError):
            for topic in sorted({q.topic for q in self._queues}):
                self._on_route_error(topic)
        if broker_down(exc):
            if self._health.failed(self.address):
                log.warning("broker %s unreachable (%s): its queues pause and resume where "
                            "they left off", self.address, exc)
            return
        loud = self.failures in (1, 10) or self.failures % 100 == 0
        log.log(logging.WARNING if loud else logging.DEBUG, "pull from %s failed (%d in a "
                "row): %s", self.address, self.failures, exc)
        await asyncio.sleep(_PULL_BACKOFF.backoff_s(min(self.failures, 10)))
