"""The broker's store: commit log, consume queues, index, checkpoint, recovery, retention."""

from __future__ import annotations

from tidemq_server.broker.store.config import FlushMode, StoreConfig
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.broker.store.types import (
    Appended,
    GetResult,
    GetStatus,
    MessageRecord,
    PutResult,
    PutStatus,
    StoredRecord,
    SysFlag,
    tag_code,
)

__all__ = [
    "Appended",
    "FlushMode",
    "GetResult",
    "GetStatus",
    "MessageRecord",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "StoreConfig",
    "StoredRecord",
    "SysFlag",
    "tag_code",
]
