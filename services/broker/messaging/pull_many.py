"""One long poll over many queues (``POST /v1/pull``): the push consumer's pull per broker.

A consumer holding one pull per queue keeps N requests outstanding and pays N round trips when
messages trickle in; this pull names every queue it wants (any topics) with its offset, reads
them all, and, when none has anything, holds on all their keys at once: the first dispatch to
any of them answers it. Each queue is judged on its own: a queue that cannot be read (unknown
topic, bad queue id, offset beyond the end) reports its error in its own entry and the others
are answered as usual.

The answer lists only the queues with news: messages, an offset that moved (messages of other
tags skipped), or an error. A poll that times out answers ``{"queues": []}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tidemq.protocol import ErrorCode, ProtocolError, validate_group_name
from tidemq.protocol.numbers import INT32_MAX, INT64_MAX, integer

from tidemq_server.broker.messaging.pull import (
    DEFAULT_PULL,
    MAX_PULL,
    WAIT_SLICE_S,
    PullService,
    TagFilter,
)
from tidemq_server.broker.store.types import GetResult, GetStatus, StoredRecord
from tidemq_server.common.constants import LONG_POLL_MAX_MS

MAX_PULL_QUEUES = 1024  # queues one poll may name
MAX_PULL_TOTAL = 4096  # messages one answer carries at most, over all its queues


@dataclass(slots=True)
class QueueWant:
    """One queue of a multi-queue pull and where to read it from."""

    topic: str
    queue_id: int
    offset: int  # moves forward past messages of other tags while the poll is held
    tags: TagFilter
    start: int = -1  # the offset asked for

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.offset


@dataclass(slots=True)
class QueueNews:
    """What one queue has to report: messages and bounds, or an error."""

    want: QueueWant
    records: list[StoredRecord] = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    error: ProtocolError | None = None
    news: bool = False  # something to answer at once (messages, more to scan, an error)
    stored: bytes = b""  # a stored-form pull: the records as the log holds them
    count: int = 0  # ... and how many


@dataclass(slots=True)
class ManyAnswer:
    news: list[QueueNews]
    woke_ns: int = 0  # monotonic ns when the held poll was woken (0: not held)


def parse_wants(payload: Any) -> tuple[list[QueueWant], int, int, str | None]:
    """``{queues: [{topic, queue_id, offset, tags?}], max?, wait_ms?, group?}`` checked by hand
    (400 BAD_REQUEST naming the field) into the wants, ``max``, ``wait_ms`` and ``group``."""
    if not isinstance(payload, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "body: expected an object {queues: [...]}")
    unknown = set(payload) - {"queues", "max", "wait_ms", "group", "form"}
    if unknown:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"unknown field {sorted(unknown)[0]!r}: not part of this request")
    max_count = integer(payload.get("max", DEFAULT_PULL), "max", 1, MAX_PULL)
    wait_ms = integer(payload.get("wait_ms", 0), "wait_ms", 0, LONG_POLL_MAX_MS)
    group = payload.get("group")
    if group is not None:
        if not isinstance(group, str):
            raise ProtocolError(ErrorCode.BAD_REQUEST, "group: expected a string")
        validate_group_name(group)
    queues = payload.get("queues")
    if not isinstance(queues, list) or not 1 <= len(queues) <= MAX_PULL_QUEUES:
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"queues: expected a list of 1-{MAX_PULL_QUEUES} queues")
    wants = []
    for i, q in enumerate(queues):
        if not isinstance(q, dict) or not isinstance(q.get("topic"), str):
            raise ProtocolError(ErrorCode.BAD_REQUEST,
                                f"queues.{i}: expected {{topic, queue_id, offset, tags?}}")
        extra = set(q) - {"topic", "queue_id", "offset", "tags"}
        if extra:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"unknown field 'queues.{i}."
                                f"{sorted(extra)[0]}': not part of this request")
        tags = q.get("tags", "*")
        if not isinstance(tags, str):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"queues.{i}.tags: expected a string")
        wants.append(QueueWant(q["topic"],
                               integer(q.get("queue_id"), f"queues.{i}.queue_id", 0, INT32_MAX),
                               integer(q.get("offset", 0), f"queues.{i}.offset", 0, INT64_MAX),
                               TagFilter.parse(tags)))
    return wants, max_count, wait_ms, group


FORMS = ("messages", "stored")  # how a pull answers: decoded messages, or stored bytes


def pull_form(form: Any, where: str = "form") -> bool:
    """Whether a pull asks for the stored form (``form``: "messages", the default, or
    "stored"); 400 naming ``where`` for anything else."""
    if form is None or form == "messages":
        return False
    if form == "stored":
        return True
    raise ProtocolError(ErrorCode.BAD_REQUEST, f"{where}: expected one of {', '.join(FORMS)}, "
                        f"got {form!r}")


def _news(res: GetResult) -> bool:
    """The queue has something to say now (the single pull's "not idle")."""
    return bool(res.found) or res.next_offset < res.max_offset or res.status not in (
        GetStatus.NO_MESSAGE, GetStatus.NO_MATCHED, GetStatus.NO_QUEUE,
        GetStatus.OFFSET_TOO_SMALL)


class ManyPuller:
    """Reads and long-polls a set of queues through the broker's ``PullService``."""

    def __init__(self, pulls: PullService) -> None:
        self.pulls = pulls

    async def pull(self, wants: list[QueueWant], max_count: int, wait_ms: int,
                   group: str | None = None, stored: bool = False) -> ManyAnswer:
        """``stored``: answer each queue's records as the log holds them."""
        pulls = self.pulls
        wait_s = max(0, min(wait_ms, pulls.long_poll_max_ms)) / 1000
        news, watched = self._scan(wants, max_count, stored)
        woke_ns = 0
        if not news and wait_s > 0 and watched:
            deadline = time.monotonic() + wait_s
            keys = [(n.want.topic, n.want.queue_id) for n in watched]
            while not news and not pulls.closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                # synchronous scan, then wait at once: no notify can slip in between
                await pulls.hold.wait(keys, min(remaining, WAIT_SLICE_S))
                woke_ns = time.monotonic_ns()
                news, watched = self._scan(wants, max_count, stored)
        # queues whose offset moved past messages of other tags report where to go on
        moved = [n for n in watched if not n.news and n.want.offset != n.want.start]
        self._observe(news, group)
        return ManyAnswer(news + moved, woke_ns)

    def _scan(self, wants: list[QueueWant], max_count: int, stored: bool = False,
              ) -> tuple[list[QueueNews], list[QueueNews]]:
        """Read every queue once: the queues with news, and every readable queue (to watch).

        A queue caught up past messages of other tags moves its ``want.offset`` forward, so
        the next scan (after a wake-up) starts there."""
        news: list[QueueNews] = []
        readable: list[QueueNews] = []
        budget = MAX_PULL_TOTAL
        for want in wants:
            item = QueueNews(want)
            try:
                self.pulls.readable_topic(want.topic, want.queue_id)
                if budget <= 0:
                    readable.append(item)
                    continue
                res = self.pulls._get(want.topic, want.queue_id, want.offset,
                                      min(max_count, budget), want.tags, stored)
            except ProtocolError as exc:
                item.error, item.news = exc, True
                news.append(item)
                continue
            records = res.records
            if want.tags.tags is not None and records:
                records = [r for r in records if want.tags.matches(r.tag)]
            item.records, item.next_offset = records, res.next_offset
            item.stored, item.count = res.stored, res.count
            item.min_offset, item.max_offset = res.min_offset, res.max_offset
            readable.append(item)
            if _news(res):
                item.news = True
                news.append(item)
                budget -= len(records) or res.count
            else:
                want.offset = res.next_offset  # hold from the end of the queue
        return news, readable

    def _observe(self, news: list[QueueNews], group: str | None) -> None:
        metrics = self.pulls.metrics
        for n in news:
            if n.error is not None:
                continue
            metrics.observe_pull(n.want.topic, len(n.records) or n.count)
            if group:
                metrics.consumer_lag.labels(group, n.want.topic, str(n.want.queue_id)).set(
                    max(0, n.max_offset - n.next_offset))


def many_answer(answer: ManyAnswer, wire: Any, stored: bool = False) -> dict[str, Any]:
    """The body of ``POST /v1/pull``: one entry per queue with news (``stored``: its records
    as one stored-form blob, ``tidemq.protocol.records.stored``, instead of ``messages``)."""
    queues: list[dict[str, Any]] = []
    for n in answer.news:
        entry: dict[str, Any] = {"topic": n.want.topic, "queue_id": n.want.queue_id}
        if n.error is not None:
            entry["error"] = n.error.to_wire()
        else:
            if stored:
                entry["stored"] = n.stored
            else:
                entry["messages"] = [wire(r) for r in n.records]
            entry["next_offset"] = n.next_offset
            entry["min_offset"] = n.min_offset
            entry["max_offset"] = n.max_offset
        queues.append(entry)
    return {"queues": queues}
