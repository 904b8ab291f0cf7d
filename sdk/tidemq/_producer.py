"""``Producer``: send messages, coalescing concurrent sends into batched requests.

    async with Producer(nameservers=["http://127.0.0.1:9876"]) as producer:
        result = await producer.send(b"hello", topic="orders", tag="created", keys=["o-42"])
        results = await producer.send_batch("orders", [b"a", b"b"])
        await producer.send_oneway(b"fire and forget", topic="audit")
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Collection, Iterable, Mapping, Sequence
from typing import Self, TypedDict, Unpack

from tidemq import _validate as V
from tidemq._auth import Credentials
from tidemq._batch import encode_request, results_of
from tidemq._batcher import Coalescer
from tidemq._constants import (
    CLOSE_TIMEOUT_S,
    PRODUCER_BROKER_BACKOFF_MAX_S,
    REQUEST_TIMEOUT_S,
    ROUTE_REFRESH_INTERVAL_S,
    SEND_LINGER_MS,
)
from tidemq._exceptions import (
    ClientClosedError,
    ConfigurationError,
    TidemqError,
    TopicNotFoundError,
    TransportError,
    UnexpectedResponseError,
    server_error,
)
from tidemq._http import DEFAULT_RETRY, NO_RETRY, RetryPolicy, Transport, url
from tidemq._message import (
    Message,
    SendResult,
    body_to_outgoing,
    new_client_id,
    to_outgoing,
    validate_topic,
    wire_size,
)
from tidemq._moved import unless_moved
from tidemq._routes import MessageQueue, TopicRoute
from tidemq._selector import QueueSelector
from tidemq._send import Body, Sender, Shipment, as_message
from tidemq._tasks import finish_tasks
from tidemq.protocol import ErrorCode, OutgoingMessage
from tidemq.protocol.message import DEFAULT_LIMITS
from tidemq.protocol.records.v2 import CONTENT_BATCH

log = logging.getLogger("tidemq.producer")


class SendOptions(TypedDict, total=False):
    """The keyword arguments of ``send`` and ``send_oneway``: each one given (not None)
    replaces that field of the message (``Message`` says what they mean)."""

    topic: str | None
    tag: str | None
    keys: Sequence[str] | str | None
    properties: Mapping[str, str] | None
    sharding_key: str | None
    queue_id: int | None
    delay_level: int | None
    delay_ms: V.Duration | None  # ms (int or whole float) or a timedelta
    deliver_at_ms: V.Instant | None  # epoch ms (int or whole float) or a datetime
    message_id: str | None


_SEND_OPTIONS = SendOptions.__optional_keys__
_BARE_BODIES = (bytes, str)  # exact types ``_outgoing`` takes without a Message
_BARE_OPTIONS = frozenset({"topic", "message_id", "properties"})  # ... and the options with them


class Producer(Sender):
    """Sends messages to the brokers serving a topic; an async context manager.

    Concurrent ``send`` calls for one (broker, topic) are gathered into one request; each
    caller gets its own ``SendResult``. A send goes out at once when no request to its (broker,
    topic) is outstanding; otherwise it waits for that request's answer, at most ``linger_ms``
    (or until ``max_batch`` messages / ``max_batch_bytes``). Every message carries a
    client-generated ``message_id`` that stays the same across retries, so a broker never
    stores a retried message twice. ``cancel_delayed(topic, message_id, broker_name=...)``
    cancels a delayed message before it is delivered (``tidemq._cancel``); the send's
    ``SendResult.broker_name`` says which group to ask first.

    Messages are spread over every writable queue of every broker group of the topic. A send
    that fails because its group is unreachable, busy or timing out is retried on another group
    and that group is avoided for a while (``tidemq._fault``: the rule, and the one case where
    two groups may each store a copy, counted in ``possible_duplicates``). A message with a
    ``sharding_key`` stays on its queue and fails after the retries instead, keeping its key's
    order — unless ``ordered_failover=True``, which lets it move to a live group (that key's
    order may then break across the move). An explicit ``queue_id`` never moves.

    ``retry`` bounds every send by one deadline (``RetryPolicy``: 30 s by default, from the
    send's first attempt; ``max_attempts`` is unbounded by default): a broker restart or a
    primary election shows as sends taking longer, not as errors. Between attempts routes are
    refreshed from the nameservers and a newly announced primary is followed. A send whose
    answer was lost keeps to its group while that group answers (``tidemq._fault``), so the
    retry meets the broker's dedup of its message id. Only past the deadline, or on an error no
    retry can fix (400, 403, 413...), does ``send`` raise; the error says how many attempts over
    how long.

    ``nameservers`` is a list of URLs, one URL or comma-separated URLs; ``broker_url`` names a
    single broker instead; given neither, ``TIDEMQ_NAMESERVER_URL`` names the nameservers. Bad
    arguments, here or to ``send``, raise ``ConfigurationError`` naming them, before anything
    is sent (``tidemq._validate``).
    """

    def __init__(
        self,
        *,
        nameservers: str | Sequence[str] | None = None,
        broker_url: str | None = None,
        linger_ms: float = SEND_LINGER_MS,
        max_batch: int = 256,
        max_batch_bytes: int = 4 * 1024 * 1024,
        max_in_flight: int = 32,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        route_refresh_s: float = ROUTE_REFRESH_INTERVAL_S,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
        ordered_failover: bool = False,
        transport: Transport | None = None,
        credentials: Credentials | None = None,
        client_id: str | None = None,
    ) -> None:
        limits = DEFAULT_LIMITS
        #: this producer instance (``host@pid@random`` unless given): ``messaging.client.id``
        self.client_id = V.text(client_id, "client_id") if client_id is not None \
            else new_client_id()
        for name, value in (("max_batch", max_batch), ("max_batch_bytes", max_batch_bytes),
                            ("max_in_flight", max_in_flight)):
            V.integer(value, name)
        if not 1 <= max_batch <= limits.max_batch_messages:
            raise ConfigurationError(
                f"max_batch must be 1-{limits.max_batch_messages}, got {max_batch}")
        if not limits.max_body_bytes <= max_batch_bytes <= limits.max_batch_bytes:
            raise ConfigurationError(f"max_batch_bytes must be {limits.max_body_bytes}-"
                                     f"{limits.max_batch_bytes}, got {max_batch_bytes}")
        if linger_ms < 0 or max_in_flight < 1:
            raise ConfigurationError("linger_ms must be >= 0 and max_in_flight >= 1")
        self._connect(nameservers=nameservers, broker_url=broker_url,
                      request_timeout_s=request_timeout_s, retry=retry,
                      route_refresh_s=route_refresh_s, transport=transport,
                      credentials=credentials,
                      backoff_max_s=PRODUCER_BROKER_BACKOFF_MAX_S)
        self._selector = QueueSelector()
        self._ordered_failover = ordered_failover
        self._coalescer = Coalescer(self._post, linger_s=linger_ms / 1000.0,
                                    max_messages=max_batch, max_bytes=max_batch_bytes,
                                    max_in_flight=max_in_flight)
        self._close_timeout_s = close_timeout_s
        self._group_of: dict[str, str] = {}  # broker address → its group (broker_name)
        self._valid_topics: set[str] = set()
        self._oneway: set[asyncio.Task[SendResult]] = set()
        self._started = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Self:
        """Start the background route refresh (``send`` also starts it on first use)."""
        self._require_open()
        if not self._started:
            self._started = True
            self._routes.start()
        return self

    async def _shutdown(self) -> None:
        """On ``close``: send what is queued, wait (bounded) for requests in flight."""
        deadline = time.monotonic() + self._close_timeout_s
        self._coalescer.flush_all()
        # oneway sends first: they may still fail over and queue again
        await finish_tasks(self._oneway, self._close_timeout_s, TidemqError)
        await self._coalescer.drain(max(0.0, deadline - time.monotonic()))

    # -- sending -----------------------------------------------------------------------------

    async def send(self, message: Message | Body, **options: Unpack[SendOptions]) -> SendResult:
        """Send one message and wait for the broker's acknowledgement.

        ``message`` is a ``Message`` or a body; keyword arguments (``SendOptions``: topic, tag,
        keys, properties, sharding_key, queue_id, delay_level, delay_ms, deliver_at_ms,
        message_id) override its fields.
        """
        topic, out = self._outgoing(message, options, "send")
        # a started producer with the topic's route cached goes to the coalescer without a
        # coroutine or an await of its own (``_route`` is the general way)
        route = self._routes.fresh(topic) if self._started else None
        if route is None:
            route = await self._route(topic)
        if route.electing():
            return await self._deliver(topic, out, route)
        # the first attempt here (most sends need no other), the rest on the send path: this
        # is _deliver's first step without its shipment object and two frames (the hot path:
        # with closures there, bench.produce_consume measured ~10 µs more CPU a send)
        started = time.monotonic()
        explicit = out.queue_id
        health = self._health
        queue = self._selector.round_robin(route) \
            if explicit is None and out.sharding_key is None and not health \
            else self._pick_one(route, out, explicit, ())
        out.queue_id = queue.queue_id
        try:
            result = await self._coalescer.submit(queue.address, topic, out)
        except TidemqError as exc:
            return await self._deliver(topic, out, route, failed=(queue, exc), explicit=explicit,
                                       started=started)
        if health:  # _sent's only step for a first attempt
            self._sent(queue, None, 1)
        return result

    async def send_oneway(self, message: Message | Body, **options: Unpack[SendOptions]) -> None:
        """Queue one message without waiting for the broker; a failure is only logged.

        Takes the arguments of ``send``. Invalid arguments and unknown topics still raise here.
        ``close()`` waits (bounded) for queued oneway messages.
        """
        topic, out, route = await self._prepare(message, options, "send_oneway")
        task = asyncio.create_task(self._deliver(topic, out, route),
                                   name=f"tidemq-oneway-{topic}")
        self._oneway.add(task)
        task.add_done_callback(self._oneway.discard)
        task.add_done_callback(_log_oneway_failure)

    async def send_batch(self, topic: str, messages: Iterable[Message | Body]) -> list[SendResult]:
        """Send ``messages`` to ``topic`` in one request; results are in request order.

        The batch goes to one broker: the broker of its keyed (``sharding_key``/``queue_id``)
        messages, else the next one in round robin; other messages are spread over that
        broker's queues. Keys that map to queues of different brokers are refused — send
        those with ``send``, which coalesces per broker anyway. A ``Message`` whose own
        ``topic`` is another one is refused (``ConfigurationError``), as is any message with an
        argument of the wrong type, before anything is sent.
        """
        self._require_open()
        validate_topic(topic, self._valid_topics)
        if isinstance(messages, bytes | str | Message) or not isinstance(messages, Iterable):
            raise ConfigurationError(f"send_batch: messages must be a list of messages or "
                                     f"bodies, got {type(messages).__name__}")
        given = {"topic": topic}
        # a bare body (most batches) is what body_to_outgoing takes, without a Message
        outs = [body_to_outgoing(m) if type(m) is bytes or type(m) is str
                else to_outgoing(as_message(_of_batch(topic, i, m), given))
                for i, m in enumerate(messages)]
        if not outs:
            return []
        limits = DEFAULT_LIMITS
        total = sum(wire_size(m) for m in outs)
        if len(outs) > limits.max_batch_messages or total > limits.max_batch_bytes:
            raise server_error(ErrorCode.MESSAGE_TOO_LARGE, f"batch of {len(outs)} messages, "
                               f"{total} bytes exceeds {limits.max_batch_messages} messages or "
                               f"{limits.max_batch_bytes} bytes; split it")
        await self.start()
        results, _ = await self._send_over(topic, _Batch(self, topic, outs),
                                           started=time.monotonic())
        if len(results) != len(outs):
            raise UnexpectedResponseError(
                f"sent {len(outs)} messages to {topic!r}, got {len(results)} results")
        return results

    # -- internals ---------------------------------------------------------------------------

    def _batch_broker(self, route: TopicRoute, outs: list[OutgoingMessage],
                      explicit: list[int | None], avoid: Collection[str]) -> MessageQueue:
        """The one broker of a batch: that of its keyed messages, else the next usable one."""
        keyed = [self._selector.select(route, sharding_key=m.sharding_key, queue_id=q)
                 for m, q in zip(outs, explicit, strict=True)
                 if m.sharding_key is not None or q is not None]
        brokers = {q.address for q in keyed}
        if len(brokers) > 1:
            raise ConfigurationError(f"send_batch: the sharding keys / queue ids of this batch "
                                     f"map to {len(brokers)} brokers; use send() instead")
        if keyed:
            return keyed[0]
        return self._selector.select(route, health=self._health, avoid=avoid)

    async def _prepare(
        self, message: Message | Body, options: SendOptions, method: str,
    ) -> tuple[str, OutgoingMessage, TopicRoute]:
        """Validate a message, start the producer and look its topic's route up."""
        topic, out = self._outgoing(message, options, method)
        return topic, out, await self._route(topic)

    async def _route(self, topic: str) -> TopicRoute:
        """Start the producer and look ``topic``'s route up; an unknown topic fails here,
        before queueing (one routed before is waited for)."""
        if not self._started:
            await self.start()
        route = await self._routes.known_route(topic, self._give_up_at(time.monotonic()))
        self._require_open()
        return route

    def _outgoing(
        self, message: Message | Body, options: SendOptions, method: str,
    ) -> tuple[str, OutgoingMessage]:
        """The topic and wire form of a message to send, checked (``_prepare`` without I/O)."""
        if len(options) == 1 and type(message) in _BARE_BODIES:
            topic = options.get("topic")
            if topic and topic in self._valid_topics:
                # send(body, topic=...) to a topic checked before: the commonest call, with
                # nothing else to check (``_BARE_OPTIONS`` below, without its set operations)
                self._require_open()
                return topic, body_to_outgoing(message)  # type: ignore[arg-type]
        if not options.keys() <= _SEND_OPTIONS:  # as Python says it for a named keyword argument
            unknown = sorted(options.keys() - _SEND_OPTIONS)
            raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r}")
        self._require_open()
        topic = options.get("topic")
        if topic and type(message) in _BARE_BODIES and options.keys() <= _BARE_OPTIONS:
            # the common case, send(body, topic=...) (a tracer adds message_id and properties):
            # no Message to build and copy
            if topic not in self._valid_topics:
                validate_topic(topic, self._valid_topics)
            return topic, body_to_outgoing(
                message, message_id=options.get("message_id"),  # type: ignore[arg-type]
                properties=options.get("properties"))
        topic, msg = self._message(message, options)
        return topic, to_outgoing(msg)

    async def _deliver(
        self, topic: str, out: OutgoingMessage, route: TopicRoute | None = None, *,
        failed: tuple[MessageQueue, TidemqError] | None = None, explicit: int | None = None,
        started: float | None = None,
    ) -> SendResult:
        """Send one message through the coalescer on the send path (``Sender._send_over``).

        ``route``: the topic's route when the caller just looked it up; ``failed``: the
        caller's first attempt (at that queue, over ``route``) failed with that error, and
        ``explicit`` is the message's own queue id (None: any); ``started``: when the send
        began (its deadline runs from there; default now)."""
        shipment = _One(self, topic, out, out.queue_id if failed is None else explicit)
        result, _ = await self._send_over(
            topic, shipment, started=time.monotonic() if started is None else started,
            route=route, failed=failed)
        return result

    def _pick_one(self, route: TopicRoute, out: OutgoingMessage, explicit: int | None,
                  avoid: Collection[str]) -> MessageQueue:
        """The queue of one message (``explicit``: its own queue id), away from ``avoid``."""
        return self._selector.select(route, sharding_key=out.sharding_key, queue_id=explicit,
                                     health=self._health, avoid=avoid,
                                     reshard=self._ordered_failover)

    def _require_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the producer is closed")

    def _group_name(self, broker: str, topic: str) -> str | None:
        """The group of the broker at ``broker`` in ``topic``'s cached route (remembered)."""
        route = self._routes.cached(topic)
        for b in route.brokers if route is not None else ():
            if b.address == broker:
                self._group_of[broker] = b.broker_name
                return b.broker_name
        return None

    async def _post(
        self, broker: str, topic: str, messages: list[OutgoingMessage],
    ) -> list[SendResult]:
        """``POST /v1/topics/{topic}/messages`` as record format v2 batches (the log's own
        bytes); one result per message, in order."""
        target = url(broker, "v1", "topics", topic, "messages")
        group = self._group_of.get(broker) or self._group_name(broker, topic)
        content, where = encode_request(topic, messages, int(time.time() * 1000))
        try:  # no retries here: the send path decides where a failed send goes
            answer = await unless_moved(self._routes, topic, broker, self._http.call_raw(
                "POST", target, content, CONTENT_BATCH, retry=NO_RETRY))
        except (TopicNotFoundError, TransportError):
            self._routes.invalidate(topic)  # the topic moved, or the broker is gone
            raise
        return results_of(answer, topic, messages, where, group)


