"""The broker's store: commit log, consume queues, index, checkpoint, recovery, retention."""

from __future__ import annotations

from services.broker.store.config import FlushMode, StoreConfig
from services.broker.store.store import MessageStore
from services.broker.store.types import (
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
