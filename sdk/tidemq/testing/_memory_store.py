"""The state of the in-memory broker (``tidemq.testing.memory``): topics, queues, delays and
consumer groups. Transactions live in ``_memory_tx``, the simple consumer in ``_memory_simple``.

Every method is plain, synchronous and answers what the REST endpoint of docs/api.md would
answer, raising ``ProtocolError`` for the 4xx answers; ``_memory_routes`` maps requests to
them. Time comes from a ``ManualClock``: delays, invisibility and the dedup window only move
when a test moves it. Liveness (heartbeats) runs on the real clock, as clients heartbeat in
real time.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tidemq.protocol import (
    CONSUME_FAILURE,
    MAX_CONSUME_FAILURE_CHARS,
    ErrorCode,
    OutgoingMessage,
    ProtocolError,
    dlq_topic,
    is_system_topic,
    parse_perm,
    retry_topic,
    validate_topic_name,
)
from tidemq.protocol.tags import TagExpression
from tidemq.protocol.topics import DLQ_PREFIX, RETRY_PREFIX

# -- defaults (each with its unit) -------------------------------------------------------------
#: Delay levels 1-18 in seconds: the broker's default table (1 s ... 2 h).
DEFAULT_DELAY_LEVELS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600,
                          1200, 1800, 3600, 7200)
DEFAULT_QUEUES = 4  # queues of a topic created without a count
DEFAULT_MAX_RECONSUME_TIMES = 16  # retries before a message goes to the DLQ
DEDUP_WINDOW_MS = 10 * 60 * 1000  # a resent (topic, message_id) within this is not stored again
MAX_DELAY_MS = 30 * 24 * 3600 * 1000  # the longest delay (30 days)
MEMBER_EXPIRY_S = 30.0  # a consumer or producer silent this long (real time) is dropped
FIRST_RETRY_LEVEL = 3  # a retry waits level 3 + (retries so far - 1), as the broker does
MAX_PULL = 1024  # messages of one pull / receive


class ManualClock:
    """The broker's clock in epoch milliseconds; it only moves with ``advance``."""

    def __init__(self, start_ms: int | None = None) -> None:
        self.now_ms = int(time.time() * 1000) if start_ms is None else start_ms

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"the clock never moves back: advance({seconds})")
        self.now_ms += round(seconds * 1000)


@dataclass(slots=True)
class Stored:
    """One copy of a message in one queue."""

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tag: str | None
    keys: list[str]
    properties: dict[str, str]
    born_ms: int
    store_ms: int
    reconsume_times: int = 0
    origin_topic: str | None = None

    def wire(self, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "message_id": self.message_id, "topic": self.topic, "queue_id": self.queue_id,
            "queue_offset": self.queue_offset, "body": self.body, "tag": self.tag,
            "keys": list(self.keys), "properties": dict(self.properties),
            "born_timestamp_ms": self.born_ms, "store_timestamp_ms": self.store_ms,
            "reconsume_times": self.reconsume_times}
        if self.origin_topic:
            out["origin_topic"] = self.origin_topic
        out.update(extra)
        return out


@dataclass(slots=True)
class Delay:
    """A delayed message (or a retry's back-off) until it is due: delivered, or cancelled
    before."""

    copy: Stored  # as it will be stored (its queue offset is set on delivery)
    due_ms: int
    delay_level: int  # 0: delay_ms / deliver_at_ms
    state: str = "scheduled"  # "scheduled", "delivered" or "cancelled"


@dataclass(slots=True)
class Topic:
    name: str
    queues: list[list[Stored]]
    perm: str = "rw"

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "queues": len(self.queues), "perm": self.perm,
                "offsets": [{"queue_id": i, "min": 0, "max": len(q)}
                            for i, q in enumerate(self.queues)]}


