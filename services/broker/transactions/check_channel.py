"""The check channel: transaction checks waiting for a producer of their group to long-poll them.

The checker asks the broker to check a transaction; the broker re-puts the half message (that
counts the check, whether or not a producer is alive) and offers a ``CheckTicket`` here. A
producer polls ``GET /v1/producers/{group}/checks``: the first live poller takes the tickets, so
each check goes to exactly one producer and is never handed out again — an unanswered check is
simply checked again at a later scan. A producer is live while its heartbeats are younger than
the producer expiry (30 s); a silent one gets nothing, however it polls.

Tickets wait at most ``hold_s`` for a poller (a producer restarting within that time still gets
them); a newer ticket for the same transaction replaces the older one; an ended transaction's
ticket is withdrawn. Everything here is memory: after a broker restart the next scan re-checks.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CheckTicket:
    txid: str
    message_id: str
    topic: str  # the real topic
    queue_id: int  # the real queue
    check_times: int  # counting this check
    physical_offset: int  # the half copy to show the producer
    size: int  # ... and its size
    offered_at: float  # clock() when offered


class CheckChannel:
    def __init__(self, hold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self.clock = clock
        self._queues: dict[str, OrderedDict[str, CheckTicket]] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._closed = False
        self.offered = 0
        self.handed_out = 0
        self.expired = 0
        self.woken = 0  # waiting polls woken by ``wake`` (not by their own re-look)

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def waiting_pollers(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def offer(self, group: str, ticket: CheckTicket) -> None:
        queue = self._queues.setdefault(group, OrderedDict())
        queue.pop(ticket.txid, None)
        queue[ticket.txid] = ticket
        self.offered += 1
        self._expire(group)
        self.wake(group)

    def withdraw(self, group: str, txid: str) -> None:
        """The transaction ended: nobody needs to be asked any more."""
        queue = self._queues.get(group)
        if queue is not None and queue.pop(txid, None) is not None and not queue:
            del self._queues[group]

    def wake(self, group: str) -> None:
        """Let the pollers of ``group`` look again (a ticket arrived, or a producer came alive)."""
        for fut in self._waiters.get(group, ()):
            if not fut.done():
                fut.set_result(None)
                self.woken += 1

    def close(self) -> None:
        """Answer every held poll now (shutdown)."""
        self._closed = True
        for group in list(self._waiters):
            self.wake(group)

    async def take(self, group: str, max_count: int, wait_s: float,
                   live: Callable[[], bool],
                   gone: Callable[[], Awaitable[bool]] | None = None) -> list[CheckTicket]:
        """Up to ``max_count`` tickets of ``group``, waiting up to ``wait_s`` for one; nothing
        while ``live()`` is false (the poller has not heartbeated recently), nor once ``gone()``
        says the poller hung up (a killed producer's poll must not take checks with it)."""
        deadline = self.clock() + wait_s
        loop = asyncio.get_running_loop()
        while True:
            if live() and self._queues.get(group):
                if gone is not None and await gone():
                    return []
                found = self._pop(group, max_count)
                if found:
                    return found
            remaining = deadline - self.clock()
            if remaining <= 0 or self._closed:
                return []
            fut: asyncio.Future[None] = loop.create_future()
            waiters = self._waiters.setdefault(group, set())
            waiters.add(fut)
            try:
                await asyncio.wait([fut], timeout=min(remaining, 1.0))
            finally:
                waiters.discard(fut)
                if not waiters:
                    self._waiters.pop(group, None)

    def _pop(self, group: str, max_count: int) -> list[CheckTicket]:
        self._expire(group)
        queue = self._queues.get(group)
        if not queue:
            return []
        out: list[CheckTicket] = []
        while queue and len(out) < max_count:
            out.append(queue.popitem(last=False)[1])
        if not queue:
            del self._queues[group]
        self.handed_out += len(out)
        return out

    def _expire(self, group: str) -> None:
        queue = self._queues.get(group)
        if not queue:
            return
        oldest = self.clock() - self.hold_s
        while queue:
            first = next(iter(queue.values()))
            if first.offered_at >= oldest:
                break
            queue.popitem(last=False)
            self.expired += 1
        if not queue:
            del self._queues[group]
