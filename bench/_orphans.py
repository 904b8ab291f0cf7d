"""The orphan check of the transactions bench: how late a half message nobody ends is checked.

A checker with the default check interval (30 s) and transaction timeout (6 s) runs; ``count``
half messages are stored one at a time, a random 50-300 ms apart, each with its own short
``check_immunity_s`` (1 s), and never ended. A ``TransactionProducer`` of their group polls for
checks and answers COMMIT. The figure, per half: the time from its immunity's expiry (the send's
start + immunity) until its check reaches the polling producer. Goal: p99 <= 1 s (before the
checker learned due times, up to the 30 s interval).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench._common import progress

IMMUNITY_S = 1.0  # each orphan's own check_immunity_s (s)
GAP_S = (0.05, 0.3)  # random pause between two orphans (s)
TARGET_LATE_S = 1.0  # p99 of check time - immunity expiry (s)
SLACK_S = 15.0  # beyond the check interval + immunity, the bench gives up (s)


@dataclass(frozen=True, slots=True)
class OrphanResult:
    count: int
    late_s: list[float]  # per orphan: check received - (send start + immunity), sorted

    @property
    def p50(self) -> float:
        return statistics.median(self.late_s)

    @property
    def p99(self) -> float:
        ordered = self.late_s
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class Recorder:
    """Answers every check COMMIT and notes when each orphan's check arrived."""

    def __init__(self) -> None:
        self.checked: dict[str, float] = {}  # body → wall time of its first check
        self.changed = asyncio.Event()

    async def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        from tidemq import TransactionState
        return TransactionState.COMMIT

    async def check_local_transaction(self, message: Any) -> Any:
        from tidemq import TransactionState
        self.checked.setdefault(message.text, time.time())
        self.changed.set()
        return TransactionState.COMMIT


async def orphan_checks(http: httpx.AsyncClient, broker: str, topic: str, count: int,
                        interval_s: float,
                        checker: Callable[[], Awaitable[Callable[[], Awaitable[None]]]]
                        ) -> OrphanResult:
    """``checker()`` starts the checker and answers how to stop it."""
    from tidemq import TransactionProducer

    group = f"bench-orphans-{uuid.uuid4().hex[:6]}"
    recorder = Recorder()
    answering = TransactionProducer(group, recorder, broker_url=broker)
    await answering.start()
    stop_checker = await checker()  # its first scan runs now: the orphans come after it
    sent: dict[str, float] = {}
    try:
        await asyncio.sleep(0.5)  # the producer's heartbeat is in
        with progress() as bar:
            task = bar.add_task(f"orphaned halves checked (immunity {IMMUNITY_S:.0f} s)",
                                total=count)
            for i in range(count):
                body = f"orphan-{i}"
                sent[body] = time.time()
                r = await http.post(f"{broker}/v1/transactions", json={
                    "producer_group": group, "topic": topic, "check_immunity_s": IMMUNITY_S,
                    "messages": [{"body": body}]})
                r.raise_for_status()
                bar.update(task, completed=len(recorder.checked))
                await asyncio.sleep(random.uniform(*GAP_S))
            deadline = time.monotonic() + interval_s + IMMUNITY_S + SLACK_S
            while len(recorder.checked) < count:
                recorder.changed.clear()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"orphans: {len(recorder.checked)} of {count} checked")
                try:
                    await asyncio.wait_for(recorder.changed.wait(), min(left, 0.5))
                except TimeoutError:
                    pass
                bar.update(task, completed=len(recorder.checked))
    finally:
        await answering.close()
        await stop_checker()
    late = sorted(recorder.checked[b] - (sent[b] + IMMUNITY_S) for b in sent)
    return OrphanResult(count, late)
