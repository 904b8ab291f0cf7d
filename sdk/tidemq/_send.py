"""The one send path of the producers: a message in, select a queue, submit, retry on failure.

``Producer.send`` / ``send_oneway`` (one message through the coalescer), ``Producer.send_batch``
(one request to one broker) and ``TransactionProducer.send`` (a half message through its
batcher) differ only in what they pick and what they submit; everything else is here, once:

- ``as_message``: what a caller gives (a ``Message``, bytes, str or a pydantic model, and keyword
  overrides) as a ``Message``; ``Sender._message`` adds the topic checks;
- ``Sender._send_over``: a ``Shipment`` (what is sent: one message, a batch, a half message)
  picks a queue and submits to it; on a failure ``tidemq._fault.SendAttempts`` decides (same
  broker again, another group, a pause, or give up), the route is asked for again and a
  NOT_PRIMARY answer naming a new primary is followed (``_send_failed``). The first attempt
  takes the route the caller looked up; the deadline runs from ``started``, the send's first
  attempt. On success the broker's health is cleared and ``failovers`` /
  ``possible_duplicates`` are counted. ``Producer.send`` makes its first attempt itself (the
  hot path: no shipment, no frame) and hands a failure to ``_send_over``.

A shipment is one small object per send, not closures: what every send in flight holds is what
the garbage collector walks (closures, their cells and an extra frame per send cost ~10 µs of
client CPU a message in bench.produce_consume, issue 30).
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Collection, Mapping
from typing import Any, Generic, TypeVar

from tidemq._cancel import DelayedCancel
from tidemq._client import Client
from tidemq._exceptions import ConfigurationError, TidemqError
from tidemq._fault import SendAttempts, Step, electing, primary_hint
from tidemq._message import Message, validate_topic
from tidemq._routes import MessageQueue, TopicRoute
from tidemq._selector import QueueSelector
from tidemq._typed import JsonModel, model_body

log = logging.getLogger("tidemq.producer")

T = TypeVar("T")

Body = bytes | str | JsonModel  # a pydantic model is sent as its JSON
_BODIES = (bytes, bytearray, memoryview, str)  # a tuple: ``a | b`` would build a union per call



class Shipment(ABC, Generic[T]):
    """What one send stores, and how: the two steps in which sends differ."""

    __slots__ = ()

    count = 1  # messages it holds (for ``failovers`` / ``possible_duplicates``)

    @property
    @abstractmethod
    def movable(self) -> bool:
        """It may go to another group: no explicit queue, no sharding key kept in order."""

    @abstractmethod
    def what(self) -> str:
        """Its name in logs and errors: ``message <id>``, ``batch of 12 to 'T'``."""

    @abstractmethod
    def pick(self, route: TopicRoute, avoid: Collection[str]) -> MessageQueue:
        """The queue of the next attempt, away from the groups in ``avoid``."""

    @abstractmethod
    def submit(self, route: TopicRoute, queue: MessageQueue) -> Awaitable[T]:
        """One attempt at ``queue`` (picked over ``route``)."""


def as_message(message: Message | Body, overrides: Mapping[str, Any], *,
               copy: bool = False) -> Message:
    """``message`` as a ``Message`` with each override given (not None) in place of its field;
    ``copy``: never the caller's own ``Message`` (the sender fills fields in)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(message, Message):
        return dataclasses.replace(message, **given) if given or copy else message
    if isinstance(message, _BODIES):
        return Message(body=message if isinstance(message, str) else bytes(message), **given)
    if (body := model_body(message)) is not None:
        return Message(body=body, **given)
    raise ConfigurationError(f"send: expected a Message, bytes, str or a pydantic model, "
                             f"got {type(message).__name__}")


class Sender(DelayedCancel, Client):
    """A client that stores messages (the producers): the path its sends share (module
    docstring), and ``cancel_delayed`` (``tidemq._cancel``)."""

    _selector: QueueSelector
    _valid_topics: set[str]
    failovers = 0  # messages stored on another group than the first one tried
    # ... of which an earlier group may have stored a copy too (its answer was lost)
    possible_duplicates = 0

    def _message(self, message: Message | Body, overrides: Mapping[str, Any], *,
                 copy: bool = False) -> tuple[str, Message]:
        """The topic and ``Message`` of a send (``as_message``), its topic checked."""
        msg = as_message(message, overrides, copy=copy)
        topic = msg.topic
        if not topic:
            raise ConfigurationError("send: no topic (pass topic=... or Message(topic=...))")
        if topic not in self._valid_topics:
            validate_topic(topic, self._valid_topics)
        return topic, msg

    async def _send_over(
        self, topic: str, shipment: Shipment[T], *, started: float,
        route: TopicRoute | None = None, failed: tuple[MessageQueue, TidemqError] | None = None,
    ) -> tuple[T, MessageQueue]:
        """Send ``shipment`` failing over as ``tidemq._fault`` says; the answer and the queue
        that took it. ``started``: the send's first attempt (the deadline runs from there);
        ``route``: the topic's route when the caller just looked it up (the first attempt uses
        it unless its groups are electing); ``failed``: the caller made the first attempt
        itself (``Producer.send``, the hot path), at this queue over ``route``, and it failed
        with this error."""
        attempts: SendAttempts | None = None
        step = Step.SELECT
        queue, error = failed if failed is not None else (None, None)
        while True:
            if error is None:
                if route is None or route.electing():
                    route = await self._routes.write_route(topic, self._give_up_at(started))
                if step is Step.SELECT or queue is None:
                    queue = shipment.pick(route, attempts.tried if attempts else ())
                else:
                    queue = self._retarget(route, queue)
                try:
                    result = await shipment.submit(route, queue)
                except TidemqError as exc:
                    error = exc
                else:
                    self._sent(queue, attempts, shipment.count)
                    return result, queue
            assert route is not None and queue is not None  # set with every error
            if attempts is None:
                attempts = SendAttempts(self._health, self._http.retry,
                                        movable=shipment.movable, first=queue.broker_name,
                                        started=started, what=shipment.what())
            step = await self._send_failed(topic, route, queue.broker_name, attempts, error)
            route, error = None, None  # asked again: the failure may have changed it

    async def _send_failed(self, topic: str, route: TopicRoute, broker_name: str,
                           attempts: SendAttempts, exc: TidemqError) -> Step:
        """A send to group ``broker_name`` failed: what to do next (``tidemq._fault``). An
        electing group's route is asked for again (the nameservers name the new primary), and a
        NOT_PRIMARY answer naming a primary the route knows is followed at once."""
        replicated = route.replicated(broker_name)
        if electing(exc, replicated):
            self._routes.invalidate(topic)
        hint = primary_hint(exc)
        moved = hint is not None and self._routes.follow_primary(topic, broker_name, hint)
        return await attempts.after_failure(exc, broker_name, route.write_groups(),
                                            replicated=replicated, moved=moved)

    def _sent(self, queue: MessageQueue, attempts: SendAttempts | None, count: int) -> None:
        """Book-keeping after ``count`` messages were stored on ``queue``'s broker."""
        if self._health and self._health.succeeded(queue.broker_name):
            log.info("broker %s answers again; sends use it again", queue.broker_name)
        if attempts is None:
            return
        if attempts.first != queue.broker_name:
            self.failovers += count
        if attempts.duplicated_on(queue.broker_name):
            self.possible_duplicates += count
            log.debug("%s stored on %s after an answer from %s was lost: that group may hold a "
                      "copy too", attempts.what, queue.broker_name,
                      ", ".join(sorted(attempts.uncertain - {queue.broker_name})))
