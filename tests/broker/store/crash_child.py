"""Child process for the crash test: appends under flush=sync, printing each acknowledgement.

``python -m tests.broker.store.crash_child DIR ROUND`` writes until killed. Each line
``ack <message id>`` is printed only after ``put`` returned OK, i.e. after the fsync.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.broker.store.conftest import small_config
from tidemq_server.broker.store import FlushMode, MessageRecord, MessageStore, PutStatus


def body_for(message_id: str) -> bytes:
    return (message_id.encode() * 40)[: 200 + len(message_id) * 7]


async def main(root: Path, rnd: int) -> None:
    store = await MessageStore.open(small_config(root, flush=FlushMode.SYNC,
                                                 segment_bytes=256 * 1024))
    out = sys.stdout

    async def writer(w: int) -> None:
        i = 0
        while True:
            ids = [f"r{rnd}-w{w}-{i}-{k}" for k in range(1 + i % 3)]
            recs = [MessageRecord("Crash", (w + k) % 4, body_for(m), {"UNIQ_KEY": m})
                    for k, m in enumerate(ids)]
            res = await store.put(recs)
            if res.status == PutStatus.OK:
                out.write("".join(f"ack {m}\n" for m in ids))
                out.flush()
            i += 1

    print("ready", flush=True)
    await asyncio.gather(*(writer(w) for w in range(8)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
