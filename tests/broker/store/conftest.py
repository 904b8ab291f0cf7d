"""Store test helpers: small segments and index files so tests exercise rolls and limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tidemq_server.broker.store import MessageRecord, MessageStore, StoreConfig, tag_code


def small_config(root: Path, **overrides: Any) -> StoreConfig:
    base: dict[str, Any] = dict(root=root, segment_bytes=64 * 1024, cq_units_per_file=50,
                                index_slots=997, index_entries=5000, flush_interval_ms=50,
                                retention_interval_s=3600)
    base.update(overrides)
    return StoreConfig(**base)


def make_record(i: int, topic: str = "T", queue_id: int = 0, size: int = 100,
                tag: str | None = "a", **kw: Any) -> MessageRecord:
    props = {"UNIQ_KEY": f"id-{topic}-{i}", "KEYS": f"k{i}"}
    if tag:
        props["TAGS"] = tag
    return MessageRecord(topic, queue_id, bytes([i % 251]) * size, props,
                         tag_code=tag_code(tag), born_timestamp=1000 + i, **kw)


@pytest.fixture
async def store(store_dir: Path) -> AsyncIterator[MessageStore]:
    s = await MessageStore.open(small_config(store_dir))
    yield s
    await s.close()
