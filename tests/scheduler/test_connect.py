"""The scheduler's wait for its broker at start (services/scheduler/service.py ``_connect``): a
scheduler started beside its broker retries soon, then backs off to ``CONNECT_RETRY_S``."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import free_port
from tidemq_server.scheduler.service import CONNECT_RETRY_FIRST_S, CONNECT_RETRY_S, Scheduler
from tidemq_server.scheduler.settings import SchedulerSettings

RETRIES = 8


async def test_the_first_retry_comes_soon_then_the_wait_doubles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = Scheduler(SchedulerSettings(data_dir=tmp_path,
                                            broker_url=f"http://127.0.0.1:{free_port()}"))
    asked = 0

    async def broker_down() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        raise ConnectionError("the broker is not up yet")

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == RETRIES:
            raise asyncio.CancelledError  # enough: stop the connect loop here
        await real_sleep(0)

    monkeypatch.setattr(scheduler.broker, "schedule_info", broker_down)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    try:
        with pytest.raises(asyncio.CancelledError):
            await scheduler._connect()
    finally:
        monkeypatch.undo()
        await scheduler.broker.close()
    assert asked == RETRIES
    # a delay sent while the broker comes up must not wait a whole second more for the scheduler
    assert waits[0] == CONNECT_RETRY_FIRST_S <= 0.1
    assert waits == sorted(waits) and waits[-1] == CONNECT_RETRY_S
    assert all(b <= 2 * a for a, b in itertools.pairwise(waits))
    assert not scheduler.ready
