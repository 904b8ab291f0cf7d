"""A store written in record format version 1, kept as a file: after record format v2 lands, the
broker must still recover and serve a store written before it (issue 23).

``data/v1-store.tar.gz`` was written by ``python -m tests.broker.store.v1_store`` while the writer
wrote version 1 (before issue 23's phase 2). Do not write it again once the writer writes v2:
it is the reference of what an old store holds. ``SPEC`` says what each record is, so the test
can check every field without the writer that made it.
"""

from __future__ import annotations

import asyncio
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.broker.store.conftest import small_config
from tidemq_server.broker.store import MessageRecord, MessageStore, SysFlag, tag_code

ARCHIVE = Path(__file__).parent / "data" / "v1-store.tar.gz"
COUNT = 240  # records: over several 64 KiB segments (small_config)


@dataclass(frozen=True, slots=True)
class Spec:
    """Record ``i`` of the reference store."""

    i: int

    @property
    def topic(self) -> str:
        return "Orders" if self.i % 5 else "RMQ_SYS_TRANS_HALF_TOPIC"

    @property
    def queue_id(self) -> int:
        return self.i % 3 if self.topic == "Orders" else 0

    @property
    def sys_flag(self) -> int:
        return 0 if self.topic == "Orders" else int(SysFlag.PREPARED)

    @property
    def message_id(self) -> str:
        return f"v1-{self.i:04d}"

    @property
    def tag(self) -> str | None:
        return ("Paid", "Shipped", None)[self.i % 3 if self.i % 7 else 2]

    @property
    def keys(self) -> list[str]:
        return [f"order-{self.i}", "user-7"] if self.i % 4 == 0 else []

    @property
    def body(self) -> bytes:
        return bytes([self.i % 251]) * (300 + (self.i * 37) % 900)

    @property
    def user_properties(self) -> dict[str, str]:
        return {"region": "eu", "n": str(self.i)} if self.i % 2 else {}

    def record(self) -> MessageRecord:
        props = dict(self.user_properties)
        props["UNIQ_KEY"] = self.message_id
        if self.tag:
            props["TAGS"] = self.tag
        if self.keys:
            props["KEYS"] = "\x1f".join(self.keys)
        return MessageRecord(self.topic, self.queue_id, self.body, props, tag_code(self.tag),
                             flag=self.i % 4, sys_flag=self.sys_flag,
                             born_timestamp=1_767_225_600_000 + self.i,
                             born_host="192.168.1.2:5555", reconsume_times=self.i % 3)


SPEC = [Spec(i) for i in range(COUNT)]


async def write(root: Path) -> None:
    store = await MessageStore.open(small_config(root))
    try:
        for start in range(0, COUNT, 16):  # 16 records per put, as concurrent sends make
            result = await store.put([s.record() for s in SPEC[start:start + 16]])
            assert result.status.value == "ok", result
    finally:
        await store.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "store"
        asyncio.run(write(root))
        ARCHIVE.parent.mkdir(exist_ok=True)
        with tarfile.open(ARCHIVE, "w:gz") as tar:
            tar.add(root, arcname="store")
    print(f"wrote {ARCHIVE} ({ARCHIVE.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
