"""Every store write of a replicated broker passes the gate: an ``Appender`` (store/appender.py)
wrapping the store's group-commit writer, handed to the services by the composition root.

Before the write: a broker that may not write (a replica, a deposed primary, a fence that says
no) answers NOT_PRIMARY with nothing written; under ``replication=sync`` a primary with fewer
in-sync copies than the quorum answers NOT_ENOUGH_REPLICAS with nothing written.

After the write: the fetches waiting at the log end are woken; a sync write waits until the
high-water mark covers it (NOT_ENOUGH_REPLICAS when the copies drop below the quorum or
``timeout_s`` passes: the records are then stored here but may not survive a failover, as
Kafka's NotEnoughReplicasAfterAppend; a retry with the same message ids finds them through the
dedup index and is acknowledged through ``settle``, on the same terms); and right before the
answer the fence is asked again, so a primary that lost its lease meanwhile acknowledges
nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tidemq_server.broker.replication.quorum import Quorum
from tidemq_server.broker.replication.role import BrokerRole
from tidemq_server.broker.store.appender import Appender
from tidemq_server.broker.store.records.v2_own import Batch
from tidemq_server.broker.store.types import MessageRecord, PutResult, PutStatus


class WriteGate:
    def __init__(self, writer: Appender, role: BrokerRole, quorum: Quorum,
                 wrote: Callable[[], None], timeout_s: float) -> None:
        self.writer = writer  # the store's group-commit writer
        self.role = role
        self.quorum = quorum
        self._wrote = wrote  # wakes the fetches held at the log end
        self.timeout_s = timeout_s
        self.stats = {"refused_not_primary": 0, "refused_not_enough_replicas": 0,
                      "quorum_timeouts": 0}
        self.writing = 0  # puts let through and not yet written (a demotion waits for them)
        self._drained = asyncio.Event()
        self._drained.set()

    def _not_primary(self) -> PutResult:
        self.stats["refused_not_primary"] += 1
        return PutResult(PutStatus.NOT_PRIMARY, message=self.role.why_not_writable())

    def _short(self, detail: str) -> PutResult:
        self.stats["refused_not_enough_replicas"] += 1
        return PutResult(PutStatus.NOT_ENOUGH_REPLICAS, message=(
            f"{detail}: {self.quorum.insync_copies()} cop(ies) in sync, min_insync is "
            f"{self.quorum.quorum}"))

    async def drained(self) -> None:
        """Return once no write let through the gate is still being written (after a
        demotion none starts, so the log stops moving and can be compared and cut)."""
        await self._drained.wait()

    async def append(self, records: list[MessageRecord]) -> PutResult:
        return await self._through(self.writer.append, records)

    async def append_batches(self, batches: list[Batch]) -> PutResult:
        return await self._through(self.writer.append_batches, batches)

    async def _through(self, write: Callable[[Any], Awaitable[PutResult]], entries: Any
                       ) -> PutResult:
        if not self.role.may_write():
            return self._not_primary()
        if not self.quorum.enough():
            return self._short("nothing was written")
        self.writing += 1
        self._drained.clear()
        try:
            result = await write(entries)
        finally:
            self.writing -= 1
            if not self.writing:
                self._drained.set()
        if result.status is not PutStatus.OK:
            return result
        self._wrote()
        if self.quorum.sync and result.appended:
            end = max(a.physical_offset + a.size for a in result.appended)
            if not await self.quorum.wait_for(end, self.timeout_s):
                if not self.role.may_write():  # demoted or fenced meanwhile: say so
                    return self._not_primary()
                self.stats["quorum_timeouts"] += 1
                return self._short("written on the primary only, not acknowledged")
        if not self.role.may_write():
            return self._not_primary()
        return result

    async def settle(self, end: int) -> PutStatus:
        """The answer a repeated send may get for records already written below ``end`` (a
        dedup hit): only a writable primary answers, and only once the HWM covers ``end`` — a
        record a promoted replica kept above its HWM, or one written earlier on this primary
        but not acknowledged, is acknowledged on the same terms as a fresh write."""
        if not self.role.may_write():
            return self._not_primary().status
        if self.quorum.sync and not await self.quorum.wait_for(end, self.timeout_s):
            if not self.role.may_write():
                return self._not_primary().status
            self.stats["quorum_timeouts"] += 1
            return PutStatus.NOT_ENOUGH_REPLICAS
        return PutStatus.OK if self.role.may_write() else self._not_primary().status
