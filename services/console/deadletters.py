"""Dead letters: browse a group's DLQ (the newest of each queue) and resend to the original
topics — one entry (found through its trace), or every entry of the DLQ, paged from the first
offset to the last (``PAGE`` per pull), sent in batches. The DLQ copies stay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from tidemq.protocol import dlq_topic

from tidemq_server.common.dlq import PAGE, Outcome, copy_id, plan_resend
from tidemq_server.console.client import ApiError, ConsoleClient, segment

SEND_BATCH = 256  # resent messages per send request
SHOWN_OUTCOMES = 20  # outcomes named in the page after a resend (all failures are counted)
LOOKUPS = 8  # lookups of earlier resent copies in flight at once


async def tail(c: ConsoleClient, address: str, topic: str, limit: int
               ) -> list[dict[str, Any]]:
    """The last ``limit`` messages of every queue of ``topic`` on one broker (public pull)."""
    info = await c.call("GET", f"{address}/v1/topics/{segment(topic)}")
    out: list[dict[str, Any]] = []
    for q in info.get("offsets", []):
        start = max(int(q["min"]), int(q["max"]) - limit)
        if start < int(q["max"]):
            out += await pull(c, address, topic, int(q["queue_id"]), start, min(limit, 1024))
    return out


async def pull(c: ConsoleClient, address: str, topic: str, queue_id: int, offset: int,
               count: int) -> list[dict[str, Any]]:
    page = await c.call("GET", f"{address}/v1/topics/{segment(topic)}/queues/{queue_id}/"
                        "messages", params={"offset": offset, "max": count, "wait_ms": 0})
    messages: list[dict[str, Any]] = page.get("messages", [])
    return messages


async def walk(c: ConsoleClient, address: str, topic: str
               ) -> AsyncIterator[list[dict[str, Any]]]:
    """Every message of ``topic`` on one broker, a page at a time, queue by queue."""
    info = await c.call("GET", f"{address}/v1/topics/{segment(topic)}")
    for q in info.get("offsets", []):
        offset, end, qid = int(q["min"]), int(q["max"]), int(q["queue_id"])
        while offset < end:
            page = await c.call("GET", f"{address}/v1/topics/{segment(topic)}/queues/{qid}/"
                                "messages", params={"offset": offset, "max": PAGE,
                                                    "wait_ms": 0})
            if page.get("messages"):
                yield page["messages"]
            nxt = int(page.get("next_offset", offset))
            if nxt <= offset:
                break
            offset = nxt


async def earlier_copy(c: ConsoleClient, address: str, dlq: str, m: dict[str, Any],
                       gate: asyncio.Semaphore) -> dict[str, Any] | None:
    """The copy an earlier resend of DLQ entry ``m`` stored on ``address`` (None: none)."""
    async with gate:
        try:
            found: dict[str, Any] = await c.call(
                "GET", f"{address}/v1/messages/{segment(copy_id(dlq, m))}")
        except ApiError as exc:
            if exc.code == "MESSAGE_NOT_FOUND":
                return None
            raise
    return found


async def dlq_view(c: ConsoleClient, group: str, limit: int) -> list[dict[str, Any]]:
    """The newest entries of the group's DLQ on every broker, each with ``resent`` (the copy
    an earlier resend stored, or None)."""
    out: list[dict[str, Any]] = []
    dlq, gate = dlq_topic(group), asyncio.Semaphore(LOOKUPS)
    for b in await c.brokers():
        try:
            found = await tail(c, b.address, dlq, limit)
        except ApiError as exc:
            if exc.code != "TOPIC_NOT_FOUND":
                raise
            continue
        earlier = await asyncio.gather(*(earlier_copy(c, b.address, dlq, m, gate)
                                         for m in found))
        out += [{**m, "broker": b.name, "resent": e} for m, e in zip(found, earlier,
                                                                      strict=True)]
    return out


async def _send(c: ConsoleClient, address: str,
                planned: list[tuple[Outcome, dict[str, Any]]]) -> None:
    """Send planned resends to their topics, ``SEND_BATCH`` per request; fill the outcomes."""
    by_topic: dict[str, list[tuple[Outcome, dict[str, Any]]]] = {}
    for outcome, message in planned:
        by_topic.setdefault(outcome.topic, []).append((outcome, message))
    for topic, items in by_topic.items():
        for i in range(0, len(items), SEND_BATCH):
            chunk = items[i:i + SEND_BATCH]
            try:
                answer = await c.call("POST", f"{address}/v1/topics/{segment(topic)}/messages",
                                      json={"messages": [m for _, m in chunk]})
                results = answer.get("results", [])
                for j, (outcome, _) in enumerate(chunk):
                    outcome.result = results[j] if j < len(results) else {}
            except ApiError as exc:
                for outcome, _ in chunk:
                    outcome.error = str(exc)


async def resend(c: ConsoleClient, group: str, message_id: str) -> list[Outcome]:
    """Resend one DLQ entry (``message_id``) or, when it is "", every entry of the group's
    DLQ on every broker, to the original topics."""
    dlq = dlq_topic(group)
    outcomes: list[Outcome] = []
    for b in await c.brokers():
        try:
            pages = [await _one(c, b.address, dlq, message_id)] if message_id else None
            if pages is None:
                pages = [page async for page in walk(c, b.address, dlq)]
        except ApiError as exc:
            if exc.code in ("TOPIC_NOT_FOUND", "MESSAGE_NOT_FOUND"):
                continue
            raise
        gate = asyncio.Semaphore(LOOKUPS)
        for page in pages:
            planned = []
            earlier = await asyncio.gather(*(earlier_copy(c, b.address, dlq, m, gate)
                                             for m in page))
            for m, copy in zip(page, earlier, strict=True):
                outcome, message = plan_resend(dlq, m)
                outcomes.append(outcome)
                if copy is not None and message is not None:  # resent before: not again
                    outcome.result, outcome.earlier = copy, True
                elif message is not None:
                    planned.append((outcome, message))
            await _send(c, b.address, planned)
    if message_id and not outcomes:
        raise ApiError("MESSAGE_NOT_FOUND", f"no message {message_id!r} in {dlq}")
    return outcomes


async def _one(c: ConsoleClient, address: str, dlq: str, message_id: str
               ) -> list[dict[str, Any]]:
    """The DLQ copies of one message on one broker, found through its trace."""
    t = await c.call("GET", f"{address}/v1/messages/{segment(message_id)}/trace")
    found = []
    for copy in t.get("copies", []):
        if copy.get("kind") == "dlq" and copy.get("topic") == dlq:
            found += await pull(c, address, dlq, int(copy["queue_id"]),
                                int(copy["queue_offset"]), 1)
    return [m for m in found if m.get("message_id") == message_id]


def summary(outcomes: list[Outcome]) -> str:
    ok = sum(o.result is not None and not o.earlier for o in outcomes)
    before = sum(o.earlier for o in outcomes)
    failed = [o for o in outcomes if o.result is None]
    shown = (failed + [o for o in outcomes if o.result is not None])[:SHOWN_OUTCOMES]
    parts = [f"{o.message_id} → {o.topic or '?'}: "
             + (f"{'resent before' if o.earlier else 'sent'} as {o.result.get('message_id')}"
                if o.result is not None else o.error)
             for o in shown]
    more = len(outcomes) - len(shown)
    return (f"{ok} resent, {len(failed)} failed"
            + (f", {before} resent before (not again)" if before else "") + ". "
            + "; ".join(parts)
            + (f"; and {more} more" if more > 0 else ""))
