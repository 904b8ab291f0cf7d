"""The records of the hot transaction writes made as v2 batches at once, not as a
``MessageRecord`` each that ``encode_records`` then encodes (issue 33: that per-record work was
a third of the broker's CPU per transaction).

- ``CommitCopies``: the commit copies of an end request whose halves this run stored from a
  producer's batch, written from the halves' stored bytes (``store/records/v2_copy.py``);
- ``EventBatches``: the transaction events of a half request or an end request.

Each makes byte for byte the records ``model.commit_copy`` / ``model.event_record`` make once
encoded, in the batches ``encode_records`` would group them into (topic, queue, sys_flag, born
host; cut at ``max_bytes``): tests/broker/transactions/test_batches.py holds this.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeGuard

import orjson
from tidemq.protocol import REAL_QID, EventKind, EventSource

from tidemq_server.broker.ingest.halves import BatchHalf
from tidemq_server.broker.store.records import v1
from tidemq_server.broker.store.records.v2_copy import CopyBatch
from tidemq_server.broker.store.records.v2_own import Batch
from tidemq_server.broker.store.types import MessageRecord, SysFlag, tag_code
from tidemq_server.broker.transactions.model import EVENTS_TOPIC, HALF_ONLY_NAMES, TxInfo

_COMMIT = int(SysFlag.COMMIT)
#: Per kind: its name, its tag and the tag's code (looked up once: an enum's ``.value`` is slow).
_EVENT_TAGS = {kind: (kind.value, kind.value.encode(), tag_code(kind.value)) for kind in EventKind}
_SOURCES = {source: source.value for source in EventSource}
#: The born host of an event: a ``MessageRecord``'s default, which ``event_record`` leaves.
_EVENT_HOST = v1.encode_host(MessageRecord(EVENTS_TOPIC, 0, b"").born_host)
_RECORD_ROOM = 512  # what ``encode_records`` allows a record beyond its body when cutting


class _Cut:
    """``CopyBatch``es open per key, each cut at ``max_bytes`` (a batch always fits a
    segment), as ``encode_records`` cuts them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._open: dict[Hashable, CopyBatch] = {}
        self._done: list[Batch] = []

    def __bool__(self) -> bool:
        return bool(self._open or self._done)

    def _batch(self, key: Hashable, size: int, make: Callable[[], CopyBatch]) -> CopyBatch:
        """The open batch of ``key`` with room for a record of ``size`` body bytes."""
        batch = self._open.get(key)
        if batch is not None and batch.nbytes + size + _RECORD_ROOM > self.max_bytes:
            self._done.append(batch.finish())
            batch = None
        if batch is None:
            batch = self._open[key] = make()
        return batch

    def batches(self) -> list[Batch]:
        """Every batch, finished (once)."""
        out = [*self._done, *(b.finish() for b in self._open.values())]
        self._open, self._done = {}, []
        return out


class CommitCopies(_Cut):
    """Commit copies written from their halves' stored bytes: producer-batch halves this run
    stored (``BatchHalf``) whose property names are distinct. One batch per (topic, queue,
    born host) of at most ``max_bytes``."""

    @staticmethod
    def takes(half: object) -> TypeGuard[BatchHalf]:
        """Whether ``half`` (a half cache entry) can be copied from its stored bytes."""
        return isinstance(half, BatchHalf) and half.distinct

    def add(self, half: BatchHalf, info: TxInfo) -> None:
        topic, qid = info.topic, int(half.properties[REAL_QID])  # REAL_QID: checked
        batch = self._batch((topic, qid, half.host), len(half.stored) - half.body_at,
                            lambda: CopyBatch(topic, qid, _COMMIT, v1.encode_host(half.host)))
        batch.add(half.stored, info.txid.encode(), HALF_ONLY_NAMES, info.first_offset)


class EventBatches(_Cut):
    """Transaction events (the fixed JSON body of docs/api.md#system-topics) in batches of at
    most ``max_bytes``; ``kinds`` counts them by kind (``tidemq_broker_transaction_events``)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.kinds: dict[str, int] = {}

    def __len__(self) -> int:
        return sum(self.kinds.values())

    def add(self, kind: EventKind, source: EventSource, info: TxInfo, ts_ms: int) -> None:
        # make_event's fields, in its order (EVENT_FIELDS), without its keyword call
        name, tag, code = _EVENT_TAGS[kind]
        body = orjson.dumps({
            "event": name, "source": _SOURCES[source], "producer_group": info.group,
            "topic": info.topic, "transaction_id": info.txid, "message_id": info.message_id,
            "check_times": info.check_times, "born_ms": info.born_ms, "ts_ms": ts_ms})
        self._batch(None, len(body), _event_batch).add_plain(tag, code, body, ts_ms)
        self.kinds[name] = self.kinds.get(name, 0) + 1


def _event_batch() -> CopyBatch:
    return CopyBatch(EVENTS_TOPIC, 0, 0, _EVENT_HOST)
