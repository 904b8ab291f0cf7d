"""Waiting for a condition, the one way tests do it: poll until it holds, fail after a timeout.

``wait_until`` blocks (conditions that ask a process: HTTP, Redis, files); ``wait_until_async``
yields to the event loop between polls (conditions on objects of the test's own loop). Both
return the first true value ``check`` answered and raise ``AssertionError`` naming ``what`` when
``timeout`` seconds pass first. A generous timeout costs nothing when the condition holds: the
wait ends at the first poll that sees it.

``quiet_for`` (and ``quiet_for_async``) is the other half: a claim that *nothing more happens*
("no second delivery", "no check after the rollback"). It reads ``fetch`` at once and then every
poll for ``seconds``, and fails at the first answer that differs from the first one, naming both.
Its window is the test's claim, written from the settings it is about (``2 * CHECK_INTERVAL_S``:
"within two check intervals"), never a guess at how long something else takes: wait for the
facts first (``wait_until``), then claim the quiet. Tests do not call ``time.sleep`` or
``asyncio.sleep`` for half a second or more (tests/support/fixed_sleeps.py counts them).
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


def quiet_for(fetch: Callable[[], T], seconds: float, what: str = "",
              every: float = EVERY_S) -> T:
    """Assert that ``fetch`` answers the same for ``seconds``; return that answer."""
    first = fetch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
        _same_or_fail(first, fetch(), seconds, what or fetch)
    return first


async def quiet_for_async(fetch: Callable[[], T], seconds: float, what: str = "",
                          every: float = EVERY_ASYNC_S) -> T:
    """``quiet_for`` for a test's own event loop: sleeps with ``asyncio.sleep``."""
    first = fetch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))
        _same_or_fail(first, fetch(), seconds, what or fetch)
    return first


async def hang() -> None:
    """Never return: the body of a handler or a fake server that never answers (it ends only
    when cancelled), instead of a long ``asyncio.sleep`` that would answer some day."""
    await asyncio.Event().wait()


def _same_or_fail(first: object, now: object, seconds: float, what: object) -> None:
    if now != first:
        raise AssertionError(f"{what} changed within {seconds}s: {first!r} -> {now!r}")


def _give_up_after(deadline: float, timeout: float, what: object) -> None:
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
