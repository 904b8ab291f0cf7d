"""Coalescing of concurrent sends into one request per (broker, topic).

A send appends its message to the open batch of its (broker, topic) and waits on its own future.
Linger is adaptive, so one message never waits for company: when no request to that (broker,
topic) is outstanding, the batch goes at the end of the current event-loop turn (the sends made
in the same turn share it); while one is outstanding, the batch gathers until that request
answers, or ``linger_s`` passes, whichever is first. A full batch (``max_messages`` or
``max_bytes``) goes at once. Under load this turns many sends into few requests; on a quiet
topic a message costs one round trip. The answer's results come back in request order, so
result *i* resolves the future of message *i*. A failed request fails every future of its batch
— except a rejection that names one bad message (400/413), after which each message of a
multi-message batch is sent on its own so that only the bad one fails. Retrying is the
producer's: each failed message is queued again (same message id), to the same broker or
another group (``tidemq._fault``), and coalesces with the others going there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidemq._constants import MESSAGE_OVERHEAD_BYTES
from tidemq._exceptions import ClientClosedError, ServerError, UnexpectedResponseError
from tidemq._message import SendResult
from tidemq._tasks import finish_tasks
from tidemq.protocol import ErrorCode, OutgoingMessage

log = logging.getLogger("tidemq.producer.batch")

#: ``send(broker, topic, messages)`` → one result per message, in order.
SendFunction = Callable[[str, str, list[OutgoingMessage]], Awaitable[list[SendResult]]]

#: Rejections caused by one message's content: a smaller batch may pass.
_PER_MESSAGE_CODES = frozenset({ErrorCode.BAD_REQUEST, ErrorCode.INVALID_DELAY,
                                ErrorCode.INVALID_BODY_ENCODING, ErrorCode.MESSAGE_TOO_LARGE})


@dataclass(slots=True)
class _Batch:
    broker: str
    topic: str
    loop: asyncio.AbstractEventLoop  # the futures' (asked once a batch, not once a message)
    messages: list[OutgoingMessage] = field(default_factory=list)
    futures: list[asyncio.Future[SendResult]] = field(default_factory=list)
    size: int = 0
    timer: asyncio.Handle | None = None


class Coalescer:
    """Gathers messages per (broker, topic) and sends each batch as one request."""

    def __init__(
        self,
        send: SendFunction,
        *,
        linger_s: float,
        max_messages: int,
        max_bytes: int,
        max_in_flight: int,
    ) -> None:
        self._send = send
        self.linger_s = linger_s
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._open: dict[tuple[str, str], _Batch] = {}
        self._outstanding: dict[tuple[str, str], int] = {}  # requests flushed, not answered
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests_sent = 0  # batches handed to ``send``, for tests and stats

    def submit(
        self, broker: str, topic: str, message: OutgoingMessage,
    ) -> asyncio.Future[SendResult]:
        """Queue ``message``; the returned future resolves with its own result."""
        key = (broker, topic)
        # wire_size, inlined (once per message)
        size = len(message.body) + MESSAGE_OVERHEAD_BYTES + (
            message.properties_size() if message.properties else 0)
        batch = self._open.get(key)
        if batch is not None and batch.size + size > self.max_bytes:
            self._flush(key)
            batch = None
        if batch is None:
            # get_running_loop once a batch: on Python 3.11 each call is a getpid() syscall
            loop = asyncio.get_running_loop()
            batch = _Batch(broker, topic, loop)
            self._open[key] = batch
            if self.linger_s > 0 and self._outstanding.get(key, 0):
                # a request is out: gather until it answers (``_run`` flushes), at most linger
                batch.timer = loop.call_later(self.linger_s, self._flush, key)
            else:
                batch.timer = loop.call_soon(self._flush, key)
        future: asyncio.Future[SendResult] = batch.loop.create_future()
        batch.messages.append(message)
        batch.futures.append(future)
        batch.size += size
        if len(batch.messages) >= self.max_messages:
            self._flush(key)
        return future

    def flush_all(self) -> None:
        """Send every open batch now."""
        for key in list(self._open):
            self._flush(key)

    async def drain(self, timeout_s: float) -> None:
        """Send open batches and wait for every request; fail what is left after the timeout."""
        deadline = time.monotonic() + timeout_s
        # a send that fails during the drain may be resubmitted (same broker, or another
        # group): keep waiting while new batches appear, until the deadline
        while True:
            self.flush_all()
            if not self._tasks or time.monotonic() >= deadline:
                break
            await asyncio.wait(set(self._tasks), timeout=deadline - time.monotonic())
        await finish_tasks(self._tasks, max(0.0, deadline - time.monotonic()))

    def _flush(self, key: tuple[str, str]) -> None:
        batch = self._open.pop(key, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        self._outstanding[key] = self._outstanding.get(key, 0) + 1
        task = asyncio.create_task(self._run(batch), name=f"tidemq-send-{batch.topic}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: _Batch) -> None:
        key = (batch.broker, batch.topic)
        try:
            async with self._in_flight:
                await self._deliver(batch.broker, batch.topic, batch.messages, batch.futures)
        except asyncio.CancelledError:
            _fail(batch.futures, ClientClosedError("the producer closed before the send completed"))
            raise
        finally:
            left = self._outstanding.pop(key, 1) - 1
            if left:
                self._outstanding[key] = left
            if key in self._open:  # what gathered while this request was out goes now
                self._flush(key)

    async def _deliver(
        self, broker: str, topic: str, messages: list[OutgoingMessage],
        futures: list[asyncio.Future[SendResult]],
    ) -> None:
        self.requests_sent += 1
        try:
            results = await self._send(broker, topic, messages)
            if len(results) != len(messages):
                raise UnexpectedResponseError(
                    f"sent {len(messages)} messages to {topic!r}, got {len(results)} results")
        except ServerError as exc:
            if exc.error_code in _PER_MESSAGE_CODES and len(messages) > 1:
                log.info("batch of %d to %r rejected (%s); sending each message alone",
                         len(messages), topic, exc.code)
                await asyncio.gather(*(
                    self._deliver(broker, topic, [m], [f])
                    for m, f in zip(messages, futures, strict=True)
                ))
                return
            _fail(futures, exc)
        except Exception as exc:  # a TidemqError, or a bug that must reach the callers
            _fail(futures, exc)
        else:
            for future, result in zip(futures, results, strict=True):
                if not future.done():
                    future.set_result(result)


def _fail(futures: list[asyncio.Future[SendResult]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
