"""SIGKILL a writing process at random moments; every acknowledged record must survive."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.broker.store.conftest import small_config
from tests.broker.store.crash_child import body_for
from tests.support.procs import REPO
from tidemq_server.broker.store import MessageStore

pytestmark = pytest.mark.integration

ROUNDS = 22


def _run_and_kill(root: Path, rnd: int, delay: float) -> list[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.broker.store.crash_child", str(root),
                             str(rnd)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    # the kill comes ``delay`` after the first acknowledgement, not after the start: a loaded
    # machine may acknowledge nothing in the first 0.6 s
    first = proc.stdout.readline()
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    data = first + proc.stdout.read()
    proc.wait()
    lines = data.split(b"\n")[:-1]  # the last piece may be a torn line
    return [ln.split()[1].decode() for ln in lines if ln.startswith(b"ack ")]


def test_acknowledged_records_survive_sigkill(tmp_path: Path) -> None:
    rnd = random.Random(7)
    acked: list[str] = []
    for r in range(ROUNDS):
        got = _run_and_kill(tmp_path, r, rnd.uniform(0.05, 0.6))
        assert got, f"round {r}: the child acknowledged nothing"
        acked.extend(got)

    async def verify() -> None:
        store = await MessageStore.open(small_config(tmp_path, segment_bytes=256 * 1024))
        try:
            for m in acked:
                found = store.find_by_unique_key(m)
                assert len(found) == 1, f"{m}: {len(found)} copies"
                assert found[0].body == body_for(m)
            total = 0
            for q in range(4):
                lo, hi = store.queue_offsets("Crash", q)
                got = store.get("Crash", q, lo, 1_000_000).records
                assert len(got) == hi - lo  # the queue agrees with the log: no holes
                total += len(got)
            assert total >= len(acked)
        finally:
            await store.close()

    asyncio.run(verify())
