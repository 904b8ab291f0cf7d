"""One queue of a push consumer: the pull loop, handler dispatch and failure handling.

Concurrent mode: pulled messages go to the consumer's ``HandlerPool``, whose workers run at most
``max_concurrency`` handlers across the consumer (no task per message); the queue's
``OffsetTracker`` keeps the committable offset below every unfinished message. Pulling pauses
while the span between the oldest unfinished message and the pull position exceeds
``max_span`` (a stuck handler must not let memory grow without bound).

Ordered mode: the queue's messages run one after another; a failure is retried in place after a
pause, up to ``max_reconsume_times``, and only then handed to the broker's retry.

A failed message (``RETRY_LATER``, an exception or a timeout) is, in clustering mode, handed to
``POST /v1/groups/{group}/retry``; if that call fails the message is consumed again locally
after a pause and handed back again — it stays unfinished (so uncommitted) until one succeeds.
In broadcasting mode there is no shared retry topic: the message is retried locally and then
dropped with an error log.

A broker that cannot be reached (or answers 503) pauses every queue of it: the consumer's
``BrokerHealth`` backs off (shared by the queues of that broker, logged once when it goes and
once when it is back) and the queue resumes at the offset it had — nothing is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from tidemq import _hooks
from tidemq._broker_api import BrokerApi, PullResult
from tidemq._exceptions import (
    OffsetOutOfRangeError,
    ServerError,
    TidemqError,
    TopicNotFoundError,
    TransportError,
)
from tidemq._fault import BrokerHealth
from tidemq._handler_pool import HandlerPool
from tidemq._http import NO_RETRY, RetryPolicy
from tidemq._offsets import OffsetTracker
from tidemq._routes import MessageQueue
from tidemq._tags import TagExpression
from tidemq.protocol import ReceivedMessage, retry_topic

log = logging.getLogger("tidemq.consumer")

_PULL_BACKOFF = RetryPolicy(initial_backoff_s=0.2, max_backoff_s=5.0, deadline_s=None)


class ConsumeResult(StrEnum):
    SUCCESS = "success"  # consumed: its offset may be committed
    RETRY_LATER = "retry_later"  # failed: deliver it again later (via %RETRY%<group>)


#: An async handler; returning None counts as SUCCESS, raising as RETRY_LATER.
Handler = Callable[[ReceivedMessage], Awaitable[ConsumeResult | None]]


@dataclass(frozen=True, slots=True)
class PullerSettings:
    group: str
    clustering: bool
    orderly: bool
    pull_batch: int
    pull_wait_ms: int
    max_reconsume_times: int
    orderly_retry_pause_s: float
    local_retry_pause_s: float
    consume_timeout_s: float | None
    max_span: int = 2000  # pause pulling while this many offsets lie between oldest and next


class QueuePuller:
    """Pulls one queue and hands its messages to the handler until stopped."""

    def __init__(
        self, queue: MessageQueue, tracker: OffsetTracker, expression: TagExpression,
        api: BrokerApi, handler: Handler, permits: asyncio.Semaphore, settings: PullerSettings,
        on_route_error: Callable[[str], None] | None = None,
        health: BrokerHealth | None = None, pool: HandlerPool | None = None,
    ) -> None:
        self.queue = queue
        self.tracker = tracker
        self.expression = expression
        self._api = api
        self._handler = handler
        self._permits = permits
        self._pool = None if settings.orderly else pool  # concurrent mode's handler workers
        self._s = settings
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._messages: set[asyncio.Task[None]] = set()
        self._retry_topic = retry_topic(settings.group)
        self._on_route_error = on_route_error  # the topic moved or the broker is gone
        self._health = health  # shared by every queue of the consumer, keyed by address
        # Pulled by its broker's shared long poll (BrokerPuller) instead of a loop of its own:
        self.shared: Callable[[QueuePuller], None] | None = None  # detaches it on stop
        self.failures = 0  # failed pulls in a row (shared mode)
        self.paused_until = 0.0  # shared mode: a failed queue waits (loop clock)
        self._resetting = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    def ready(self, now: float) -> bool:
        """Shared mode: whether this queue joins the next poll (flow control, back-off)."""
        return (not self._stopping and not self._resetting and now >= self.paused_until
                and self.tracker.next_offset - self.tracker.committable() <= self._s.max_span)

    def wire_tags(self) -> str:
        return self._wire_tags()

    def accept(self, result: PullResult) -> None:
        """Shared mode: record a pull's answer (its messages are now in flight)."""
        self.failures = 0
        self.tracker.pulled([m.queue_offset for m in result.messages], result.next_offset)

    async def deliver(self, result: PullResult) -> None:
        """Shared mode: hand an accepted answer's messages to the handler."""
        for message in result.messages:
            if self._stopping:
                return  # revoked: unfinished, so the next owner gets them
            await self._dispatch(message, result.origin_topics.get(message.queue_offset))

    def queue_failed(self, exc: TidemqError, now: float) -> None:
        """Shared mode: this queue's own error in a multi-queue answer."""
        if isinstance(exc, OffsetOutOfRangeError):
            self._resetting = True
            task = asyncio.create_task(self._reset_shared(), name=f"tidemq-reset-{self.queue}")
            self._messages.add(task)
            task.add_done_callback(self._messages.discard)
            return
        self.failures += 1
        if self._on_route_error and isinstance(exc, TopicNotFoundError | TransportError):
            self._on_route_error(self.queue.topic)
        loud = self.failures in (1, 10) or self.failures % 100 == 0
        kind = "topic gone" if isinstance(exc, TopicNotFoundError) else "pull failed"
        log.log(logging.WARNING if loud else logging.DEBUG, "%s: %s (%d in a row): %s",
                self.queue, kind, self.failures, exc)
        self.paused_until = now + _PULL_BACKOFF.backoff_s(min(self.failures, 10))

    async def _reset_shared(self) -> None:
        try:
            await self._reset_offset()
        finally:
            self._resetting = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"tidemq-pull-{self.queue}")

    async def stop(self, timeout_s: float) -> None:
        """Stop pulling; wait up to ``timeout_s`` for handlers, then cancel what still runs."""
        self._stopping = True
        if self.shared is not None:
            self.shared(self)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        cancelled = 0
        if self._pool is not None:
            await self._pool.settle(self, timeout_s)  # the workers finish this queue's handlers
            cancelled = self._pool.revoke(self)
        if self._messages:  # tasks started by now (wait yields first), so permits are released
            _, pending = await asyncio.wait(set(self._messages),
                                            timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()
            cancelled += len(pending)
            if pending:
                await asyncio.wait(pending)
        if cancelled:
            log.warning("%s: %d handler(s) still running after %.1fs were cancelled; "
                        "their messages will be delivered again", self.queue, cancelled,
                        timeout_s)

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            if self.tracker.next_offset - self.tracker.committable() > self._s.max_span:
                await asyncio.sleep(0.05)  # flow control: a slow handler holds the window
                continue
            if self._health is not None and (wait := self._health.wait_s(self.queue.address)):
                await asyncio.sleep(wait)  # the broker is backing off: this queue pauses
                continue
            try:
                result = await self._api.pull(
                    self.queue, offset=self.tracker.next_offset, max_messages=self._s.pull_batch,
                    wait_ms=self._s.pull_wait_ms, tags=self._wire_tags(),
                    group=self._s.group if self._s.clustering else None, retry=NO_RETRY)
            except OffsetOutOfRangeError:
                await self._reset_offset()
                continue
            except TidemqError as exc:
                failures += 1
                if self._on_route_error and isinstance(exc, TopicNotFoundError | TransportError):
                    self._on_route_error(self.queue.topic)
                if self._health is not None and broker_down(exc):
                    self._broker_failed(exc)
                    continue
                loud = failures in (1, 10) or failures % 100 == 0
                level = logging.WARNING if loud else logging.DEBUG
                kind = "topic gone" if isinstance(exc, TopicNotFoundError) else "pull failed"
                log.log(level, "%s: %s (%d in a row): %s", self.queue, kind, failures, exc)
                await asyncio.sleep(_PULL_BACKOFF.backoff_s(min(failures, 10)))
                continue
            failures = 0
            if self._health and self._health.succeeded(self.queue.address):
                log.info("broker %s (%s) is back: its queues resume", self.queue.broker_name,
                         self.queue.address)
            self.tracker.pulled([m.queue_offset for m in result.messages], result.next_offset)
            for message in result.messages:
                await self._dispatch(message, result.origin_topics.get(message.queue_offset))

    def _broker_failed(self, exc: TidemqError) -> None:
        assert self._health is not None
        if self._health.failed(self.queue.address):
            log.warning("broker %s (%s) unreachable (%s): its queues pause and resume where they "
                        "left off", self.queue.broker_name, self.queue.address, exc)
        else:
            log.debug("%s: broker still unreachable: %s", self.queue, exc)

    def _wire_tags(self) -> str:
        return "*" if self.queue.topic == self._retry_topic else str(self.expression)

    async def _dispatch(self, message: ReceivedMessage, origin_topic: str | None) -> None:
        if self.queue.topic == self._retry_topic:
            message.topic = origin_topic or message.topic  # handlers see the topic they subscribed
        elif not self.expression.matches(message.tag):
            self.tracker.done(message.queue_offset)  # a tag-hash collision let it through
            return
        if self._pool is not None:
            self._pool.submit(self, message)
            if self._pool.full:
                await self._pool.room()  # very many queues' answers wait: hold the next poll
            return
        await self._permits.acquire()
        if self._stopping and self.shared is not None:
            self._permits.release()  # revoked while waiting for a permit: not delivered
            return
        task = asyncio.create_task(self._process(message), name=f"tidemq-consume-{self.queue}")
        self._messages.add(task)
        task.add_done_callback(self._messages.discard)
        if self._s.orderly:
            await asyncio.shield(task)  # one at a time; stop() waits for it, bounded

    async def consume_first(self, message: ReceivedMessage) -> bool:
        """Run the handler once, with no permit or timeout of its own (a pool worker holds
        both; ``_invoke`` adds them); True when it consumed the message."""
        try:
            if _hooks.tracer is None:
                result = await self._handler(message)
            else:
                result = await _hooks.tracer.process(self._handler, message, self._s.group,
                                                     self._s.clustering)
        except Exception as exc:
            log.exception("%s: handler raised on message %s (will retry)", self.queue,
                          message.message_id)
            message.failure = f"{type(exc).__name__}: {exc}"
            return False
        if result is None or result == ConsumeResult.SUCCESS:
            return True
        message.failure = "the handler answered RETRY_LATER"
        return False

    def timed_out(self, message: ReceivedMessage, timeout_s: float | None) -> None:
        log.warning("%s: handler timed out after %ss on message %s", self.queue, timeout_s,
                    message.message_id)
        message.failure = f"the handler timed out after {timeout_s}s"

    def finished(self, message: ReceivedMessage, ok: bool) -> None:
        """A pool worker's first attempt ended: done, or failed and recovered in a task."""
        if ok:
            self.tracker.done(message.queue_offset)
            return
        task = asyncio.create_task(self._recover(message, 1),
                                   name=f"tidemq-recover-{self.queue}")
        self._messages.add(task)
        task.add_done_callback(self._messages.discard)

    async def _process(self, message: ReceivedMessage) -> None:
        if await self._invoke(message, permit_held=True):
            self.tracker.done(message.queue_offset)
            return
        await self._recover(message, 1)

    async def _recover(self, message: ReceivedMessage, attempts: int) -> None:
        """After ``attempts`` failed: retry in place (ordered, broadcasting), then hand back."""
        if self._s.orderly or not self._s.clustering:
            s = self._s
            pause = s.orderly_retry_pause_s if s.orderly else s.local_retry_pause_s
            while attempts < self._s.max_reconsume_times and not self._stopping:
                await asyncio.sleep(pause)
                message.reconsume_times += 1
                attempts += 1
                if await self._invoke(message):
                    self.tracker.done(message.queue_offset)
                    return
            if self._stopping:
                return  # unfinished: the next owner gets it again
            if not self._s.clustering:
                log.error("%s: message %s failed %d times; broadcasting mode has no retry "
                          "topic, dropping it", self.queue, message.message_id, attempts)
                self.tracker.done(message.queue_offset)
                return
        await self._hand_back(message)

    async def _hand_back(self, message: ReceivedMessage) -> None:
        """Give the message to the broker's retry; while that fails, consume it again locally."""
        while not self._stopping:
            try:
                handing: Awaitable[str] = self._api.send_to_retry(
                    self.queue.address, self._s.group, message.message_id,
                    reason=message.failure)
                if _hooks.tracer is not None:
                    handing = _hooks.tracer.settle(handing, message, self._s.group, "retry")
                where = await handing
            except TidemqError as exc:
                log.warning("%s: could not hand message %s to retry (%s); consuming it again "
                            "in %.1fs", self.queue, message.message_id, exc,
                            self._s.local_retry_pause_s)
            else:
                log.debug("%s: message %s handed to %s", self.queue, message.message_id, where)
                self.tracker.done(message.queue_offset)
                return
            await asyncio.sleep(self._s.local_retry_pause_s)
            if self._stopping:
                return
            message.reconsume_times += 1
            if await self._invoke(message):
                self.tracker.done(message.queue_offset)
                return

    async def _invoke(self, message: ReceivedMessage, *, permit_held: bool = False) -> bool:
        """Run the handler once; True when it consumed the message."""
        if not permit_held:
            await self._permits.acquire()
        try:
            # a timeout scope in this task, not wait_for: no extra task per message
            async with asyncio.timeout(self._s.consume_timeout_s):
                return await self.consume_first(message)
        except TimeoutError:
            self.timed_out(message, self._s.consume_timeout_s)
            return False
        finally:
            self._permits.release()

    async def _reset_offset(self) -> None:
        """The broker said our offset is past the queue's end: a broker that lost its tail, or
        one behind (a replica copying, a member that cut damaged records to copy them again).
        Continue at the nearest offset the queue holds now, never past ours: back to its end
        when it is still short of ours (what follows is read, perhaps again), ours when it has
        caught up meanwhile (its end fetched a moment later may be far past ours: jumping there
        skipped what lay between)."""
        offset = self.tracker.next_offset
        try:
            offsets = await self._api.topic_offsets(self.queue.address, self.queue.topic)
            found = offsets[self.queue.queue_id]
        except (TidemqError, KeyError) as exc:
            log.warning("%s: offset %d out of range and the queue's offsets are unknown: %s",
                        self.queue, offset, exc)
            await asyncio.sleep(1.0)
            return
        new = max(found.min_offset, min(offset, found.max_offset))
        if new == offset:
            log.info("%s: offset %d was past the queue's end, which has reached it since",
                     self.queue, offset)
            await asyncio.sleep(_PULL_BACKOFF.backoff_s(1))  # no tight loop if it says so again
            return
        log.warning("%s: offset %d out of range (queue [%d, %d]); continuing at %d",
                    self.queue, offset, found.min_offset, found.max_offset, new)
        self.tracker.reset(new)


def broker_down(exc: TidemqError) -> bool:
    """Whether ``exc`` says the broker itself is unavailable (not this request or queue)."""
    return isinstance(exc, TransportError) or (isinstance(exc, ServerError)
                                               and exc.status == 503)
