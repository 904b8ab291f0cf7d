"""Coalescing for the transactional producer: concurrent half sends and ends share requests.

Items wait per broker: half messages (grouped by topic and check immunity) for up to
``linger_s`` or until ``max_items``; an end only until the current event-loop tick ends
(everything ended in that tick shares the request — its sender is blocked on it), or, when its
sender does not wait for it (``wait_for_end=False``), up to ``linger_s`` like a half message.
A flush sends one request per half group, the first of them also carrying the waiting ends
(``POST /v1/transactions`` with ``messages`` and ``ends``), or, with no half message waiting,
the ends alone (``POST /v1/transactions/end``). So a steady stream of transactions costs about
one request per batch, not two. Each item's future gets its own result; a request that fails
as a whole fails its half messages, and its ends are sent again on their own (an end is
idempotent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidemq._exceptions import ClientClosedError, UnexpectedResponseError
from tidemq._tasks import finish_tasks
from tidemq.protocol import OutgoingMessage

log = logging.getLogger("tidemq.transactions.batch")

ENDS_PER_ITEM = 4  # a request carries up to this many ends per half message it may carry
EndItem = tuple[str, str, bool]  # (transaction id, action, from_check)
HalfGroup = tuple[str, float | None]  # (topic, check immunity)
Result = str | BaseException  # a transaction id / a state, or this item's error

#: ``post(broker, group, messages, ends)`` → (one transaction id per message, one state per end)
PostFunction = Callable[[str, HalfGroup | None, list[OutgoingMessage], list[EndItem]],
                        Awaitable[tuple[list[Result], list[Result]]]]


@dataclass(slots=True)
class _Open:
    halves: dict[HalfGroup, list[tuple[OutgoingMessage, asyncio.Future[str]]]] = field(
        default_factory=dict)
    ends: list[tuple[EndItem, asyncio.Future[str]]] = field(default_factory=list)
    timer: asyncio.Handle | None = None


class TxBatcher:
    def __init__(self, post: PostFunction, *, linger_s: float, max_items: int,
                 max_in_flight: int) -> None:
        self._post = post
        self.linger_s = linger_s
        self.max_items = max_items
        self._open: dict[str, _Open] = {}
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # requests sent (tests and stats)

    def half(self, broker: str, group: HalfGroup, message: OutgoingMessage
             ) -> asyncio.Future[str]:
        """Queue a half message; the future gets its transaction id."""
        pending = self._batch(broker, self.linger_s)
        items = pending.halves.setdefault(group, [])
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        items.append((message, future))
        if len(items) >= self.max_items:
            self._flush(broker)
        return future

    def end(self, broker: str, item: EndItem, *, awaited: bool = True) -> asyncio.Future[str]:
        """Queue an end; the future gets the transaction's state.

        An ``awaited`` end goes at the end of this tick (its sender is blocked on it); one
        nobody waits for (``wait_for_end=False``) may wait like a half message, up to
        ``linger_s``, so it rides with the next half messages' request instead of its own."""
        pending = self._batch(broker, 0.0 if awaited else self.linger_s)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        pending.ends.append((item, future))
        if len(pending.ends) >= self.max_items * ENDS_PER_ITEM:  # ends are small: wait for more
            self._flush(broker)
        return future

    async def drain(self, timeout_s: float) -> None:
        """Send everything waiting and wait (bounded) for the requests."""
        for broker in list(self._open):
            self._flush(broker)
        await finish_tasks(self._tasks, timeout_s)

    def _batch(self, broker: str, linger_s: float) -> _Open:
        pending = self._open.get(broker)
        if pending is None:
            pending = self._open[broker] = _Open()
            loop = asyncio.get_running_loop()
            pending.timer = (loop.call_later(linger_s, self._flush, broker) if linger_s > 0
                             else loop.call_soon(self._flush, broker))
        return pending

    def _flush(self, broker: str) -> None:
        pending = self._open.pop(broker, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        ends = pending.ends
        requests: list[tuple[HalfGroup | None, list[tuple[OutgoingMessage, asyncio.Future[str]]],
                             list[tuple[EndItem, asyncio.Future[str]]]]] = []
        for half_group, items in pending.halves.items():
            requests.append((half_group, items, ends))
            ends = []
        if ends:
            requests.append((None, [], ends))
        for group, items, with_ends in requests:
            task = asyncio.create_task(self._run(broker, group, items, with_ends),
                                       name="tidemq-tx-batch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, broker: str, group: HalfGroup | None,
                   items: list[tuple[OutgoingMessage, asyncio.Future[str]]],
                   ends: list[tuple[EndItem, asyncio.Future[str]]]) -> None:
        futures = [f for _, f in items] + [f for _, f in ends]
        try:
            async with self._slots:
                self.requests += 1
                txids, states = await self._post(broker, group, [m for m, _ in items],
                                                 [e for e, _ in ends])
        except asyncio.CancelledError:
            _fail(futures, ClientClosedError("closed before the request completed"))
            raise
        except Exception as exc:
            _fail([f for _, f in items], exc)
            if ends and items:  # the ends did not fail on their own: send them alone
                log.info("a request with %d end(s) failed (%s); sending the ends alone",
                         len(ends), exc)
                await self._run(broker, None, [], ends)
            else:
                _fail([f for _, f in ends], exc)
            return
        if len(txids) != len(items) or len(states) != len(ends):
            _fail(futures, UnexpectedResponseError(
                f"sent {len(items)} half messages and {len(ends)} ends, got {len(txids)} and "
                f"{len(states)} results"))
            return
        for future, result in zip(futures, [*txids, *states], strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def _fail(futures: list[asyncio.Future[str]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
