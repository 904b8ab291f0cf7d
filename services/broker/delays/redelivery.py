"""Re-deliveries that race their first delivery: the scheduler's strict retry, made safe.

A record the scheduler marks ``strict`` (it is unsure an earlier request stored it: a failed or
abandoned request, a crash between its intent and its outcome) is looked up by its unique key
before it is stored (``DelayService._delivered``). That lookup sees only what is written. The
earlier request may still be on its way through this broker: its handler waiting for the
writer, or its bytes read from the socket only now, after a stall long enough for the
scheduler to give up on it (a paused process, a lossy link). Both would then be stored.

So every delivery in progress registers its key (topic, id, reconsume count and born time:
one delivery of one message, ``DeliveryKey``). A record whose key another request is storing
waits for that request, then is looked up like a strict one. And the keys of a strict request
are remembered for ``REDELIVERY_WINDOW_S``: an earlier request reaching the broker after its
retry was stored is looked up too. Records of neither kind, the common case, cost two
dictionary operations each.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tidemq.protocol import UNIQ_KEY

from tidemq_server.broker.store.types import MessageRecord

# how long the keys of a strict delivery are remembered, in case the request it retries
# reaches the broker after it (s): far beyond a socket held through a stall
REDELIVERY_WINDOW_S = 120.0
REDELIVERY_KEYS_MAX = 100_000  # at most this many remembered keys (the oldest go first)

#: (topic, message id, reconsume count, born ms): one delivery of one message
DeliveryKey = tuple[str, str, int, int]


def delivery_key(record: MessageRecord) -> DeliveryKey:
    return (record.topic, record.properties[UNIQ_KEY], record.reconsume_times,
            record.born_timestamp)


class RedeliveryGuard:
    def __init__(self, window_s: float = REDELIVERY_WINDOW_S,
                 max_keys: int = REDELIVERY_KEYS_MAX) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._storing: dict[DeliveryKey, asyncio.Future[None]] = {}
        self._retried: OrderedDict[DeliveryKey, float] = OrderedDict()  # key → monotonic s
        self.waited = 0  # how often a request waited for another storing the same deliveries

    async def to_look_up(self, keys: Sequence[DeliveryKey], strict: set[int]) -> set[int]:
        """Indexes of ``keys`` to look up before storing: the ``strict`` ones, those another
        request is storing now (once it is done) and those a strict request stored lately.
        The caller enters ``storing`` with no await in between."""
        storing, retried = self._storing, self._retried
        look = set(strict)
        if retried:
            self._expire()
            look.update(i for i, key in enumerate(keys) if key in retried)
        while storing:  # until none is in progress: a request waited for may have failed
            waits: set[asyncio.Future[None]] = set()
            for i, key in enumerate(keys):
                if (fut := storing.get(key)) is not None:
                    waits.add(fut)
                    look.add(i)
            if not waits:
                break
            self.waited += len(waits)
            await asyncio.wait(waits)
        return look

    @contextmanager
    def storing(self, keys: Sequence[DeliveryKey], strict: bool) -> Iterator[None]:
        """While these keys are being stored (``strict``: by a strict request, whose keys are
        then remembered for the window)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        storing = self._storing
        for key in keys:
            storing[key] = fut
        try:
            yield
        finally:
            for key in keys:
                if storing.get(key) is fut:
                    del storing[key]
            fut.set_result(None)
            if strict:
                self._remember(keys)

    def _remember(self, keys: Sequence[DeliveryKey]) -> None:
        now, retried = time.monotonic(), self._retried
        for key in keys:
            retried[key] = now
            retried.move_to_end(key)
        while len(retried) > self.max_keys:
            retried.popitem(last=False)

    def _expire(self) -> None:
        horizon, retried = time.monotonic() - self.window_s, self._retried
        while retried:
            key, at = next(iter(retried.items()))
            if at >= horizon:
                break
            del retried[key]
