"""The broker's write pipeline: every service that stores records holds one ``Appender``.

::

    SendService, TransactionService, the checker's actions, DelayService (deliveries,
    cancels), RetryService, InternalService
        ──► Ingest (ingest/writes.py) ──► Appender.append(records) ──► PutResult
                                      ──► Appender.append_batches(producer-made batches)

The composition root (``services/broker/service.py``, ``Broker.start``) picks the appender once:

- one copy of the log: the group-commit writer itself (``store/writer.py``,
  ``GroupCommitWriter``): it queues the request, packs it with every other waiting request
  into one write, dispatches the records to the consume queues and the index and answers;
- a replicated group: the replication gate (``replication/gate.py``, ``WriteGate``) wrapping
  that writer: it refuses writes on a replica or without enough in-sync copies, hands the
  records to the writer, then waits for the high-water mark and asks the fence again before
  it answers.

Outcomes the caller expects (busy, disk full, not primary, ...) come back as the result's
``PutStatus``; ``ingest.outcome.appended_or_raise`` turns them into the client's error. Only
``Ingest`` (ingest/writes.py, the broker's one write path) calls an appender.
"""

from __future__ import annotations

from typing import Protocol

from tidemq_server.broker.store.records.v2_own import Batch
from tidemq_server.broker.store.types import MessageRecord, PutResult, PutStatus


class Appender(Protocol):
    async def append(self, records: list[MessageRecord]) -> PutResult:
        """Store ``records`` contiguously, in one group commit (as v2 batches, each queue's
        records in order); the result says where each landed (``OK``) or why they are not
        acknowledged."""
        ...

    async def append_batches(self, batches: list[Batch]) -> PutResult:
        """Store producer-made v2 batches contiguously and in order, in one group commit; the
        result has one ``Appended`` per batch (its start, size and first queue offset)."""
        ...

    async def settle(self, end: int) -> PutStatus:
        """May records already in the log below ``end`` be acknowledged (again) now — a dedup
        hit found in the log, perhaps written but never acknowledged? The writer: always OK;
        the replication gate: once a writable primary's quorum holds them."""
        ...
