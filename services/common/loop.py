"""One small base for background loops: ``start``, ``stop``, ``wakeup``, ``run_once``.

The loop is tiny; the work is a plain method that tests call directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


async def cancel_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel every task given (None ones are skipped), then wait until each has ended.

    All are cancelled before any is awaited, so they wind down together; a task's own
    ``CancelledError`` is swallowed, any other error it ends with is raised.
    """
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task


class BackgroundLoop:
    """Calls ``run_once`` every ``interval_s`` seconds, or sooner when ``wakeup`` is called;
    the first run at ``start`` (``pause_first``: one interval after it)."""

    name = "loop"
    pause_first = False

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False

    async def run_once(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name=self.name)

    def wakeup(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        await cancel_tasks(self._task)
        self._task = None

    async def _run(self) -> None:
        if self.pause_first:
            await self.pause()
            self._wake.clear()
        while not self._stopping:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: run failed; retrying in %.1fs", self.name, self.interval_s)
            try:
                await self.pause()
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken pause must not end the loop for good
                log.exception("%s: pause failed; waiting %.1fs", self.name, self.interval_s)
                await BackgroundLoop.pause(self)
            self._wake.clear()

    async def pause(self) -> None:
        """Between two runs: ``interval_s``, or less when ``wakeup`` is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.interval_s)


class Periodic(BackgroundLoop):
    """A ``BackgroundLoop`` whose work is a plain coroutine function (tests call it directly)."""

    def __init__(self, name: str, interval_s: float, work: Callable[[], Awaitable[Any]], *,
                 pause_first: bool = False) -> None:
        super().__init__(interval_s)
        self.name = name
        self.work = work
        self.pause_first = pause_first

    async def run_once(self) -> None:
        await self.work()
