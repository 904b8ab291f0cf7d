"""Waiting for a condition, the one way tests do it: poll until it holds, fail after a timeout.

``wait_until`` blocks (conditions that ask a process: HTTP, Redis, files); ``wait_until_async``
yields to the event loop between polls (conditions on objects of the test's own loop). Both
return the first true value ``check`` answered and raise ``AssertionError`` naming ``what`` when
``timeout`` seconds pass first. A generous timeout costs nothing when the condition holds: the
wait ends at the first poll that sees it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 20.0  # default wait (s): long enough for a loaded 2-core machine
EVERY_S = 0.05  # default poll interval of wait_until (s): a check may be a request
EVERY_ASYNC_S = 0.01  # default poll interval of wait_until_async (s): checks are in memory
# A bound only a hang passes (s), for the few tests whose behaviour is "answers instead of
# hanging": far above any normal time on a loaded machine. How fast is a benchmark's business.
HANG_S = TIMEOUT_S


def wait_until(check: Callable[[], T], timeout: float = TIMEOUT_S, what: str = "",
               every: float = EVERY_S) -> T:
    """Poll ``check`` until it answers something true, and return that."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        _give_up_after(deadline, timeout, what or check)
        time.sleep(every)
    return value


async def wait_until_async(check: Callable[[], T],
                           timeout: float = TIMEOUT_S,  # noqa: ASYNC109  (the same as wait_until's)
                           what: str = "", every: float = EVERY_ASYNC_S) -> T:
    """``wait_until`` for a test's own event loop: sleeps with ``asyncio.sleep``."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        _give_up_after(deadline, timeout, what or check)
        await asyncio.sleep(every)
    return value


def _give_up_after(deadline: float, timeout: float, what: object) -> None:
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
