"""Leaving a silent primary: ``unless_moved`` runs one request to a replicated group's primary
and gives it up once the nameservers name another primary of that group.

A primary paused (SIGSTOP, a long GC, a VM stall) or cut off from this client takes the request
and answers nothing until it is healed or the request times out (``REQUEST_TIMEOUT_S``, 10 s);
its group elects a successor in about its lease (2 s). So a request still unanswered after
``MOVED_CHECK_S`` makes the client ask for the topic's route again, then every
``PRIMARY_WAIT_POLL_S``; once the route names another primary of the group, the request is given
up as a ``TransportError`` with ``sent`` True (it may have been stored). The callers' retry
rules take it from there: a send is retried with the same message id at the new primary (a copy
the old one replicated before the failover is met by the dedup there; one it did not replicate
is cut from its log when it follows), a cancel is asked again. A group without replicas has no
successor to follow: its requests are not watched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tidemq._constants import MOVED_CHECK_S, PRIMARY_WAIT_POLL_S
from tidemq._exceptions import TidemqError, TransportError
from tidemq._routes import RouteTable, TopicRoute

T = TypeVar("T")


def group_at(route: TopicRoute | None, address: str) -> str | None:
    """The replicated group whose primary ``route`` says ``address`` is (None: none is)."""
    if route is None:
        return None
    for b in route.brokers:
        if b.address == address:
            return b.broker_name if b.replicas else None
    return None


def primary_of(route: TopicRoute, group: str) -> str | None:
    """The address taking writes for ``group`` in ``route`` (None: it has no primary now)."""
    for b in route.brokers:
        if b.broker_name == group and b.writable:
            return b.address
    return None


async def unless_moved(routes: RouteTable, topic: str, address: str, request: Awaitable[T], *,
                       check_s: float = MOVED_CHECK_S, poll_s: float = PRIMARY_WAIT_POLL_S,
                       ) -> T:
    """``request`` to ``address``, given up (``TransportError``, ``sent``) once the route of
    ``topic`` names another primary of its group while it is unanswered ``check_s`` or more."""
    group = group_at(routes.cached(topic), address)
    if group is None:
        return await request

    async def primary_now() -> str | None:
        routes.invalidate(topic)
        try:
            return primary_of(await routes.get(topic, patient=False), group)
        except TidemqError:
            return None  # no nameserver answered: keep waiting for the request

    def moved(now: str, waited: float) -> Exception:
        return TransportError(f"no answer from {address} in {waited:.1f}s, and group "
                              f"{group}'s primary is {now} now", sent=True)

    return await abandon_if_moved(request, address, primary_now, moved,
                                  check_s=check_s, poll_s=poll_s)


async def abandon_if_moved(request: Awaitable[T], address: str,
                           primary_now: Callable[[], Awaitable[str | None]],
                           moved: Callable[[str, float], Exception], *, check_s: float,
                           poll_s: float) -> T:
    """``request`` (sent to ``address``), its result; but once it is unanswered ``check_s``,
    ask ``primary_now()`` (the group's primary as the nameservers see it now; None: unknown)
    then every ``poll_s``, and when that names another address, cancel the request and raise
    ``moved(new_address, seconds_waited)``. The SDK's calls and the services' broker client
    (checker, scheduler) both leave a silent primary this way."""
    task = asyncio.ensure_future(request)
    try:
        done, _ = await asyncio.wait({task}, timeout=check_s)
        waited = check_s
        while not done:
            now = await primary_now()
            if now is not None and now != address and not task.done():
                raise moved(now, waited)
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            waited += poll_s
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
