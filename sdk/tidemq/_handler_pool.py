"""The push consumer's handler workers (concurrent mode): no task per message.

Pulled messages wait in one line; up to ``max_concurrency`` worker tasks take them in turn and
run the handler, each worker holding one of the consumer's permits for as long as it lives (a
message retried later takes a permit of its own, so handlers never exceed the limit). A worker
that finds the line empty ends; the next message starts one again.

A handler that runs past ``consume_timeout_s`` is cancelled by one watchdog instead of a timer
per message; it looks every quarter of the timeout (at most every second), so a handler is
cancelled between 1 and 1.25 timeouts (or timeout + 1 s) after it began. The cancellation is
taken back in the worker, which goes on with the next message.

A queue that stops (revoked by a rebalance, or the consumer closing) has its waiting messages
skipped (unfinished, so they are delivered again) and may cancel its running handlers the same
way (``revoke``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemq._constants import HANDLER_WAITING_CAP as WAITING_CAP
from tidemq._constants import HANDLER_WATCH_MAX_S
from tidemq.protocol import ReceivedMessage

if TYPE_CHECKING:
    from tidemq._puller import QueuePuller


@dataclass(slots=True)
class _Running:
    puller: QueuePuller
    message: ReceivedMessage
    deadline: float
    why: str | None = None  # set just before the worker is cancelled: "timeout" or "revoked"


class HandlerPool:
    """Runs handlers of every queue of one consumer with at most ``limit`` at once."""

    def __init__(self, permits: asyncio.Semaphore, limit: int,
                 consume_timeout_s: float | None) -> None:
        self._permits = permits
        self._limit = limit
        self._timeout = consume_timeout_s
        self._line: collections.deque[tuple[QueuePuller, ReceivedMessage]] = collections.deque()
        self._workers: dict[asyncio.Task[None], _Running | None] = {}
        self._room = asyncio.Event()
        self._room.set()
        self._watchdog: asyncio.Task[None] | None = None
        self._settling: asyncio.Event | None = None  # set after each handler while one waits

    @property
    def full(self) -> bool:
        return not self._room.is_set()

    def submit(self, puller: QueuePuller, message: ReceivedMessage) -> None:
        self._line.append((puller, message))
        if len(self._workers) < self._limit:
            task = asyncio.create_task(self._work(), name="tidemq-handler")
            self._workers[task] = None
        if len(self._line) >= WAITING_CAP:
            self._room.clear()

    async def room(self) -> None:
        """Wait while the line is full (the deliverer holds back its next poll meanwhile)."""
        await self._room.wait()

    def running(self, puller: QueuePuller) -> int:
        return sum(1 for r in self._workers.values() if r is not None and r.puller is puller)

    async def settle(self, puller: QueuePuller, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` until no handler of ``puller``'s messages runs."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.running(puller):
                    if self._settling is None:
                        self._settling = asyncio.Event()
                    await self._settling.wait()

    def revoke(self, puller: QueuePuller) -> int:
        """Cancel the handlers running ``puller``'s messages; how many were."""
        n = 0
        for task, r in self._workers.items():
            if r is not None and r.puller is puller and r.why is None:
                r.why = "revoked"
                task.cancel()
                n += 1
        return n

    async def close(self) -> None:
        """Cancel every worker and the watchdog (after the queues have stopped)."""
        tasks = [*self._workers, *([self._watchdog] if self._watchdog else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._line.clear()

    # -- workers -----------------------------------------------------------------------------

    async def _work(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        line = self._line
        await self._permits.acquire()
        try:
            if self._timeout is not None and self._watchdog is None:
                self._watchdog = asyncio.create_task(self._watch(), name="tidemq-handler-watch")
            timeout = self._timeout if self._timeout is not None else float("inf")
            while line:
                puller, message = line.popleft()
                if not self._room.is_set() and len(line) < WAITING_CAP // 2:
                    self._room.set()
                if puller.stopping:
                    continue  # revoked: unfinished, so the next owner gets it again
                running = self._workers[me] = _Running(puller, message, loop.time() + timeout)
                try:
                    ok = await puller.consume_first(message)
                except asyncio.CancelledError:
                    if running.why is None:
                        raise  # the consumer is closing
                    me.uncancel()
                    if running.why == "revoked":
                        continue  # unfinished: the queue's next owner gets it
                    puller.timed_out(message, self._timeout)
                    ok = False
                finally:
                    self._workers[me] = None
                    if self._settling is not None:
                        self._settling.set()  # a stopping queue looks again
                        self._settling = None
                puller.finished(message, ok)
        finally:
            self._permits.release()
            self._workers.pop(me, None)
            if not line:
                self._room.set()

    async def _watch(self) -> None:
        assert self._timeout is not None
        period = min(HANDLER_WATCH_MAX_S, self._timeout / 4)
        loop = asyncio.get_running_loop()
        try:
            while self._workers:
                await asyncio.sleep(period)
                now = loop.time()
                for task, r in self._workers.items():
                    if r is not None and r.why is None and now >= r.deadline:
                        r.why = "timeout"
                        task.cancel()
        finally:
            self._watchdog = None
