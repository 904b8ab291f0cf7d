"""Storing half messages (``TransactionService.begin`` and ``begin_batches``, which check a
request and hold its locks): each half copy with its ``half`` event in one store write through
``Ingest``, then the transaction in the table, its body in the half cache and its message id in
the half dedup.

A half whose message id was stored within the dedup window answers its first transaction id (the
copy found in the log is settled first: acknowledged on the same terms as a fresh write). Half
batches, in the common case (no retried half), are appended as they came with their events in
one group commit; otherwise the fresh halves are re-encoded.

``TransactionService`` hands it its new table and dedup whenever it replaces them (``reload``,
after a promotion; a write in flight then records into the new ones, as the service would).
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq.protocol import BORN_MS, EventKind, EventSource, OutgoingMessage, ProtocolError
from tidemq.protocol.records.v2_read import BatchError, BatchSummary

from tidemq_server.broker.ingest.halves import BatchHalf
from tidemq_server.broker.ingest.writes import Ingest
from tidemq_server.broker.store.index import topic_key
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import MessageRecord
from tidemq_server.broker.transactions.batches import EventBatches
from tidemq_server.broker.transactions.model import (
    HALF_TOPIC,
    TxInfo,
    event_record,
    new_transaction_id,
)
from tidemq_server.broker.transactions.requests import half_record
from tidemq_server.broker.transactions.table import HalfCache, HalfDedup, TxTable


class HalfWriter:
    def __init__(self, store: MessageStore, ingest: Ingest, table: TxTable, cache: HalfCache,
                 dedup: HalfDedup,
                 count: Callable[[list[MessageRecord] | EventBatches], None]) -> None:
        self.store = store
        self.ingest = ingest
        self.table = table
        self.cache = cache
        self.dedup = dedup
        self.count = count  # transaction events by kind (TransactionService.count)

    def use(self, table: TxTable, dedup: HalfDedup) -> None:
        """Record into ``table`` and ``dedup`` from now on (``TransactionService.reload``)."""
        self.table = table
        self.dedup = dedup

    async def store_messages(self, group: str, topic: str,
                             plan: list[tuple[OutgoingMessage, int, str]],
                             immunity: float | None, host: str, now: int) -> list[str]:
        """Half messages of a JSON/msgpack request (``plan``: each message, its queue and id),
        each with its ``half`` event, in one store write; their transaction ids in order (a
        retried half: the id of its first attempt)."""
        txids: list[str] = []
        records: list[MessageRecord] = []
        fresh: list[tuple[int, TxInfo]] = []  # (index of the half record, its info)
        seen: dict[str, str] = {}
        settle = 0  # end of the newest half found in the log (perhaps never acknowledged)
        for msg, queue_id, mid in plan:
            known = seen.get(mid)
            if known is None and msg.message_id:
                found = self.dedup.lookup(topic, mid, now)
                if found is not None:
                    known, end = found
                    settle = max(settle, end)
            if known is not None:
                txids.append(known)
                continue
            txid = new_transaction_id()
            seen[mid] = txid
            txids.append(txid)
            record = half_record(msg, group, topic, queue_id, mid, txid, immunity, host,
                                 now)
            info = TxInfo(txid=txid, message_id=mid, group=group, topic=topic, first_offset=-1,
                          latest_offset=-1, latest_size=0, check_times=0, born_ms=now)
            fresh.append((len(records), info))
            records.append(record)
            records.append(event_record(EventKind.HALF, EventSource.PRODUCER, info, now))
        if settle:  # acknowledged on the same terms as a fresh write (quorum, primary)
            await self.ingest.settle(settle)
        if not records:
            return txids
        try:
            appended = await self.ingest.write(records)
        except ProtocolError:
            self.dedup.mark_incomplete(now)  # the halves may be in the log: a retry looks
            raise
        for i, info in fresh:
            where = appended[i]
            info.first_offset = info.latest_offset = where.physical_offset
            info.latest_size = where.size
            self.table.put(info)
            self.cache.add(info.txid, records[i])
            self.dedup.remember(topic, info.message_id, info.txid, now)
        self.count(records)
        return txids

    def _in_use(self, txid: str) -> bool:
        """Does a transaction ``txid`` exist already (memory, else the half queue's index)?"""
        if self.table.get(txid) is not None:
            return True
        return bool(self.store.index.lookup(topic_key(HALF_TOPIC, txid))) \
            and self.table.ensure(txid) is not None

    async def store_batches(self, group: str, topic: str, raw: bytes,
                            summaries: list[BatchSummary], halves: list[BatchHalf], host: str,
                            now: int) -> list[str]:
        """Half batches (checked: ``ingest/halves.py``); their transaction ids in order."""
        known: dict[int, str] = {}  # half → the transaction id its message id has already
        settle = 0
        for n, h in enumerate(halves):
            found = self.dedup.lookup(topic, h.message_id, now)
            if found is not None:
                known[n] = found[0]
                settle = max(settle, found[1])
            elif self._in_use(h.txid):
                raise BatchError("properties.TRANSACTION_ID", f"{h.txid!r} is already in use "
                                 "by another transaction", h.index, batch=h.batch)
        if settle:  # acknowledged on the same terms as a fresh write (quorum, primary)
            await self.ingest.settle(settle)
        fresh = [h for n, h in enumerate(halves) if n not in known]
        infos = [TxInfo(txid=h.txid, message_id=h.message_id, group=group, topic=topic,
                        first_offset=-1, latest_offset=-1, latest_size=0, check_times=0,
                        born_ms=now) for h in fresh]
        events = EventBatches(self.ingest.batch_bytes)  # counted; written as these batches in
        for info in infos:  # the common case
            events.add(EventKind.HALF, EventSource.PRODUCER, info, now)
        try:
            if not known:  # the batches as they came and the events, in one group commit
                appended = await self.ingest.write_batches(
                    [*self.ingest.batches_of(raw, summaries, host), *events.batches()])
                places = [(a.physical_offset + pos, size, a.store_timestamp)
                          for a, s in zip(appended, summaries, strict=False)
                          for pos, size in zip(s.positions, s.sizes, strict=True)]
            elif fresh:  # the rare path (some halves were retries): the fresh ones re-encoded
                for h in fresh:
                    h.host = host
                records = [h.record() for h in fresh]  # and their events as records (the
                written = await self.ingest.write([  # writer answers each record's place)
                    *records, *(event_record(EventKind.HALF, EventSource.PRODUCER, i, now)
                                for i in infos)])
                places = [(a.physical_offset, a.size, a.store_timestamp)
                          for a in written[:len(records)]]
            else:
                places = []
        except ProtocolError:
            self.dedup.mark_incomplete(now)  # the halves may be in the log: a retry looks
            raise
        for h, info, (offset, size, stored_ms) in zip(fresh, infos, places, strict=True):
            info.first_offset = info.latest_offset = offset
            info.latest_size = size
            info.born_ms = stored_ms  # as a load from the log finds it (model.born_ms_of)
            self.table.put(info)
            h.size, h.host = size, host
            h.properties[BORN_MS] = str(stored_ms)  # for its re-put copies (model.half_copy)
            self.cache.add(info.txid, h)
            self.dedup.remember(topic, info.message_id, info.txid, now)
        self.count(events)
        return [known.get(n, h.txid) for n, h in enumerate(halves)]
