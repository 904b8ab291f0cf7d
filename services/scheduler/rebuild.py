"""Rebuild: a scheduler whose timer store is empty (a new disk, a lost or corrupt data
directory) takes its pending timers back from the broker's replicated commit log.

1. read the rebuild floor from Redis (services/scheduler/rolls.py keeps it there, and the
   broker's retention floor with it): every pending timer has an intake record at or past it;
2. note where intake ends now (``end``): a timer taken in below it may have been delivered by
   the lost store; one past it was never taken in;
3. read every (topic, id) of ``TIDE_SYS_TIMER_CANCELS`` and keep them as cancels of any copy
   of that id in that topic below ``end`` (fsynced in the store's pre-cancel file, so a crash
   mid-rebuild keeps them); the same id waiting in another topic stays pending;
4. record ``end`` in the store's checkpoint, then take intake in from the floor as usual.

What the rebuild files is delivered ``strict``: the broker stores it only if that delivery is
not in the real topic already (its unique-key index), so none is delivered twice; the due time
comes from the intake record, so none is early. Rolled copies of one timer collapse into one
(``Roller.resolve``). A scheduler that crashes mid-rebuild resumes it from its checkpoint.
"""

from __future__ import annotations

import asyncio
import logging

from tidemq_server.common.broker_client import BrokerClient
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.timers import TimerStore

log = logging.getLogger(__name__)

CANCELS_PAGE = 4096  # cancel ids per read


async def read_cancels(broker: BrokerClient) -> list[tuple[str | None, str]]:
    """Every (topic, message id) in the broker's cancel topic (what retention kept); the topic
    is None for a cancel record that names none (written by an older broker: any topic)."""
    ids: list[tuple[str | None, str]] = []
    offset = 0
    while True:
        answer = await broker.timer_cancels(offset, CANCELS_PAGE)
        mids = [str(m) for m in answer["message_ids"]]
        topics = answer.get("topics") or [None] * len(mids)
        ids += [(str(t) if t else None, m) for t, m in zip(topics, mids, strict=True)]
        nxt = int(answer["next_offset"])
        if nxt <= offset or nxt >= int(answer["max_offset"]):
            return ids
        offset = nxt


async def prepare(store: TimerStore, broker: BrokerClient, metrics: SchedulerMetrics,
                  floor: int | None) -> int | None:
    """For a fresh store (or one whose rebuild was cut short): set up the rebuild and answer
    the intake offset to start from — not the intake progress in Redis, which the lost store
    had moved on. None: nothing to rebuild."""
    if not store.fresh:
        if not store.rebuilding:
            return None
        log.info("resuming the rebuild of the timer store: intake from %d up to %d",
                 store.ingested_next, store.rebuild_end)
        return store.ingested_next
    start = floor if floor is not None else 0
    bounds = await broker.intake(start, 1, 0)
    end = int(bounds["max_offset"])
    if start > end:  # a new broker store under the last run's Redis: its floor means nothing
        log.warning("the saved rebuild floor %d is past the end of the broker's intake topic "
                    "(%d): a new broker store; taking intake in from %d", start, end, end)
        start = end
    store.ingested_next = start
    if end <= start:  # nothing to re-read (a first start, or every timer done)
        store.fresh = False
        return start
    cancelled = await read_cancels(broker)
    await asyncio.to_thread(store.precancels.add_rebuilt, cancelled, end)
    await asyncio.to_thread(store.begin_rebuild, end)
    store.fresh = False
    metrics.rebuilds.inc()
    metrics.rebuild_cancels.inc(len(cancelled))
    log.warning("the timer store is empty%s: rebuilding it from the broker's intake topic, "
                "offsets %d-%d (rebuild floor %s), %d cancelled id(s) read back; what it "
                "files is delivered strict",
                f" (the old one was moved to {store.set_aside})" if store.set_aside else "",
                start, end, floor, len(cancelled))
    return start
