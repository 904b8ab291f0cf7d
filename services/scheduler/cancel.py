"""Cancel: a delayed message not delivered yet is never delivered; one already delivered is
reported as such. Exactly one of cancel and delivery wins, decided on the event loop:

- a timer not ingested yet (its intake offset is ahead of the timer store) is pre-cancelled:
  it is filed as cancelled the moment it arrives;
- a timer in the wheel is taken out; a timer queued for delivery is dropped from its batch;
  then a CANCELLED mark is fsynced before the answer;
- a timer in a deliver request in flight is waited for: it ends delivered;
- a timer of a bucket not in memory gets a CANCELLED mark (loading it later skips it);
- otherwise its marks say what happened (delivered, or cancelled before);
- a copy marked ROLLED (services/scheduler/rolls.py) was superseded by a newer copy of the
  timer, which decides: the broker's hint may name the older copy (its index did not show the
  rolled one yet), or the roll came between the lookup and the decision. The newer copy is
  pre-cancelled when it is being filed (``TimerStore.filing``), else looked up from the bucket
  of its due time to the current one (one rolled when already due is filed in a later bucket)
  and decided as above. A pending
  timer is thus never "not found" while it rolls.

Level messages are the level walker's (``LevelWalker.cancel``). A cancel names the topic: ids
are unique per topic only, and a timer of another topic with the same id is never touched; a
cancel without a topic that finds the id in several topics is refused (AMBIGUOUS_MESSAGE_ID).
"""

from __future__ import annotations

import asyncio
import logging
from enum import StrEnum
from typing import NamedTuple

from tidemq_server.common.cancels import ambiguous_id
from tidemq_server.scheduler.buckets import FINAL, Mark
from tidemq_server.scheduler.delivery import Deliverer, Where
from tidemq_server.scheduler.levels import LevelWalker
from tidemq_server.scheduler.lookup import Found, buckets_searched, copies_of, locate
from tidemq_server.scheduler.metrics import SchedulerMetrics
from tidemq_server.scheduler.timers import TimerStore

log = logging.getLogger(__name__)

WAIT_IN_FLIGHT_S = 5.0  # a cancel waits this long for a delivery in flight at most


class Outcome(StrEnum):
    CANCELLED = "cancelled"  # cancelled now
    ALREADY_CANCELLED = "already_cancelled"
    DELIVERED = "delivered"  # too late
    NOT_FOUND = "not_found"
    BUSY = "busy"  # a delivery of it is stuck in flight; ask again
    ROLLED = "rolled"  # of one copy only, never answered: superseded, its newer copy decides


# what decides when a timer has several copies: the first of these any copy has
DECISIVE = (Outcome.CANCELLED, Outcome.BUSY, Outcome.ALREADY_CANCELLED, Outcome.DELIVERED)


class Decision(NamedTuple):
    outcome: Outcome
    topic: str | None  # the topic of the timer decided (None: not known, e.g. not found)
    detail: str = ""  # NOT_FOUND and BUSY: which path answered (goes into the error message)


