"""Finding timers on disk: by topic and message id (cancel) and by topic (pending counts).

Nothing here is in memory: a lookup reads bucket index files (28 bytes per timer) and verifies
a hit against the timer log. With the due time as a hint (the broker knows it while it still
holds the intake record) one bucket is read; without, every bucket is. Ids are unique per
topic only: a lookup by id without a topic reads every bucket, so that an id waiting in several
topics is seen as such (the canceller refuses to choose).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tidemq_server.scheduler.buckets import ENTRY, ENTRY_SIZE, FINAL, text_hash
from tidemq_server.scheduler.timerlog import Entry
from tidemq_server.scheduler.timers import TimerStore, payload_id

HASH_AT = 20  # offset of id_hash inside an index entry
TOPIC_AT = 24  # offset of topic_hash


@dataclass(frozen=True, slots=True)
class Found:
    bucket: int
    pos: int
    size: int
    due_ms: int
    topic: str  # the real topic it will be delivered to


def _hits(data: bytes, value: int, at: int) -> list[int]:
    """Offsets of index entries whose u32 field at ``at`` equals ``value``."""
    needle = value.to_bytes(4, "big")
    out = []
    i = data.find(needle)
    while i >= 0:
        if i % ENTRY_SIZE == at:
            out.append(i - at)
        i = data.find(needle, i + 1)
    return out


def _candidates(store: TimerStore, due_hint: int | None) -> list[int]:
    buckets = sorted(set(store.buckets.sizes) | store.loaded)
    if due_hint is None:
        return buckets
    first = store.buckets.bucket_of(due_hint)
    return [b for b in buckets if b >= first] + [b for b in buckets if b < first]


def _find(store: TimerStore, message_id: str, topic: str | None,
          buckets: list[int], every: bool) -> list[Found]:
    h = text_hash(message_id)
    topic_h = None if topic is None else text_hash(topic)
    found: list[Found] = []
    for bucket in buckets:
        data = store.buckets.read_index(bucket)
        for at in _hits(data, h, HASH_AT):
            due, pos, size, _, th = ENTRY.unpack_from(data, at)
            if topic_h is not None and th != topic_h:
                continue
            entry = store.log.read_many([(pos, size)])[0]
            if not isinstance(entry, Entry):
                continue
            mid, real = payload_id(entry.payload)
            if mid == message_id and (topic is None or real == topic):
                found.append(Found(bucket, pos, size, due, real))
        if found and topic is not None and not every:
            break
    return found


async def locate(store: TimerStore, message_id: str, due_hint: int | None,
                 topic: str | None = None) -> list[Found]:
    """Every timer of ``message_id`` in ``topic``, in the first bucket that has one (usually
    one); without ``topic``, every timer of that id in any topic, over every bucket."""
    return await asyncio.to_thread(_find, store, message_id, topic,
                                   _candidates(store, due_hint), False)


async def copies_of(store: TimerStore, message_id: str, due_ms: int, topic: str
                    ) -> list[Found]:
    """Every copy of one timer (the original and its rolled copies, all due at ``due_ms``):
    in the bucket of its due time or, a copy filed when already due, a later one up to the
    current bucket — usually a single bucket read."""
    first = store.buckets.bucket_of(due_ms)
    last = max(first, store.buckets.bucket_of(store.clock.now_ms()))
    buckets = [b for b in sorted(set(store.buckets.sizes) | store.loaded) if first <= b <= last]
    return await asyncio.to_thread(_find, store, message_id, topic, buckets, True)


def buckets_searched(store: TimerStore, due_hint: int | None) -> int:
    """How many buckets a lookup reads (what a "not found" answer can say it searched)."""
    return len(_candidates(store, due_hint))


def _scan_topic(store: TimerStore, topic: str) -> tuple[int, int | None]:
    h = text_hash(topic)
    count, first = 0, None
    for bucket in sorted(store.buckets.sizes):
        data = store.buckets.read_index(bucket)
        hits = _hits(data, h, TOPIC_AT)
        if not hits:
            continue
        marks = store.buckets.read_marks(bucket)
        for at in hits:
            due, pos, _, _, _ = ENTRY.unpack_from(data, at)
            if marks.get(pos) not in FINAL:
                count += 1
                first = due if first is None else min(first, due)
    return count, first


async def pending_of_topic(store: TimerStore, topic: str) -> tuple[int, int | None]:
    """(pending timers of ``topic``, earliest due time among them)."""
    return await asyncio.to_thread(_scan_topic, store, topic)


def _first_unloaded_due(store: TimerStore) -> int | None:
    for bucket in sorted(store.buckets.sizes):
        if bucket in store.loaded:
            continue
        marks = store.buckets.read_marks(bucket)
        dues = [due for due, pos, _, _, _ in ENTRY.iter_unpack(store.buckets.read_index(bucket))
                if marks.get(pos) not in FINAL]
        if dues:
            return min(dues)
    return None


async def first_far_due(store: TimerStore) -> int | None:
    """Earliest due time among timers of buckets not in memory."""
    return await asyncio.to_thread(_first_unloaded_due, store)
