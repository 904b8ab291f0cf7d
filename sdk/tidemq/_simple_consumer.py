"""``SimpleConsumer``: receive messages with an invisibility time, ack each one.

    async with SimpleConsumer("audit", broker_url="http://127.0.0.1:10911", topic="orders") as c:
        for message in await c.receive(max=16):
            await handle(message)
            await c.ack(message)

A received message stays invisible to the group for ``invisible_ms``; not acked by then, it is
delivered again (with a new receipt handle). ``change_invisible_duration`` extends (or shortens)
the time and returns the new handle — the old one is no longer valid.

With several broker groups serving the topic, ``receive`` first asks each broker without
waiting, in rotating order; when none had a message it long-polls every broker at once and
returns as soon as one answers with messages. The polls still out carry on in the background
(at most one per broker): what they bring is kept and handed out first by the next ``receive``
— those messages are already invisible, so call ``receive`` again well within
``invisible_ms`` (unacked they are delivered again after it, as after a crash). Receipt handles
remember their broker so that ``ack`` goes where the message came from.

A broker that fails (unreachable, 503) is left out for a back-off period (logged once when it
goes and once when it is back) while the others are served; its messages wait there, in flight
or not, until it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterable, Sequence
from typing import Self

from tidemq import _constants as C
from tidemq import _validate as V
from tidemq._auth import Credentials
from tidemq._broker_api import BrokerApi
from tidemq._client import Client
from tidemq._exceptions import ConfigurationError, TidemqError, TopicNotFoundError
from tidemq._http import DEFAULT_RETRY, NO_RETRY, RetryPolicy, Transport
from tidemq._puller import broker_down
from tidemq._tags import TagExpression
from tidemq._tasks import cancel_tasks
from tidemq.protocol import ReceivedMessage

log = logging.getLogger("tidemq.simple_consumer")

_MAX_REMEMBERED_HANDLES = 100_000  # receipt handle → broker, for multi-broker topics


class SimpleConsumer(Client):
    """Receive / ack / change invisibility for one group on one topic.

    ``nameservers`` / ``broker_url`` are given as to ``Producer`` (neither:
    ``TIDEMQ_NAMESERVER_URL``); the group, topic and tag expression are checked by the broker's
    rules here (``ConfigurationError``)."""

    def __init__(
        self,
        group: str,
        *,
        topic: str,
        nameservers: str | Sequence[str] | None = None,
        broker_url: str | None = None,
        tag_expression: str = "*",
        invisible_ms: int = C.INVISIBLE_MS,
        request_timeout_s: float = C.REQUEST_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        route_refresh_s: float = C.ROUTE_REFRESH_INTERVAL_S,
        transport: Transport | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        V.group_name(group)
        V.topic_name(topic)
        if V.integer(invisible_ms, "invisible_ms") <= 0:
            raise ConfigurationError(f"invisible_ms must be positive, got {invisible_ms}")
        self.group = group
        self.topic = topic
        self.tag_expression = TagExpression.parse(V.tag_expression(tag_expression))
        self.invisible_ms = invisible_ms
        self._connect(nameservers=nameservers, broker_url=broker_url,
                      request_timeout_s=request_timeout_s, retry=retry,
                      route_refresh_s=route_refresh_s, transport=transport,
                      credentials=credentials,
                      backoff_max_s=C.CONSUMER_BROKER_BACKOFF_MAX_S)
        self._api = BrokerApi(self._http)
        self._handles: OrderedDict[str, str] = OrderedDict()  # receipt handle → broker
        self._polls: dict[str, asyncio.Task[list[ReceivedMessage]]] = {}  # broker → long poll
        self._ready: deque[ReceivedMessage] = deque()  # received by polls, not handed out yet
        self._last_error: TidemqError | None = None  # of the last broker that failed
        self._turn = 0

    async def start(self) -> Self:
        self._routes.start()
        return self

    async def _shutdown(self) -> None:
        """On ``close``: cancel the long polls still out."""
        await cancel_tasks(list(self._polls.values()), TidemqError)
        self._polls.clear()

    async def receive(
        self, max: int = 16, invisible_ms: int | None = None, wait_ms: int = C.RECEIVE_WAIT_MS,
    ) -> list[ReceivedMessage]:
        """Up to ``max`` messages, each invisible to the group for ``invisible_ms``.

        Waits up to ``wait_ms`` (long poll) when none is available; may return fewer than
        available, or none.
        """
        if not 1 <= V.integer(max, "max") <= 1024:
            raise ConfigurationError(f"max must be 1-1024, got {max}")
        invisible = V.integer(invisible_ms, "invisible_ms") if invisible_ms is not None \
            else self.invisible_ms
        V.integer(wait_ms, "wait_ms")
        self._collect()
        if self._ready:
            return self._hand_out(max)
        brokers = await self._brokers()
        start = self._turn
        self._turn += 1
        order = [brokers[(start + i) % len(brokers)] for i in range(len(brokers))]
        live = [b for b in order if self._health.usable(b)] or order
        # one broker: its client's retries apply; several: a failing one is left for the others
        retry = None if len(order) == 1 else NO_RETRY
        if len(order) > 1:
            for broker in live:
                if broker in self._polls:
                    continue  # a long poll is out there: it answers as soon as it has some
                messages = await self._try(broker, max, invisible, 0)
                if messages:
                    return messages
            if wait_ms == 0:
                return []
        if not any(self._health.usable(b) for b in order):  # every broker is backing off
            await asyncio.sleep(min(min(self._health.wait_s(b) for b in order), wait_ms / 1000))
        for broker in order:
            if broker not in self._polls and self._health.usable(broker):
                self._polls[broker] = asyncio.create_task(
                    self._receive(broker, max, invisible, wait_ms, retry),
                    name=f"tidemq-receive-{broker}")
        mine = set(self._polls.values())
        while mine and not self._ready:
            _, mine = await asyncio.wait(mine, return_when=asyncio.FIRST_COMPLETED)
            self._collect()
        if not self._ready and self._last_error is not None \
                and not any(self._health.usable(b) for b in order):
            raise self._last_error  # every broker failed: do not let the caller spin
        return self._hand_out(max)

    async def ack(self, messages: ReceivedMessage | str | Iterable[ReceivedMessage | str]) -> int:
        """Acknowledge messages (or receipt handles); returns how many the broker acked."""
        items = [messages] if isinstance(messages, ReceivedMessage | str) else list(messages)
        by_broker: dict[str, list[str]] = defaultdict(list)
        for item in items:
            handle = self._handle_of(item)
            by_broker[await self._broker_of(handle)].append(handle)
        acked = 0
        for broker, handles in by_broker.items():
            acked += await self._api.ack(broker, self.group, handles)
            for handle in handles:
                self._handles.pop(handle, None)
        return acked

    async def change_invisible_duration(self, message: ReceivedMessage | str,
                                        invisible_ms: int) -> str:
        """Make the message invisible for ``invisible_ms`` from now; returns the new handle.

        A ``ReceivedMessage`` gets its ``receipt_handle`` replaced; the old one is invalid.
        """
        handle = self._handle_of(message)
        broker = await self._broker_of(handle)
        new = await self._api.change_invisibility(broker, self.group, handle, invisible_ms)
        self._handles.pop(handle, None)
        self._remember(new, broker)
        if isinstance(message, ReceivedMessage):
            message.receipt_handle = new
        return new

    # -- internals ---------------------------------------------------------------------------

    async def _try(self, broker: str, max_messages: int, invisible_ms: int,
                   wait_ms: int) -> list[ReceivedMessage]:
        """``_receive`` that reports a failing broker and answers [] for it."""
        try:
            return await self._receive(broker, max_messages, invisible_ms, wait_ms, NO_RETRY)
        except TidemqError as exc:
            self._failed(broker, exc)
            return []

    def _collect(self) -> None:
        """Move what finished long polls brought into ``_ready``."""
        for broker, task in list(self._polls.items()):
            if not task.done():
                continue
            del self._polls[broker]
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is None:
                self._ready.extend(task.result())
            elif isinstance(exc, TidemqError):
                self._failed(broker, exc)
            else:
                raise exc

    def _hand_out(self, max_messages: int) -> list[ReceivedMessage]:
        count = min(max_messages, len(self._ready))
        return [self._ready.popleft() for _ in range(count)]

    def _failed(self, broker: str, exc: TidemqError) -> None:
        if isinstance(exc, TopicNotFoundError):
            # one group no longer has the topic (deleted there, or a fresh data dir): look the
            # route up again, and keep serving the other groups meanwhile
            self._routes.invalidate(self.topic)
            route = self._routes.cached(self.topic)
            if route is not None and len({b.address for b in route.brokers}) < 2:
                raise exc
        elif not broker_down(exc):
            raise exc
        self._last_error = exc
        if self._health.failed(broker):
            log.warning("receive from %s failed (%s); the other brokers are served while it "
                        "backs off", broker, exc)

    async def _brokers(self) -> list[str]:
        route = await self._routes.get(self.topic)
        brokers = sorted({b.address for b in route.brokers if b.readable})
        return brokers or route.addresses

    async def _receive(self, broker: str, max_messages: int, invisible_ms: int,
                       wait_ms: int, retry: RetryPolicy | None = None) -> list[ReceivedMessage]:
        messages = await self._api.receive(
            broker, self.group, topic=self.topic, tags=str(self.tag_expression),
            max_messages=max_messages, invisible_ms=invisible_ms, wait_ms=wait_ms, retry=retry)
        if self._health and self._health.succeeded(broker):
            log.info("broker %s answers receives again", broker)
        accepted = []
        for m in messages:
            if m.receipt_handle:
                self._remember(m.receipt_handle, broker)
            if self.tag_expression.matches(m.tag):
                accepted.append(m)
            elif m.receipt_handle:  # a tag-hash collision: not ours, never hand it out
                await self._api.ack(broker, self.group, [m.receipt_handle])
        return accepted

    def _remember(self, handle: str, broker: str) -> None:
        self._handles[handle] = broker
        while len(self._handles) > _MAX_REMEMBERED_HANDLES:
            self._handles.popitem(last=False)

    async def _broker_of(self, handle: str) -> str:
        broker = self._handles.get(handle)
        if broker is not None:
            return broker
        return (await self._brokers())[0]

    @staticmethod
    def _handle_of(item: ReceivedMessage | str) -> str:
        if isinstance(item, str):
            return item
        if not item.receipt_handle:
            raise ConfigurationError(f"message {item.message_id} has no receipt handle "
                                     "(it was not received by a SimpleConsumer)")
        return item.receipt_handle
