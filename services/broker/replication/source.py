"""The primary's side of a replica's fetch: raw log bytes from an offset, long-polled.

A fetch names the replica (``broker_id``, ``address``), its log end (``from``: the
acknowledgement of every byte below it), how far it fsynced, and its epoch. The answer is a
``Fetched``: whole records from ``from`` (possibly none after ``wait_s``), the primary's epoch,
epoch history, log bounds, high-water mark and metadata version.

Refusals (``FetchRefused``): this broker is not the primary (``not_primary``), the follower
knows a newer epoch (this primary is deposed: ``not_primary``), ``from`` is below the retained
log (``out_of_range``: the replica must be rebuilt) or past this log's end / not a record
boundary (``diverged``: the follower re-compares epoch histories and truncates).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from tidemq_server.broker.replication.quorum import Quorum
from tidemq_server.broker.replication.role import BrokerRole
from tidemq_server.broker.store.replicated import ChunkError
from tidemq_server.broker.store.store import MessageStore


@dataclass(slots=True)
class Fetched:
    data: bytes
    epoch: int
    hwm: int
    log_end: int
    min_offset: int
    meta_version: str
    segment_bytes: int
    epochs: list[list[int]] = field(default_factory=list)
    floors: dict[str, int] = field(default_factory=dict)  # retention floors (owner → offset)


class FetchRefused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # "not_primary", "out_of_range", "diverged"
        self.message = message


class FetchSource:
    def __init__(self, store: MessageStore, role: BrokerRole, quorum: Quorum,
                 meta_version: Callable[[], str], max_bytes: int, replicated: bool) -> None:
        self.store = store
        self.replicated = replicated  # without replication an epoch never deposes anyone
        self.role = role
        self.quorum = quorum
        self.meta_version = meta_version
        self.max_bytes = max_bytes
        self._grew = asyncio.Event()
        self.stats = {"fetches": 0, "fetched_bytes": 0, "refused": 0}

    def wake(self, *_: object) -> None:
        """The log grew or the HWM moved: answer the fetches held at the log end."""
        self._grew.set()
        self._grew = asyncio.Event()

    async def fetch(self, broker_id: int, address: str, start: int, flushed: int, epoch: int,
                    wait_s: float, max_bytes: int | None = None, known_hwm: int = -1
                    ) -> Fetched:
        role, store = self.role, self.store
        if not role.is_primary:
            raise self._refuse("not_primary", role.why_not_writable())
        if epoch > role.epoch and self.replicated:
            role.depose(epoch)
            raise self._refuse("not_primary", f"this primary is at epoch {role.epoch} but the "
                               f"follower knows epoch {epoch}: it is deposed")
        log_end = store.log.write_offset
        if start < store.log.min_offset:
            raise self._refuse("out_of_range", f"offset {start} is below this primary's "
                               f"retained log [{store.log.min_offset}, {log_end}): the replica "
                               "cannot catch up by streaming and must be rebuilt")
        if start > log_end:
            raise self._refuse("diverged", f"offset {start} is past this primary's log end "
                               f"{log_end}: truncate to the common epoch point first")
        r = self.quorum.on_fetch(broker_id, address, start, flushed, epoch, log_end, wait_s)
        self.quorum.advance(log_end)
        # held only while there is nothing to send: no bytes, and no newer HWM to learn
        if start == log_end and wait_s > 0 and known_hwm >= self.quorum.hwm:
            try:
                await asyncio.wait_for(self._grew.wait(), wait_s)
            except TimeoutError:
                pass
            if not role.is_primary:
                raise self._refuse("not_primary", role.why_not_writable())
        snapshot = store.log.write_offset  # a replica reaching this next time is caught up
        try:  # inline: bytes just written are in the page cache, a thread hop costs more
            data = store.read_chunk(start, min(max_bytes or self.max_bytes, self.max_bytes))
        except ChunkError as exc:
            raise self._refuse("diverged", str(exc)) from exc
        end = store.log.write_offset
        self.quorum.answered(r, snapshot)
        self.stats["fetches"] += 1
        self.stats["fetched_bytes"] += len(data)
        return Fetched(data, role.epoch, self.quorum.hwm, end, store.log.min_offset,
                       self.meta_version(), store.log.segment_bytes, role.epochs.to_wire(),
                       dict(store.floors))

    def _refuse(self, reason: str, message: str) -> FetchRefused:
        self.stats["refused"] += 1
        return FetchRefused(reason, message)
