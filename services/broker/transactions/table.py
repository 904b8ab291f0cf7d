"""Where the broker keeps transaction state: a memory table backed by the store's own records.

The commit log is the truth. ``TxTable`` holds every pending transaction of this run and a
bounded number of recently ended ones; anything else is *loaded* from the store on demand
(``load``): the half copies through the index (``find_by_key(HALF, txid)``), the end through the
op records (``find_by_key(OP, txid)``), and, because a crash can tear the tail between a commit
copy and its op record, any COMMIT copy of the message id in a real topic (``find_by_unique_key``)
counts as committed too. A load is synchronous, so it can never interleave with a write on the
event loop; writers hold the transaction's lock (``KeyedLocks``) from lookup to table update.
A load sees only what a quorum holds (below the high-water mark); one made while the log held
more (a promoted replica, a failed write) is done again once that part is visible.

``HalfDedup`` makes a retried half send (same topic and message id within the dedup window)
answer the first transaction id instead of opening a second transaction.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from tidemq.protocol import REAL_TOPIC, TRANSACTION_ID

from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import MessageRecord
from tidemq_server.broker.transactions.model import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    TxAction,
    TxInfo,
    TxState,
    born_ms_of,
    decode_op,
    info_from_half,
    is_commit_copy,
)

MAX_COPIES = 4096  # half copies of one transaction looked at by a load


class KeyedLocks:
    """One asyncio lock per key, taken for many keys at once (sorted: no deadlock).

    Uncontended keys cost a dict entry: a future is made only when somebody has to wait.
    """

    def __init__(self) -> None:
        self._held: dict[str, asyncio.Future[None] | None] = {}

    def __len__(self) -> int:
        return len(self._held)

    async def acquire(self, keys: Iterable[str]) -> list[str]:
        wanted = sorted(set(keys))
        held = self._held
        if not any(k in held for k in wanted):  # the usual case: nobody holds any of them
            for key in wanted:
                held[key] = None
            return wanted
        taken: list[str] = []
        try:
            for key in wanted:
                while key in held:
                    waiter = held[key]
                    if waiter is None:
                        waiter = held[key] = asyncio.get_running_loop().create_future()
                    await asyncio.shield(waiter)
                held[key] = None
                taken.append(key)
        except BaseException:
            self.release(taken)
            raise
        return taken

    def release(self, keys: Iterable[str]) -> None:
        for key in keys:
            waiter = self._held.pop(key, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


class HalfDedup:
    """(real topic, message id) → transaction id of a half stored within the window."""

    def __init__(self, store: MessageStore, window_ms: int, max_entries: int,
                 started_ms: int) -> None:
        self.store = store
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._complete_since = started_ms  # younger keys may be missing from memory
        self._recent: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()
        self._oldest_ms = started_ms  # store time of the first entry (none older remains)

    def lookup(self, topic: str, message_id: str, now_ms: int) -> tuple[str, int] | None:
        """The transaction id of the half stored within the window, and where that half ends
        in the log when it was found there rather than in memory (0: remembered, so it was
        acknowledged). A half found in the log may lie above the high-water mark (written,
        answered NOT_ENOUGH_REPLICAS): the caller settles it before answering."""
        if self.window_ms <= 0:
            return None
        horizon = now_ms - self.window_ms
        hit = self._recent.get((topic, message_id))
        if hit is not None and hit[1] >= horizon:
            return hit[0], 0
        if horizon >= self._complete_since:
            return None
        for rec in reversed(self.store.find_by_unique_key(message_id, whole_log=True)):
            if (rec.topic == HALF_TOPIC and rec.properties.get(REAL_TOPIC) == topic
                    and born_ms_of(rec) >= horizon and rec.properties.get(TRANSACTION_ID)):
                return rec.properties[TRANSACTION_ID], rec.physical_offset + rec.size
        return None

    def mark_incomplete(self, now_ms: int) -> None:
        """A half write failed (it may be in the log): consult the log for the next window."""
        self._complete_since = max(self._complete_since, now_ms)

    def remember(self, topic: str, message_id: str, txid: str, now_ms: int) -> None:
        if self.window_ms <= 0:
            return
        self._recent[(topic, message_id)] = (txid, now_ms)
        horizon = now_ms - self.window_ms
        if self._oldest_ms >= horizon and len(self._recent) <= self.max_entries:
            return  # nothing to expire yet (the usual case)
        while self._recent:
            key, (_, ts) = next(iter(self._recent.items()))
            if ts >= horizon and len(self._recent) <= self.max_entries:
                break
            del self._recent[key]
            if ts >= horizon:  # dropped inside the window: use the index until it ages out
                self._complete_since = max(self._complete_since, ts + 1)
        self._oldest_ms = next(iter(self._recent.values()))[1] if self._recent else now_ms


class HalfCache:
    """The half records this run wrote, kept (up to ``max_bytes`` of bodies and ``max_entries``
    records) until their end:
    a commit then builds its copy without reading the half back from the log. A half stored
    from a producer's batch is kept as its bytes (``LazyHalf``) and decoded when first asked."""

    def __init__(self, max_bytes: int, max_entries: int = 200_000) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self._records: OrderedDict[str, MessageRecord | LazyHalf] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, txid: str, record: MessageRecord | LazyHalf) -> None:
        if self.max_bytes <= 0:
            return
        self._records[txid] = record
        self.bytes += _nbytes(record)
        while (self.bytes > self.max_bytes or len(self._records) > self.max_entries) \
                and self._records:
            self.bytes -= _nbytes(self._records.popitem(last=False)[1])

    def pop(self, txid: str) -> None:
        record = self._records.pop(txid, None)
        if record is not None:
            self.bytes -= _nbytes(record)

    def get(self, txid: str) -> MessageRecord | None:
        record = self._records.get(txid)
        if record is None or isinstance(record, MessageRecord):
            return record
        return record.record()

    def kept(self, txid: str) -> MessageRecord | LazyHalf | None:
        """The entry as kept (a ``LazyHalf`` not decoded)."""
        return self._records.get(txid)

    def __contains__(self, txid: str) -> bool:
        return txid in self._records


