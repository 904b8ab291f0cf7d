"""Hedged asks: the first answer of several equivalent servers, without waiting out a dead one.

Nameservers all hold the same routes. Asked in turn, one that is cut off (packets dropped, no
refusal) costs its whole timeout before the next is asked: seconds of a sender's time. So the
next is asked as well once the newest ask has gone ``hedge_s`` without an answer, or at once
when one fails; the first answer wins and the asks still out are cancelled. A healthy first
server answers well inside ``hedge_s``, so the others are asked only when it is slow or gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def first_of(asks: Sequence[Callable[[], Awaitable[T]]], hedge_s: float,
                   failed: Callable[[int, BaseException], None]) -> tuple[int, T] | None:
    """``(i, answer)`` of the first of ``asks`` to answer, asking ``asks[i + 1]`` once
    ``asks[i]`` has gone ``hedge_s`` unanswered or failed. ``failed(i, error)`` hears every
    failure and may raise to stop at once. None when every ask failed."""
    out: dict[asyncio.Future[T], int] = {}
    started = 0

    def ask_next() -> None:
        nonlocal started
        if started < len(asks):
            out[asyncio.ensure_future(asks[started]())] = started
            started += 1

    ask_next()
    try:
        while out:
            wait = hedge_s if started < len(asks) else None
            done, _ = await asyncio.wait(out, timeout=wait,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:  # the newest ask is slow: ask the next one too
                ask_next()
                continue
            for fut in sorted(done, key=out.__getitem__):
                i = out.pop(fut)
                error = fut.exception()
                if error is None:
                    return i, fut.result()
                failed(i, error)
                ask_next()
        return None
    finally:
        for fut in out:
            fut.cancel()
        if out:
            await asyncio.gather(*out, return_exceptions=True)
