"""The primary's view of its replicas: acknowledgements, the in-sync set, the high-water mark.

A replica's fetch from offset ``f`` acknowledges every byte below ``f`` (Kafka's rule); under
``flush=sync`` it counts only up to the offset the replica reports fsynced. A replica is
*in sync* while it caught up with the primary within ``lag_max_s``: a fetch caught up when it
asks from at least where the previous answer to it ended (Kafka's last-caught-up time).

The high-water mark (HWM) is the ``k``-th largest of the acknowledged ends of the primary and
its live replicas, ``k`` = the quorum (``min_insync``): every byte below it is held by ``k``
copies, so a failover to the most caught-up replica keeps it. It never moves back. Under
``replication=async`` the quorum shrinks to the copies alive, so consumers go on when replicas
die (acknowledged writes were never waiting for them).

``wait_for(end)`` is what a sync send awaits: True once the HWM reaches ``end``, False when the
in-sync copies drop below the quorum or the timeout passes.

``cut_off()`` tells a primary its replicas do not merely lag but no longer reach it (too few
are *heard* for the quorum): the election's CheckQuorum (replication/aside.py) asks it. A
replica that reaches its primary sends its next fetch as soon as the previous one is answered,
and the primary holds a fetch at most the ``wait`` the replica asked for; so one whose next
fetch has not arrived ``silence_s`` after that wait ran out is cut off, not slow. This tells a
cut far sooner than ``lag_max_s``, which must be long enough for a slow replica to stay in sync.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class ReplicaState:
    broker_id: int
    address: str
    written: int = 0  # fetch offset: everything below is written on the replica
    flushed: int = 0  # everything below is fsynced on the replica
    epoch: int = 0
    last_fetch: float = 0.0  # monotonic s
    wait_s: float = 0.0  # how long its last fetch asked to be held at the log's end (s)
    caught_up_at: float = 0.0  # monotonic s of the last caught-up fetch (0: never)
    answered_end: int = 0  # the primary's log end when it last answered this replica
    fetches: int = 0

    def to_wire(self, primary_end: int, now: float, insync: bool) -> dict[str, object]:
        return {"broker_id": self.broker_id, "address": self.address, "written": self.written,
                "flushed": self.flushed, "lag_bytes": max(0, primary_end - self.written),
                "in_sync": insync, "epoch": self.epoch,
                "last_fetch_ms_ago": int((now - self.last_fetch) * 1000)}


def kth_largest(values: list[int], k: int) -> int | None:
    """The ``k``-th largest value (1-based), None when there are fewer than ``k``."""
    if k < 1 or len(values) < k:
        return None
    return sorted(values, reverse=True)[k - 1]


class Quorum:
    def __init__(self, quorum: int, lag_max_s: float, *, durable: bool, sync: bool,
                 silence_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.quorum = quorum  # copies (the primary included) that make a record safe
        self.lag_max_s = lag_max_s
        self.silence_s = silence_s  # past a fetch's wait with no next fetch: not heard (s)
        self.durable = durable  # flush=sync: count the replicas' fsynced offsets
        self.sync = sync  # replication=sync (async: the quorum shrinks to the live copies)
        self.clock = clock
        self.replicas: dict[int, ReplicaState] = {}
        self.hwm = 0
        self.term_start = clock()  # clock() when this copy last became primary (``reset``)
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._listeners: list[Callable[[int], None]] = []

    def add_listener(self, callback: Callable[[int], None]) -> None:
        """``callback(hwm)`` whenever the HWM moves."""
        self._listeners.append(callback)

    # --- replicas --------------------------------------------------------------------------
    def on_fetch(self, broker_id: int, address: str, written: int, flushed: int, epoch: int,
                 primary_end: int, wait_s: float = 0.0) -> ReplicaState:
        now = self.clock()
        r = self.replicas.get(broker_id)
        if r is None:
            r = self.replicas[broker_id] = ReplicaState(broker_id, address)
        if written < r.written:  # the replica was truncated or restarted empty
            r.caught_up_at = 0.0
        r.address, r.epoch = address, epoch
        r.written, r.flushed = written, min(flushed, written)
        r.last_fetch, r.wait_s = now, wait_s
        r.fetches += 1
        caught_up = written >= primary_end or (r.answered_end > 0 and written >= r.answered_end)
        if caught_up:
            r.caught_up_at = now
        return r

    def answered(self, r: ReplicaState, end: int) -> None:
        r.answered_end = end

    def ack(self, r: ReplicaState) -> int:
        return r.flushed if self.durable else r.written

    def alive(self, r: ReplicaState, now: float) -> bool:
        return now - r.last_fetch <= self.lag_max_s

    def in_sync(self, r: ReplicaState, now: float) -> bool:
        return self.alive(r, now) and r.caught_up_at > 0 and now - r.caught_up_at <= self.lag_max_s

    def insync_copies(self) -> int:
        """Copies in sync, the primary included."""
        now = self.clock()
        return 1 + sum(1 for r in self.replicas.values() if self.in_sync(r, now))

    def heard(self, r: ReplicaState, now: float) -> bool:
        """Its next fetch is not overdue: at most ``silence_s`` past the wait of its last."""
        return now - r.last_fetch <= min(self.lag_max_s, r.wait_s + self.silence_s)

    def heard_copies(self) -> int:
        """Copies whose fetches keep arriving, the primary included."""
        now = self.clock()
        return 1 + sum(1 for r in self.replicas.values() if self.heard(r, now))

    def enough(self) -> bool:
        return not self.sync or self.insync_copies() >= self.quorum

    def cut_off(self) -> bool:
        """Sync replication and too few copies heard to make the quorum: the missing
        replicas' fetches are overdue, they are not merely behind (they may still count as in
        sync until ``lag_max_s``). Never in the first ``lag_max_s`` of a term: the replicas'
        time to start following, as any replica's to fetch again."""
        now = self.clock()
        if not self.sync or now - self.term_start <= self.lag_max_s:
            return False
        return self.heard_copies() < self.quorum

    # --- the high-water mark ----------------------------------------------------------------
    def advance(self, primary_end: int) -> int:
        """Recompute the HWM from the acknowledgements; wake the sends it covers."""
        now = self.clock()
        live = [min(self.ack(r), primary_end) for r in self.replicas.values()
                if self.alive(r, now)]
        k = self.quorum if self.sync else min(self.quorum, 1 + len(live))
        candidate = kth_largest([primary_end, *live], k)
        if candidate is not None and candidate > self.hwm:
            self.hwm = candidate
            for cb in self._listeners:
                cb(candidate)
        if self._waiters:
            self._settle()
        return self.hwm

    def restore(self, hwm: int) -> None:
        """Start from the HWM the previous run saved (at start, before any replica fetched)."""
        self.hwm = hwm

    def reset(self, hwm: int) -> None:
        """A new term: start from ``hwm`` (everything this copy held when promoted) and forget
        the replicas of the previous term."""
        self.replicas.clear()
        self.hwm = hwm
        self.term_start = self.clock()
        for cb in self._listeners:
            cb(hwm)

    def _settle(self) -> None:
        short = self.sync and self.insync_copies() < self.quorum
        keep: list[tuple[int, asyncio.Future[bool]]] = []
        for end, fut in self._waiters:
            if fut.done():
                continue
            if end <= self.hwm:
                fut.set_result(True)
            elif short:
                fut.set_result(False)
            else:
                keep.append((end, fut))
        self._waiters = keep

    async def wait_for(self, end: int, timeout_s: float) -> bool:
        """True once ``end`` is below the HWM; False when too few copies are in sync or the
        timeout passes first."""
        if end <= self.hwm:
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((end, fut))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()

    def fail_waiters(self) -> None:
        """Answer every waiting send False (a demotion)."""
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_result(False)
        self._waiters = []

    def waiting(self) -> int:
        return sum(1 for _, f in self._waiters if not f.done())