class LazyHalf(Protocol):
    """A half kept as stored bytes: ``size`` bytes, decoded by ``record()``."""

    size: int

    def record(self) -> MessageRecord: ...


def _nbytes(record: MessageRecord | LazyHalf) -> int:
    return len(record.body) if isinstance(record, MessageRecord) else record.size


class TxTable:
    """Transaction id → ``TxInfo``: every pending one of this run, recent ended ones, and
    whatever ``ensure`` loaded from the store."""

    def __init__(self, store: MessageStore, max_ended: int) -> None:
        self.store = store
        self.max_ended = max_ended
        self._pending: dict[str, TxInfo] = {}
        self._ended: OrderedDict[str, TxInfo] = OrderedDict()
        self.loads = 0  # loads from the store (metrics)

    def __len__(self) -> int:
        return len(self._pending)

    def get(self, txid: str) -> TxInfo | None:
        return self._pending.get(txid) or self._ended.get(txid)

    def ensure(self, txid: str) -> TxInfo | None:
        """The transaction from memory, else loaded from the store; None when unknown. A load
        that could not see part of the log is done again once more of it is visible."""
        info = self._pending.get(txid) or self._ended.get(txid)
        if info is None:
            info = self.load(txid)
            if info is not None:
                self.put(info)
        elif info.unseen is not None:
            limit = self.store.visible_offset
            if limit is None or limit > info.unseen[0]:
                self._refresh(info)
        return info

    def _refresh(self, info: TxInfo) -> None:
        """Bring a load made below the high-water mark up to date, in place (callers hold the
        entry): a newer half copy or an end it could not see (a promoted replica loads while
        its HWM lags its log; answered from the older copy, the checker's decision on the
        newest one was refused as superseded and the checks stopped: found by the faults
        suite). Past the log end of that load only this run writes, and keeps memory right."""
        fresh = self.load(info.txid)
        end = info.unseen[1] if info.unseen is not None else 0
        limit = self.store.visible_offset
        info.unseen = (limit, end) if limit is not None and limit < end else None
        if fresh is None:
            return
        if fresh.latest_offset > info.latest_offset:
            info.latest_offset, info.latest_size = fresh.latest_offset, fresh.latest_size
            info.check_times = fresh.check_times
        if fresh.state.ended and not info.state.ended:
            info.state = fresh.state
            self.put(info)

    def put(self, info: TxInfo) -> None:
        if info.state is TxState.HALF:
            self._ended.pop(info.txid, None)
            self._pending[info.txid] = info
            return
        self._pending.pop(info.txid, None)
        self._ended[info.txid] = info
        self._ended.move_to_end(info.txid)
        while len(self._ended) > self.max_ended:
            self._ended.popitem(last=False)

    def forget(self, txid: str) -> None:
        """Drop what memory knows (after a write whose outcome is unknown): reload next time."""
        self._pending.pop(txid, None)
        self._ended.pop(txid, None)

    def pending(self, group: str | None = None) -> list[TxInfo]:
        found = [i for i in self._pending.values() if group is None or i.group == group]
        found.sort(key=lambda i: (i.born_ms, i.txid))
        return found

    # --- the store is the truth --------------------------------------------------------------

    def load(self, txid: str) -> TxInfo | None:
        """Rebuild one transaction from its records (sync: index lookups and preads)."""
        if not txid or len(txid) > 64:
            return None
        halves = self.store.find_by_key(HALF_TOPIC, txid, max_count=MAX_COPIES)
        halves = [h for h in halves if h.properties.get(TRANSACTION_ID) == txid]
        if not halves:
            return None
        self.loads += 1
        info = info_from_half(txid, halves[0], halves[-1])
        info.state = self._ended_state(txid, info.message_id)
        limit, end = self.store.visible_offset, self.store.log.write_offset
        if limit is not None and limit < end:  # records above the HWM were not looked at
            info.unseen = (limit, end)
        return info

    def _ended_state(self, txid: str, message_id: str) -> TxState:
        for op in self.store.find_by_key(OP_TOPIC, txid, max_count=16):
            for entry_txid, action, _source in decode_op(op):
                if entry_txid == txid:
                    try:
                        state = TxAction(action).final_state
                    except ValueError:
                        continue
                    if state.ended:
                        return state
        # no op record: a crash may have torn the tail between a copy and its op record. Only
        # what a quorum holds counts (below the high-water mark): a commit copy written but
        # answered NOT_ENOUGH_REPLICAS may be cut by a failover, and taking it for "ended"
        # stopped the checks of a transaction whose commit was then lost (found by the faults
        # suite)
        for rec in self.store.find_by_unique_key(message_id):
            if is_commit_copy(rec, txid):
                return TxState.COMMITTED
            if rec.topic == DISCARD_TOPIC and rec.properties.get(TRANSACTION_ID) == txid:
                return TxState.DISCARDED
        return TxState.HALF