class MemoryStore:
    """Topics, messages, delays, consumer groups (see the module doc)."""

    def __init__(self, clock: ManualClock, *, delay_levels_s: Iterable[float],
                 max_reconsume_times: int) -> None:
        self.clock = clock
        self.delay_levels_ms = tuple(round(s * 1000) for s in delay_levels_s)
        if not 1 <= len(self.delay_levels_ms) <= 18 or min(self.delay_levels_ms) <= 0:
            raise ValueError("delay_levels_s: 1-18 positive durations (seconds), level 1 first")
        self.max_reconsume_times = max_reconsume_times
        self.topics: dict[str, Topic] = {}
        self.dedup: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}  # → (stored at, result)
        self.delays: dict[tuple[str, str], Delay] = {}  # (topic, message id)
        self.states: dict[str, tuple[str, Stored]] = {}  # message id → (state, newest copy)
        self.members: dict[str, dict[str, float]] = {}  # group → client id → last beat (s)
        self.offsets: dict[tuple[str, str, int], int] = {}  # (group, topic, queue) → offset
        self._round_robin = itertools.count()
        self._handles = itertools.count(1)

    # -- topics ------------------------------------------------------------------------------

    def create_topic(self, name: str, queues: int = DEFAULT_QUEUES, perm: str = "rw", *,
                     system: bool = False) -> dict[str, Any]:
        validate_topic_name(name)
        if is_system_topic(name) and not system:
            raise ProtocolError(ErrorCode.FORBIDDEN_SYSTEM_TOPIC,
                                f"{name!r} is a system topic: it cannot be created")
        if isinstance(queues, bool) or not isinstance(queues, int) or not 1 <= queues <= 1024:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"queues must be 1-1024, got {queues!r}")
        parse_perm(perm)
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic(name, [], perm)
        elif len(topic.queues) > queues and any(topic.queues[queues:]):
            raise ProtocolError(ErrorCode.QUEUES_NOT_EMPTY, f"topic {name!r}: the queues past "
                                f"{queues} hold messages")
        topic.perm = perm
        topic.queues = (topic.queues + [[] for _ in range(queues)])[:queues]
        return {"name": name, "queues": queues, "perm": perm}

    def topic(self, name: str) -> Topic:
        validate_topic_name(name)
        topic = self.topics.get(name)
        if topic is None:
            raise ProtocolError(ErrorCode.TOPIC_NOT_FOUND, f"topic {name!r} does not exist: "
                                "create it first (TestBroker.create_topic)")
        return topic

    def _queue(self, topic: Topic, queue_id: int) -> list[Stored]:
        if not 0 <= queue_id < len(topic.queues):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"topic {topic.name!r} has queues "
                                f"0-{len(topic.queues) - 1}, not {queue_id}")
        return topic.queues[queue_id]

    def append(self, copy: Stored, state: str = "stored") -> Stored:
        queue = self._queue(self.topic(copy.topic), copy.queue_id)
        copy.queue_offset = len(queue)
        copy.store_ms = self.clock.now_ms
        queue.append(copy)
        if not copy.topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            self.states[copy.message_id] = (state, copy)
        return copy

    # -- sending and delays ------------------------------------------------------------------

    def writable(self, name: str) -> Topic:
        if is_system_topic(validate_topic_name(name)):
            raise ProtocolError(ErrorCode.FORBIDDEN_SYSTEM_TOPIC,
                                f"{name!r} is a system topic: it is not written by clients")
        topic = self.topic(name)
        if "w" not in topic.perm:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"topic {name!r} is read-only")
        return topic

    def queue_for(self, topic: Topic, msg: OutgoingMessage) -> int:
        if msg.queue_id is not None:
            self._queue(topic, msg.queue_id)
            return msg.queue_id
        if msg.sharding_key is not None:
            return zlib.crc32(msg.sharding_key.encode()) % len(topic.queues)
        return next(self._round_robin) % len(topic.queues)

    def due_of(self, msg: OutgoingMessage, now: int) -> tuple[int, int] | None:
        """(due time, level) of a delayed message, None for one to store now."""
        if msg.delay_level:
            if msg.delay_level > len(self.delay_levels_ms):
                raise ProtocolError(ErrorCode.INVALID_DELAY, f"delay_level must be 1-"
                                    f"{len(self.delay_levels_ms)}, got {msg.delay_level}")
            return now + self.delay_levels_ms[msg.delay_level - 1], msg.delay_level
        if msg.delay_ms is not None:
            return (now + msg.delay_ms, 0) if msg.delay_ms > 0 else None
        if msg.deliver_at_ms is not None:
            if msg.deliver_at_ms > now + MAX_DELAY_MS:
                raise ProtocolError(ErrorCode.INVALID_DELAY, f"deliver_at_ms must be at most "
                                    f"{MAX_DELAY_MS} ms (the maximum delay) from now")
            return (msg.deliver_at_ms, 0) if msg.deliver_at_ms > now else None
        return None

    def send(self, topic_name: str, messages: list[OutgoingMessage]) -> list[dict[str, Any]]:
        """Store a validated batch (all or nothing); one result per message, in order."""
        topic = self.writable(topic_name)
        now = self.clock.now_ms
        plans = [(m, self.queue_for(topic, m), self.due_of(m, now)) for m in messages]
        self._expire_dedup(now)
        results = []
        for msg, queue_id, due in plans:
            mid = msg.message_id or f"mem-{next(self._handles):012x}"
            key = (topic.name, mid)
            if msg.message_id and key in self.dedup:
                results.append(dict(self.dedup[key][1]))
                continue
            copy = Stored(mid, topic.name, queue_id, 0, msg.body, msg.tag, list(msg.keys),
                          dict(msg.properties), now, now)
            result = self.store(copy, due)
            if msg.message_id:
                self.dedup[key] = (now, result)
            results.append(dict(result))
        return results

    def store(self, copy: Stored, due: tuple[int, int] | None) -> dict[str, Any]:
        """Store ``copy`` now, or let it wait until ``due`` (time, level); its result."""
        if due is None:
            self.append(copy)
            return {"message_id": copy.message_id, "queue_id": copy.queue_id,
                    "queue_offset": copy.queue_offset}
        self.delays[(copy.topic, copy.message_id)] = Delay(copy, due[0], due[1])
        self.states[copy.message_id] = ("scheduled", copy)
        return {"message_id": copy.message_id, "queue_id": copy.queue_id, "queue_offset": None,
                "state": "scheduled", "deliver_at_ms": due[0]}

    def _expire_dedup(self, now: int) -> None:
        for key in [k for k, (at, _) in self.dedup.items() if now - at > DEDUP_WINDOW_MS]:
            del self.dedup[key]

    def deliver_due(self) -> int:
        """Store every delayed message whose time has come, earliest first; how many."""
        now = self.clock.now_ms
        due = sorted((w for w in self.delays.values()
                      if w.state == "scheduled" and w.due_ms <= now), key=lambda w: w.due_ms)
        for w in due:
            w.state = "delivered"
            if w.copy.topic in self.topics:
                self.append(w.copy)
        return len(due)

    def cancel(self, message_id: str, topic: str | None) -> dict[str, Any]:
        """``DELETE /v1/messages/{id}/schedule``; a 409 AMBIGUOUS_MESSAGE_ID comes back as the
        answer dict itself (no ErrorCode of it in this SDK version) under ``"error"``."""
        found = [w for (t, mid), w in self.delays.items()  # not a retry's back-off
                 if mid == message_id and (topic is None or t == topic)
                 and not is_system_topic(t)]
        if not found:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND, f"no delayed message "
                                f"{message_id!r}" + (f" in topic {topic!r}" if topic else ""))
        if len(found) > 1:
            return {"error": {"code": "AMBIGUOUS_MESSAGE_ID", "message": f"message id "
                              f"{message_id!r} is delayed in topics "
                              f"{sorted(w.copy.topic for w in found)}: name one with ?topic="}}
        delay = found[0]
        if delay.state == "delivered":
            raise ProtocolError(ErrorCode.ALREADY_DELIVERED,
                                f"message {message_id!r} was delivered already")
        delay.state = "cancelled"
        self.states[message_id] = ("cancelled", delay.copy)
        return {"message_id": message_id, "state": "cancelled"}

    def pending_delays(self, topic: str | None) -> dict[str, Any]:
        """``GET /v1/scheduled``: the delays not yet due (and not cancelled)."""
        pending = [w for w in self.delays.values() if w.state == "scheduled"
                   and (topic is None or w.copy.topic == topic)]
        by_level = {str(n): 0 for n in range(1, len(self.delay_levels_ms) + 1)}
        for w in pending:
            if w.delay_level:
                by_level[str(w.delay_level)] += 1
        return {"pending": len(pending),
                "next_due_ms": min((w.due_ms for w in pending), default=None),
                "by_level": by_level, "timers": sum(1 for w in pending if not w.delay_level)}

    # -- reading -----------------------------------------------------------------------------

    def read(self, topic_name: str, queue_id: int, offset: int, limit: int, tags: str
             ) -> dict[str, Any]:
        """One queue's pull answer (without waiting)."""
        topic = self.topic(topic_name)
        if "r" not in topic.perm:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"topic {topic_name!r} is send-only")
        queue = self._queue(topic, queue_id)
        if offset > len(queue):
            raise ProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is above "
                                f"max_offset {len(queue)} of {topic_name}#{queue_id}")
        offset = max(offset, 0)
        wanted = TagExpression.parse(tags)
        out = []
        next_offset = offset
        for m in queue[offset:offset + max(1, min(limit, MAX_PULL))]:
            next_offset = m.queue_offset + 1
            if wanted.matches(m.tag):
                out.append(m.wire())
        return {"messages": out, "next_offset": next_offset, "min_offset": 0,
                "max_offset": len(queue)}

    def find(self, message_id: str) -> tuple[str, Stored]:
        if message_id not in self.states:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND, f"no message {message_id!r}")
        return self.states[message_id]

    def query(self, topic_name: str, key: str | None, begin_ms: int | None,
              end_ms: int | None, limit: int) -> list[dict[str, Any]]:
        topic = self.topic(topic_name)
        if key is None and (begin_ms is None or end_ms is None):
            raise ProtocolError(ErrorCode.BAD_REQUEST, "give key, or begin_ms and end_ms")
        found = [m for q in topic.queues for m in q
                 if (key is None or key in m.keys)
                 and (begin_ms is None or m.store_ms >= begin_ms)
                 and (end_ms is None or m.store_ms <= end_ms)]
        found.sort(key=lambda m: (m.store_ms, m.queue_id, m.queue_offset))
        return [m.wire() for m in found[:limit]]

    # -- consumer groups ---------------------------------------------------------------------

    def heartbeat(self, group: str, client_id: str) -> list[str]:
        now = time.monotonic()
        members = self.members.setdefault(group, {})
        members[client_id] = now
        for cid in [c for c, at in members.items() if now - at > MEMBER_EXPIRY_S]:
            del members[cid]
        return sorted(members)

    def commit(self, group: str, offsets: list[dict[str, Any]], advance_only: bool) -> None:
        checked = []
        for o in offsets:
            topic, queue_id, offset = str(o["topic"]), int(o["queue_id"]), int(o["offset"])
            queue = self._queue(self.topic(topic), queue_id)
            if not 0 <= offset <= len(queue):
                raise ProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} of "
                                    f"{topic}#{queue_id} is outside 0-{len(queue)}")
            checked.append(((group, topic, queue_id), offset))
        for key, offset in checked:
            if not advance_only or offset > self.offsets.get(key, -1):
                self.offsets[key] = offset

    def committed(self, group: str, topic: str | None) -> list[dict[str, Any]]:
        out = []
        for (g, t, q), offset in sorted(self.offsets.items()):
            if g == group and (topic is None or t == topic):
                high = len(self.topics[t].queues[q]) if t in self.topics else offset
                out.append({"topic": t, "queue_id": q, "offset": offset, "max_offset": high,
                            "lag": max(0, high - offset)})
        return out

    def retry(self, group: str, message_id: str, delay_level: int | None,
              reason: str | None) -> str:
        """Hand a message back: a copy in ``%RETRY%group`` after a back-off delay, or in
        ``%DLQ%group`` once it was retried ``max_reconsume_times`` times."""
        if delay_level and not 0 < delay_level <= len(self.delay_levels_ms):
            raise ProtocolError(ErrorCode.INVALID_DELAY, f"delay_level must be 1-"
                                f"{len(self.delay_levels_ms)}, got {delay_level}")
        source = self._latest_copy(group, message_id)
        times = source.reconsume_times + 1
        dead = times > self.max_reconsume_times
        destination = dlq_topic(group) if dead else retry_topic(group)
        if destination not in self.topics:
            self.create_topic(destination, 1, system=True)
        props = {k: v for k, v in source.properties.items() if k != CONSUME_FAILURE}
        if reason:
            props[CONSUME_FAILURE] = reason[:MAX_CONSUME_FAILURE_CHARS]
        copy = Stored(message_id, destination, 0, 0, source.body, source.tag,
                      list(source.keys), props, source.born_ms, 0, times,
                      source.origin_topic or source.topic)
        level = 0 if dead else delay_level or min(FIRST_RETRY_LEVEL + times - 1,
                                                  len(self.delay_levels_ms))
        if level:
            due = self.clock.now_ms + self.delay_levels_ms[level - 1]
            self.delays[(destination, message_id)] = Delay(copy, due, level)
        else:
            self.append(copy)
        return destination

    def _latest_copy(self, group: str, message_id: str) -> Stored:
        """The copy a retry continues from: the group's own newest retry copy (delivered or
        waiting), else the message's newest plain copy."""
        own = retry_topic(group)
        delay = self.delays.get((own, message_id))
        if delay is not None and delay.state == "scheduled":
            return delay.copy
        copies = [m for name, t in self.topics.items()
                  if name == own or not is_system_topic(name)
                  for q in t.queues for m in q if m.message_id == message_id]
        if not copies:
            raise ProtocolError(ErrorCode.MESSAGE_NOT_FOUND, f"no message with message_id "
                                f"{message_id!r} is stored on this broker")
        return max(copies, key=lambda m: (m.topic == own, m.reconsume_times, m.store_ms))
