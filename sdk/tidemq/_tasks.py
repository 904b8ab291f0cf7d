"""Bounded shutdown of background tasks, shared by the clients and their batchers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from typing import Any


async def cancel_tasks(tasks: Collection[asyncio.Future[Any]],
                       *ignored: type[BaseException]) -> None:
    """Cancel ``tasks`` and wait until each has ended; its cancellation and the ``ignored``
    exceptions are swallowed (anything else is a bug and propagates)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, *ignored):
            await task


async def finish_tasks(tasks: Collection[asyncio.Future[Any]], timeout_s: float,
                       *ignored: type[BaseException]) -> None:
    """Wait up to ``timeout_s`` for ``tasks`` to end, then cancel those still running."""
    if not tasks:
        return
    _, pending = await asyncio.wait(set(tasks), timeout=timeout_s)
    await cancel_tasks(pending, *ignored)
