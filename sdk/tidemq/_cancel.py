"""Cancelling a delayed message: ``cancel_delayed`` of ``Producer`` and ``TransactionProducer``.

    result = await producer.send(b"check payment", topic="Orders", delay_ms=1_800_000)
    await producer.cancel_delayed(result.topic, result.message_id,
                                  broker_name=result.broker_name)

A delayed message waits on the broker group that stored it, and only that group can cancel it
(``DELETE /v1/messages/{id}/schedule?topic=``). The group named by ``broker_name`` (a
``SendResult`` says which one stored the message) is asked first, then every other group of the
topic's route; a group answering ``MESSAGE_NOT_FOUND`` does not hold it. A group that cannot
answer now (unreachable, busy, electing a primary) may hold it: the route is asked for again
(a failover names the group's new primary) and such groups are asked again, within the
client's ``RetryPolicy``. A cancel is idempotent: cancelling a cancelled message answers
``cancelled`` again.

Outcomes: a ``CancelResult`` (``state`` ``CancelState.CANCELLED``); ``AlreadyDeliveredError``
(409 ``ALREADY_DELIVERED``: too late) and ``MessageNotFoundError`` (404 ``MESSAGE_NOT_FOUND``: no
group of the topic holds a delayed message with this id) are raised, as any other refusal.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum

from tidemq._exceptions import (
    ClientClosedError,
    ConfigurationError,
    MessageNotFoundError,
    TidemqError,
    UnexpectedResponseError,
    server_error,
)
from tidemq._http import NO_RETRY, HttpClient, url
from tidemq._message import validate_topic
from tidemq._moved import unless_moved
from tidemq._retry import pause_after
from tidemq._routes import BrokerRoute, RouteTable
from tidemq.protocol import ErrorCode

MAX_MESSAGE_ID = 64  # characters of a message id at most (docs/api.md)


class CancelState(StrEnum):
    CANCELLED = "cancelled"  # it will never be delivered (also when cancelled before)


@dataclass(frozen=True, slots=True)
class CancelResult:
    """A delayed message that will never be delivered, and the broker group that held it."""

    message_id: str
    topic: str
    state: CancelState
    broker_name: str


class DelayedCancel:
    """``cancel_delayed`` for a client with a route table (a mixin of the producers)."""

    _http: HttpClient
    _routes: RouteTable
    _closed: bool

    async def cancel_delayed(self, topic: str, message_id: str, *,
                             broker_name: str | None = None) -> CancelResult:
        """Cancel the delayed message ``message_id`` of ``topic`` before it is delivered.

        ``broker_name``: the group that stored it (``SendResult.broker_name``), asked first;
        without it every group of the topic is asked. Raises ``AlreadyDeliveredError`` when
        it was delivered already and ``MessageNotFoundError`` when no group of ``topic`` holds
        a delayed message with this id (ids are unique per topic: the same id in another topic
        is never touched).
        """
        if self._closed:
            raise ClientClosedError("the client is closed")
        validate_topic(topic, set())
        if not isinstance(message_id, str) or not 1 <= len(message_id) <= MAX_MESSAGE_ID:
            raise ConfigurationError(f"cancel_delayed: message_id must be a string of 1-"
                                     f"{MAX_MESSAGE_ID} characters, got {message_id!r}")
        policy = self._http.retry
        started = time.monotonic()
        absent: set[str] = set()  # groups that answered MESSAGE_NOT_FOUND
        attempt = 0
        while True:
            attempt += 1
            # a topic whose only broker restarts is waited for, within the deadline
            give_up_at = started + (policy.deadline_s if policy.deadline_s is not None
                                    else float("inf"))
            route = await self._routes.known_route(topic, give_up_at)
            failed: list[TidemqError] = []
            for group in _ordered(route.brokers, broker_name):
                if group.broker_name in absent:
                    continue
                try:
                    answer = await unless_moved(self._routes, topic, group.address,
                                                self._http.call(
                        "DELETE", url(group.address, "v1", "messages", message_id, "schedule"),
                        params={"topic": topic}, retry=NO_RETRY))
                except MessageNotFoundError:
                    absent.add(group.broker_name)
                    continue
                except TidemqError as exc:
                    if not exc.retriable:
                        raise
                    failed.append(exc)  # it may hold the message: asked again below
                    continue
                return _result(answer, message_id, topic, group.broker_name)
            groups = sorted({g.broker_name for g in route.brokers})
            if not failed:
                raise server_error(ErrorCode.MESSAGE_NOT_FOUND,
                                   f"no broker group of topic {topic!r} ({', '.join(groups)}) "
                                   f"holds a delayed message {message_id!r}")
            pause = pause_after(policy, failed[-1], attempt, time.monotonic() - started)
            self._routes.invalidate(topic)  # a failover names the group's new primary
            await asyncio.sleep(pause)


def _ordered(brokers: tuple[BrokerRoute, ...], first: str | None) -> list[BrokerRoute]:
    """The route's groups, ``first`` first, each once."""
    seen: dict[str, BrokerRoute] = {}
    for b in sorted(brokers, key=lambda b: (b.broker_name != first, b.broker_name)):
        seen.setdefault(b.broker_name, b)
    return list(seen.values())


def _result(answer: object, message_id: str, topic: str, broker_name: str) -> CancelResult:
    state = answer.get("state") if isinstance(answer, dict) else None
    try:
        return CancelResult(message_id, topic, CancelState(str(state)), broker_name)
    except ValueError:
        raise UnexpectedResponseError(f"cancel of {message_id!r} on {broker_name}: answer "
                                      f"{answer!r} has no known state") from None