class Canceller:
    def __init__(self, store: TimerStore, deliverer: Deliverer, levels: LevelWalker,
                 metrics: SchedulerMetrics) -> None:
        self.store = store
        self.deliverer = deliverer
        self.levels = levels
        self.metrics = metrics

    async def cancel(self, message_id: str, *, topic: str | None = None,
                     due_ms: int | None = None, level: int | None = None,
                     queue_offset: int | None = None,
                     intake_offset: int | None = None) -> Decision:
        """Decide the cancel of ``message_id`` in ``topic`` (None: the only topic holding a
        timer of that id; raises ProtocolError AMBIGUOUS_MESSAGE_ID when several do)."""
        if level and queue_offset is not None:
            return Decision(Outcome(await self.levels.cancel(level, queue_offset, due_ms or 0,
                                                             message_id)), topic)
        store = self.store
        async with store.lock:
            if intake_offset is not None and intake_offset >= store.ingested_next:
                return await self._precancel(topic, message_id, intake_offset,
                                             "before it was taken in")
        # a timer, once filed, stays in its bucket's index: finding it needs no lock
        found = await locate(store, message_id, due_ms, topic)
        if not found:
            return Decision(Outcome.NOT_FOUND, topic, _nowhere(
                store, topic, due_ms, intake_offset))
        if len({f.topic for f in found}) > 1:
            raise ambiguous_id(message_id, (f.topic for f in found))
        real = found[0].topic
        outcomes = await self._settle_all(found)
        if Outcome.ROLLED in outcomes and not any(o in DECISIVE for o in outcomes):
            return await self._follow(message_id, real, min(f.due_ms for f in found))
        return _decision(found, outcomes)

    async def _settle_all(self, found: list[Found]) -> list[Outcome]:
        """Decide each copy found. A final mark never changes: copies already final (a timer
        rolled n times has n of them) are told from their marks, without taking the lock."""
        marks = await self._marks_of(found)
        return [_ended(marks[f.bucket], f) if marks[f.bucket].get(f.pos) in FINAL
                else await self._settle(f) for f in found]

    async def _precancel(self, topic: str | None, message_id: str, intake_offset: int,
                         when: str) -> Decision:
        """Cancel the copy at ``intake_offset`` before it is filed (``store.lock`` held): it is
        filed as cancelled when it arrives."""
        await asyncio.to_thread(self.store.precancels.add, topic, message_id, intake_offset)
        log.info("cancelled timer %s %s (intake offset %d)", message_id, when, intake_offset)
        self.metrics.cancelled.labels("timer").inc()
        return Decision(Outcome.CANCELLED, topic)

    async def _marks_of(self, found: list[Found]) -> dict[int, dict[int, Mark]]:
        """The marks of the buckets holding ``found``, by bucket (one read each)."""
        buckets = {f.bucket for f in found}
        read = self.store.buckets.read_marks
        return await asyncio.to_thread(lambda: {b: read(b) for b in buckets})

    async def _follow(self, message_id: str, topic: str, due_ms: int) -> Decision:
        """Every copy found was superseded by a rolled copy: decide the newest, holding
        ``store.lock`` throughout, so that no resolve of a roll marks it meanwhile. Being filed
        (its older copies marked, the copy not in an index yet), it is pre-cancelled; filed, it
        is looked up (``copies_of``: usually one bucket read). A copy on disk is decided here;
        one in memory never rolls (only timers of buckets not in memory do): settled after."""
        store = self.store
        async with store.lock:
            offset = store.filing.get((topic, message_id))
            if offset is not None:
                if store.precancels.holds(topic, message_id, offset):
                    return Decision(Outcome.ALREADY_CANCELLED, topic)
                return await self._precancel(topic, message_id, offset,
                                             "while its rolled copy was being filed")
            copies = await copies_of(store, message_id, due_ms, topic)
            marks = await self._marks_of(copies)
            live = [f for f in copies if marks[f.bucket].get(f.pos) not in FINAL]
            on_disk = [f for f in live if f.bucket not in store.loaded]
            in_memory = [f for f in live if f.bucket in store.loaded]
            outcomes = [await self._settle_on_disk(f) for f in on_disk]
        outcomes += [await self._settle(f) for f in in_memory]
        live = on_disk + in_memory  # in the order of the outcomes
        if not live:
            outcomes = [_ended(marks[f.bucket], f) for f in copies]
            if not any(o in DECISIVE for o in outcomes):
                # the roll marked the older copies, then the scheduler stopped before the copy
                # was filed: it comes back through intake (past the broker's stale hint)
                return Decision(Outcome.BUSY, topic, f"its {len(copies)} copies were rolled "
                                "and the newest is not taken in yet")
        return _decision(live or copies, outcomes)

    async def _settle(self, f: Found) -> Outcome:
        """Decide one timer. The decision is taken with no await between the check and the
        change, so a delivery cannot slip in between; only then is the mark written."""
        store, deliverer = self.store, self.deliverer
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_IN_FLIGHT_S
        while True:
            async with store.lock:  # no bucket load or retirement meanwhile
                if f.bucket not in store.loaded:
                    return await self._settle_on_disk(f)
                if store.wheel.remove(f.due_ms, f.pos, f.bucket):
                    break
                where = deliverer.state(f.pos)
                if where is Where.QUEUED and f.pos not in store.uncertain:
                    deliverer.drop(f.pos)
                    break
            if where is None:  # final already: its marks say how it ended
                return _ended(await asyncio.to_thread(store.buckets.read_marks, f.bucket), f)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Outcome.BUSY
            try:  # in a delivery in flight (or queued to be re-checked): wait for it
                await asyncio.wait_for(deliverer.wait(f.pos), remaining)
            except TimeoutError:
                return Outcome.BUSY
            if where is Where.QUEUED:
                await asyncio.sleep(0.05)
        return await self._mark(f)  # out of the wheel or its batch: nothing delivers it now

    async def _settle_on_disk(self, f: Found) -> Outcome:
        """A bucket not in memory (``store.lock`` held: it cannot be loaded meanwhile)."""
        marks = await asyncio.to_thread(self.store.buckets.read_marks, f.bucket)
        if f.pos in marks and marks[f.pos] is not Mark.INTENT:
            return _ended(marks, f)
        # pending (an intent alone is a delivery cut short by a crash: the broker found no
        # delivered copy before asking, and nothing delivers it while its bucket is on disk)
        return await self._mark(f)

    async def _mark(self, f: Found) -> Outcome:
        await self.store.add_marks({f.bucket: [(f.pos, Mark.CANCELLED)]})
        self.store.finished(f.bucket, 1)
        self.metrics.cancelled.labels("timer").inc()
        log.info("cancelled timer at %d (bucket %d, due %d)", f.pos, f.bucket, f.due_ms)
        return Outcome.CANCELLED


def _ended(marks: dict[int, Mark], f: Found) -> Outcome:
    mark = marks.get(f.pos)
    if mark is Mark.CANCELLED:
        return Outcome.ALREADY_CANCELLED
    if mark in (Mark.DELIVERED, Mark.SKIPPED):
        return Outcome.DELIVERED
    if mark is Mark.ROLLED:
        return Outcome.ROLLED
    return Outcome.NOT_FOUND  # an index entry the wheel never had (a stale one)


def _decision(found: list[Found], outcomes: list[Outcome]) -> Decision:
    topic = found[0].topic
    for outcome in DECISIVE:
        if outcome in outcomes:
            return Decision(outcome, topic, "a delivery of it is in flight"
                            if outcome is Outcome.BUSY else "")
    spots = ", ".join(f"bucket {f.bucket} position {f.pos} ({o})"
                      for f, o in zip(found, outcomes, strict=True))
    return Decision(Outcome.NOT_FOUND, topic, f"its index entries have no final mark and are "
                    f"neither in the wheel nor in a delivery: {spots}")


def _nowhere(store: TimerStore, topic: str | None, due_ms: int | None,
             intake_offset: int | None) -> str:
    """What a "not found" looked at: enough to tell it from a timer missed by a lookup."""
    where = f" of topic {topic!r}" if topic else ""
    return (f"no timer{where} in {buckets_searched(store, due_ms)} bucket(s) searched (due "
            f"hint {due_ms}, intake offset hint {intake_offset}, taken in below "
            f"{store.ingested_next})")
