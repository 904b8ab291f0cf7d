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


class CommitCopies:
    """Commit copies written from their halves' stored bytes: producer-batch halves this run
    stored (``BatchHalf``) whose property names are distinct. One batch per (topic, queue,
    born host) of at most ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._open: dict[tuple[str, int, str], CopyBatch] = {}
        self._done: list[Batch] = []

    def __bool__(self) -> bool:
        return bool(self._open or self._done)

    @staticmethod
    def takes(half: object) -> TypeGuard[BatchHalf]:
        """Whether ``half`` (a half cache entry) can be copied from its stored bytes."""
        return isinstance(half, BatchHalf) and half.distinct

    def add(self, half: BatchHalf, info: TxInfo) -> None:
        key = (info.topic, int(half.properties[REAL_QID]), half.host)  # REAL_QID: checked
        batch = self._open.get(key)
        body = len(half.stored) - half.body_at
        if batch is not None and batch.nbytes + body + _RECORD_ROOM > self.max_bytes:
            self._done.append(batch.finish())  # cut: a batch always fits a segment
            batch = None
        if batch is None:
            batch = self._open[key] = CopyBatch(key[0], key[1], _COMMIT,
                                                v1.encode_host(half.host))
        batch.add(half.stored, info.txid.encode(), HALF_ONLY_NAMES, info.first_offset)

    def batches(self) -> list[Batch]:
        """Every batch, finished (once)."""
        out = [*self._done, *(b.finish() for b in self._open.values())]
        self._open, self._done = {}, []
        return out


class EventBatches:
    """Transaction events (the fixed JSON body of docs/api.md#system-topics) in batches of at
    most ``max_bytes``; ``kinds`` counts them by kind (``tidemq_broker_transaction_events``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.kinds: dict[str, int] = {}
        self._open: CopyBatch | None = None
        self._done: list[Batch] = []

    def __len__(self) -> int:
        return sum(self.kinds.values())

    def add(self, kind: EventKind, source: EventSource, info: TxInfo, ts_ms: int) -> None:
        # make_event's fields, in its order (EVENT_FIELDS), without its keyword call
        name, tag, code = _EVENT_TAGS[kind]
        body = orjson.dumps({
            "event": name, "source": _SOURCES[source], "producer_group": info.group,
            "topic": info.topic, "transaction_id": info.txid, "message_id": info.message_id,
            "check_times": info.check_times, "born_ms": info.born_ms, "ts_ms": ts_ms})
        batch = self._open
        if batch is not None and batch.nbytes + len(body) + _RECORD_ROOM > self.max_bytes:
            self._done.append(batch.finish())
            batch = None
        if batch is None:
            batch = self._open = CopyBatch(EVENTS_TOPIC, 0, 0, _EVENT_HOST)
        batch.add_plain(tag, code, body, ts_ms)
        self.kinds[name] = self.kinds.get(name, 0) + 1

    def batches(self) -> list[Batch]:
        """Every batch, finished (once)."""
        if self._open is not None:
            self._done.append(self._open.finish())
            self._open = None
        out, self._done = self._done, []
        return out
