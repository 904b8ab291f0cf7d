"""Group commit for marks: concurrent ``add`` calls share one write and one fdatasync per
bucket file. Deliveries in flight and cancels arriving together cost one disk round trip.

``add`` returns once its marks are durable; a failed write fails every caller of that round.
"""

from __future__ import annotations

import asyncio
import logging

from tidemq_server.scheduler.buckets import MARK, BucketFiles, Mark

log = logging.getLogger(__name__)

Marks = dict[int, list[tuple[int, Mark]]]  # bucket → (position, mark)


class MarkWriter:
    def __init__(self, buckets: BucketFiles) -> None:
        self.buckets = buckets
        self._queue: list[tuple[Marks, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.rounds = 0

    async def add(self, marks: Marks) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((marks, fut))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(), name="marks")
        await fut

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            merged: dict[int, bytearray] = {}
            for marks, _ in batch:
                for bucket, items in marks.items():
                    data = merged.setdefault(bucket, bytearray())
                    for pos, mark in items:
                        data += MARK.pack(pos, mark)
            try:
                await asyncio.to_thread(self._write, merged)
            except BaseException as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc if isinstance(exc, Exception)
                                          else RuntimeError("mark write cancelled"))
                if not isinstance(exc, Exception):
                    raise
                continue
            self.rounds += 1
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(None)

    def _write(self, merged: dict[int, bytearray]) -> None:
        for bucket, data in merged.items():
            self.buckets.add_marks(bucket, bytes(data))