class _One(Shipment[SendResult]):
    """One message, through the coalescer (``explicit``: its own queue id, None: any)."""

    __slots__ = ("explicit", "out", "producer", "topic")

    def __init__(self, producer: Producer, topic: str, out: OutgoingMessage,
                 explicit: int | None) -> None:
        self.producer, self.topic, self.out, self.explicit = producer, topic, out, explicit

    @property
    def movable(self) -> bool:
        return self.explicit is None and (self.out.sharding_key is None
                                          or self.producer._ordered_failover)

    def what(self) -> str:
        return f"message {self.out.message_id}"

    def pick(self, route: TopicRoute, avoid: Collection[str]) -> MessageQueue:
        return self.producer._pick_one(route, self.out, self.explicit, avoid)

    def submit(self, route: TopicRoute, queue: MessageQueue) -> Awaitable[SendResult]:
        self.out.queue_id = queue.queue_id
        return self.producer._coalescer.submit(queue.address, self.topic, self.out)


class _Batch(Shipment[list[SendResult]]):
    """The messages of ``send_batch``: one request to one broker."""

    __slots__ = ("count", "explicit", "outs", "producer", "topic")

    def __init__(self, producer: Producer, topic: str, outs: list[OutgoingMessage]) -> None:
        self.producer, self.topic, self.outs = producer, topic, outs
        self.explicit = [m.queue_id for m in outs]  # their own queue ids (None: any)
        self.count = len(outs)

    @property
    def movable(self) -> bool:
        return not any(q is not None or m.sharding_key is not None
                       for q, m in zip(self.explicit, self.outs, strict=True))

    def what(self) -> str:
        return f"batch of {self.count} to {self.topic!r}"

    def pick(self, route: TopicRoute, avoid: Collection[str]) -> MessageQueue:
        return self.producer._batch_broker(route, self.outs, self.explicit, avoid)

    def submit(self, route: TopicRoute, broker: MessageQueue) -> Awaitable[list[SendResult]]:
        if not any(q.address == broker.address for q in route.write_queues()):
            # kept to its group (an answer that may have stored it), whose route has no
            # primary at this address now: the group is electing, which is waited out, not a
            # missing topic (the selector's TOPIC_NOT_FOUND, final)
            raise server_error(ErrorCode.NOT_PRIMARY, f"group {broker.broker_name} of "
                                                      f"{self.topic!r} has no primary at "
                                                      f"{broker.address} now")
        selector = self.producer._selector
        mine = [q for q in route.write_queues() if q.address == broker.address]
        for m, queue_id in zip(self.outs, self.explicit, strict=True):
            # a keyed message takes the queue send() gives its key (over the whole route,
            # which _batch_broker checked lands on this broker); others round robin over this
            # broker's queues (``select(route, broker=...)``, its queues listed once a batch)
            if m.sharding_key is not None or queue_id is not None:
                m.queue_id = selector.select(route, sharding_key=m.sharding_key,
                                             queue_id=queue_id).queue_id
            elif mine:
                m.queue_id = selector.round_robin_over(route.topic, mine).queue_id
            else:
                m.queue_id = selector.select(route, broker=broker.address).queue_id  # raises
        return self.producer._post(broker.address, self.topic, self.outs)


def _of_batch(topic: str, index: int, message: Message | Body) -> Message | Body:
    """``message`` of a batch to ``topic``, refused when it names another topic itself."""
    if isinstance(message, Message) and message.topic and message.topic != topic:
        raise ConfigurationError(f"send_batch: messages[{index}] has topic={message.topic!r} "
                                 f"but the batch goes to topic {topic!r}")
    return message


def _log_oneway_failure(future: asyncio.Future[SendResult]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("oneway send failed: %s", exc)
