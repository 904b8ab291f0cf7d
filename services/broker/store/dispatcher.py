"""Dispatch: from commit log records to every derived structure (consume queues, index).

The writer dispatches each record it appends (from the metadata it already holds), and
recovery dispatches records it re-reads from the log; both go through ``dispatch`` (a v2
batch: ``dispatch_batch``, from its summary) so the rules live in one place:

- prepared (half) and rolled-back transaction records get no consume-queue unit;
- every record is indexed by its unique key (message id) and by each of its keys.
"""

from __future__ import annotations

from pathlib import Path

from tidemq.protocol.records.v2_read import BatchSummary

from tidemq_server.broker.store.consume_queue import ConsumeQueue, pack_units
from tidemq_server.broker.store.index import UNIQUE_PREFIX, Index, topic_key, unique_key
from tidemq_server.broker.store.types import KEY_SEPARATOR, SysFlag

_TYPE_MASK = int(SysFlag.TYPE_MASK)  # plain ints: IntFlag operators are slow on the hot path
_NOT_DISPATCHED = (int(SysFlag.PREPARED), int(SysFlag.ROLLBACK))


def dispatchable(sys_flag: int) -> bool:
    return (sys_flag & _TYPE_MASK) not in _NOT_DISPATCHED


class Dispatcher:
    def __init__(self, cq_root: Path, units_per_file: int, index: Index) -> None:
        self.cq_root = cq_root
        self.units_per_file = units_per_file
        self.index = index
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.touched: set[tuple[str, int]] = set()  # queues that grew since the last drain

    def load(self) -> None:
        self.cq_root.mkdir(parents=True, exist_ok=True)
        for topic_dir in self.cq_root.iterdir():
            for qdir in topic_dir.iterdir():
                if qdir.name.isdigit():
                    cq = ConsumeQueue(qdir, topic_dir.name, int(qdir.name), self.units_per_file)
                    cq.load()
                    self.queues[(topic_dir.name, int(qdir.name))] = cq

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self.cq_root / topic / str(queue_id), topic, queue_id,
                              self.units_per_file)
            self.queues[(topic, queue_id)] = cq
        return cq

    def dispatch(self, topic: str, queue_id: int, queue_offset: int, phys: int, size: int,
                 sys_flag: int, tag_code: int, store_ms: int, uniq: str, keys: str) -> None:
        cq = self.queue(topic, queue_id) if dispatchable(sys_flag) else None
        self.dispatch_to(cq, topic, queue_offset, phys, size, tag_code, store_ms, uniq, keys)

    def dispatch_to(self, cq: ConsumeQueue | None, topic: str, queue_offset: int, phys: int,
                    size: int, tag_code: int, store_ms: int, uniq: str, keys: str) -> None:
        """``dispatch`` for a caller that already looked up the queue (None: no unit)."""
        if cq is not None:
            cq.append(queue_offset, phys, size, tag_code)
            self.touched.add((topic, cq.queue_id))
        if uniq:
            self.index.put_unique(unique_key(uniq), phys, store_ms)
        if keys:
            for key in keys.split(KEY_SEPARATOR):
                self.index.put(topic_key(topic, key), phys, store_ms)

    def dispatch_batch(self, summary: BatchSummary) -> None:
        """``dispatch`` for every record of a filled v2 batch, from its summary: one queue
        lookup, record i at ``base_physical + positions[i]`` with queue offset
        ``base_queue_offset + i``."""
        head = summary.head
        topic = head.topic
        base, store_ms = head.base_physical, head.store_timestamp
        if dispatchable(head.sys_flag):  # the batch's units in one run
            cq = self.queue(topic, head.queue_id)
            cq.append_units(head.base_queue_offset, pack_units(
                base, summary.positions, summary.sizes, summary.tag_codes))
            self.touched.add((topic, cq.queue_id))
        ids = summary.message_ids
        if all(ids) and not any(summary.keys):  # the common batch: ids alone, one index call
            self.index.put_unique_many([UNIQUE_PREFIX + uniq for uniq in ids],
                                       [base + pos for pos in summary.positions], store_ms)
            return
        put, put_unique = self.index.put, self.index.put_unique
        for pos, uniq, keys in zip(summary.positions, ids, summary.keys, strict=True):
            if uniq:
                put_unique(unique_key(uniq), base + pos, store_ms)
            if keys:
                for key in keys.split(KEY_SEPARATOR):
                    put(topic_key(topic, key), base + pos, store_ms)

    def write_pending(self) -> set[tuple[str, int]]:
        """Put buffered units into their files; return (and forget) the queues that grew."""
        touched, self.touched = self.touched, set()
        for key in touched:
            self.queues[key].write_pending()
        return touched

    def truncate_from(self, phys: int) -> None:
        """Forget derived data for records at or after ``phys`` (recovery re-dispatches)."""
        for cq in self.queues.values():
            last = cq.last_physical()
            if last is not None and last >= phys:
                cq.truncate_from_physical(phys)

    def take_dirty(self) -> list[int]:
        fds: list[int] = []
        for cq in self.queues.values():
            if cq.dirty:
                fds.extend(cq.take_dirty())
        return fds

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
