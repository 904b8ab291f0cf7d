"""``TransactionProducer``: publish a message if and only if the local transaction commits.

    class Orders:
        async def execute_local_transaction(self, message, arg):
            await arg.save()                  # the application's own transaction
            return TransactionState.COMMIT
        async def check_local_transaction(self, message):
            return TransactionState.COMMIT if await exists(message.message_id) \\
                else TransactionState.ROLLBACK

    async with TransactionProducer("orders-tx", Orders(),
                                   nameservers=["http://127.0.0.1:9876"]) as p:
        result = await p.send(Message(b"order 42 created", topic="orders"), arg=order)

``send`` stores a half message (invisible), runs ``execute_local_transaction``, then ends the
transaction with its answer. When ``execute_local_transaction`` raises, the transaction is still
ended first — ROLLBACK for ``LocalTransactionFailed`` (the local transaction is known to be rolled
back), UNKNOWN for any other exception (the message is neither delivered nor lost: the broker's
checker asks the group later, any live instance, through ``check_local_transaction``) — and then
``send`` raises ``LocalTransactionError`` from that exception, so a failed local transaction can
never pass for a sent message. Concurrent sends share batch requests (``POST /v1/transactions``
with ``messages``, and the ends waiting meanwhile, or ``POST /v1/transactions/end``), and while
started the producer heartbeats and answers checks in batches (``_transaction_checks.py``).

Half messages spread over every broker group of the topic and fail over like
``Producer.send`` (``tidemq._fault``): retried until the retry policy's one deadline (30 s by
default) with the same message id, which the broker dedups, so a broker restart or a primary
election only delays ``send``. The end goes to the group that stored the half, at its current
primary (retried until the deadline, following a new primary: an end is idempotent), and a
check is answered to the broker that sent it — the group holding that half.

By default ``send`` returns once the broker acknowledged the end (``end_error`` says when it
could not). ``wait_for_end=False`` returns as soon as the end is queued, like RocketMQ's oneway
end-transaction: faster, and a lost end is resolved by a check all the same.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Collection, Mapping, Sequence
from typing import Any, Protocol, Self
from urllib.parse import urlencode

from tidemq import _hooks
from tidemq import _validate as V
from tidemq._auth import Credentials
from tidemq._batch import encode_halves
from tidemq._constants import (
    CLOSE_TIMEOUT_S,
    PRODUCER_BROKER_BACKOFF_MAX_S,
    REQUEST_TIMEOUT_S,
    ROUTE_REFRESH_INTERVAL_S,
)
from tidemq._exceptions import (
    ClientClosedError,
    ConfigurationError,
    LocalTransactionError,
    LocalTransactionFailed,
    TidemqError,
    TopicNotFoundError,
    TransportError,
    UnexpectedResponseError,
    server_error,
)
from tidemq._http import DEFAULT_RETRY, NO_RETRY, RetryPolicy, Transport, url
from tidemq._message import Message, has_delay, to_outgoing
from tidemq._moved import unless_moved
from tidemq._routes import MessageQueue, TopicRoute
from tidemq._selector import QueueSelector
from tidemq._send import Body, Sender, Shipment
from tidemq._tasks import finish_tasks
from tidemq._transaction_batch import EndItem, HalfGroup, TxBatcher
from tidemq._transaction_checks import CheckPoller
from tidemq._transaction_types import TransactionSendResult, TransactionState
from tidemq.protocol import OutgoingMessage, ReceivedMessage
from tidemq.protocol.records.v2 import CONTENT_BATCH

log = logging.getLogger("tidemq.transactions")

PRODUCER_HEARTBEAT_S = 10.0  # heartbeat period; the broker forgets a producer silent 30 s
CHECK_WAIT_MS = 20_000  # one long poll for checks
CHECK_MAX = 256  # checks per poll


class TransactionListener(Protocol):
    """The application's side of a transactional producer."""

    async def execute_local_transaction(self, message: Message, arg: Any
                                        ) -> TransactionState: ...

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState: ...


class TransactionProducer(Sender):
    """Transactional sends for one producer group; an async context manager.

    ``nameservers`` / ``broker_url`` are given as to ``Producer`` (neither:
    ``TIDEMQ_NAMESERVER_URL``); ``send`` checks its arguments as ``Producer.send`` does."""

    def __init__(
        self,
        group: str,
        listener: TransactionListener,
        *,
        nameservers: str | Sequence[str] | None = None,
        broker_url: str | None = None,
        linger_ms: float = 1.0,
        max_batch: int = 256,
        max_in_flight: int = 32,
        check_immunity_s: float | None = None,
        heartbeat_interval_s: float = PRODUCER_HEARTBEAT_S,
        check_wait_ms: int = CHECK_WAIT_MS,
        check_max: int = CHECK_MAX,
        check_concurrency: int = 64,
        wait_for_end: bool = True,
        client_id: str | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        route_refresh_s: float = ROUTE_REFRESH_INTERVAL_S,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
        transport: Transport | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        V.group_name(group, "producer group")
        for name, value in (("max_batch", max_batch), ("max_in_flight", max_in_flight),
                            ("check_wait_ms", check_wait_ms), ("check_max", check_max),
                            ("check_concurrency", check_concurrency)):
            V.integer(value, name)
        if not 1 <= max_batch <= 1024 or max_in_flight < 1 or linger_ms < 0:
            raise ConfigurationError("max_batch must be 1-1024, max_in_flight >= 1, "
                                     "linger_ms >= 0")
        self.group = group
        self.listener = listener
        self.client_id = client_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
        self.check_immunity_s = check_immunity_s
        self.wait_for_end = wait_for_end
        self._connect(nameservers=nameservers, broker_url=broker_url,
                      request_timeout_s=request_timeout_s, retry=retry,
                      route_refresh_s=route_refresh_s, transport=transport,
                      credentials=credentials,
                      backoff_max_s=PRODUCER_BROKER_BACKOFF_MAX_S)
        self._selector = QueueSelector()
        self._batcher = TxBatcher(self._post, linger_s=linger_ms / 1000, max_items=max_batch,
                                  max_in_flight=max_in_flight)
        self._checks = CheckPoller(
            self._http, group, self.client_id, self._check,
            nameservers=self._endpoints.nameservers, broker_url=self._endpoints.broker_url,
            heartbeat_s=heartbeat_interval_s, wait_ms=check_wait_ms,
            max_checks=check_max, concurrency=check_concurrency)
        self._close_timeout_s = close_timeout_s
        self._valid_topics: set[str] = set()
        self._started = False
        self._closed = False
        self._txid_prefix = uuid.uuid4().hex[:16]  # transaction ids of half batches
        self._txid_seq = itertools.count(1)
        self._ending: set[asyncio.Future[str]] = set()  # ends nobody awaits (wait_for_end=False)
        # broker address → a topic last ended through it: whose route tells the address's group,
        # so an end left unanswered by a silent primary follows its successor (``_moved``)
        self._topic_at: dict[str, str] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Self:
        """Start heartbeats, the check poller and route refresh."""
        if self._closed:
            raise ClientClosedError("the transaction producer is closed")
        if not self._started:
            self._started = True
            self._routes.start()
            self._checks.start()
        return self

    async def _shutdown(self) -> None:
        """On ``close``: finish queued sends and ends (bounded), stop answering checks, leave
        the group."""
        deadline = time.monotonic() + self._close_timeout_s
        await finish_tasks(self._ending, self._close_timeout_s, TidemqError)  # unawaited ends
        await self._batcher.drain(max(0.0, deadline - time.monotonic()))
        await self._checks.close(self._close_timeout_s)

    @property
    def checks_answered(self) -> int:
        return self._checks.answered

    # -- sending -----------------------------------------------------------------------------

    async def send(
        self,
        message: Message | Body,
        arg: Any = None,
        *,
        topic: str | None = None,
        tag: str | None = None,
        keys: Sequence[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        message_id: str | None = None,
        check_immunity_s: float | None = None,
    ) -> TransactionSendResult:
        """Half message → ``execute_local_transaction(message, arg)`` → end.

        Raises a ``TidemqError`` when the half message could not be stored (then nothing
        happened), and ``LocalTransactionError`` (from the original exception) when
        ``execute_local_transaction`` raised — after ending the transaction with ROLLBACK or
        UNKNOWN (see the module docstring). Otherwise the result says how it was ended; a
        failed end is reported in ``end_error`` (a check resolves it)."""
        if self._closed:
            raise ClientClosedError("the transaction producer is closed")
        overrides = dict(topic=topic, tag=tag, keys=keys, properties=properties,
                         sharding_key=sharding_key, message_id=message_id)
        # a copy of a Message: the message id is filled in below
        topic, msg = self._message(message, overrides, copy=True)
        out = to_outgoing(msg)
        msg.message_id = out.message_id
        await self.start()
        immunity = check_immunity_s if check_immunity_s is not None else self.check_immunity_s
        txid, queue = await self._store_half(topic, immunity, out)
        state, error = await self._execute(msg, arg, txid)
        end_error: TidemqError | None = None
        # the end (and any check answer) goes to the group holding the half message
        ending = self._end(topic, queue, (txid, state.value, False))
        if not self.wait_for_end:
            task = asyncio.ensure_future(ending)
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
            task.add_done_callback(_log_end_failure)
        else:
            try:
                await ending
            except TidemqError as exc:
                end_error = exc
                log.warning("transaction %s: ending with %s failed: %s (the broker will check "
                            "it)", txid, state.value, exc)
        assert out.message_id is not None
        result = TransactionSendResult(out.message_id, txid, topic, state, queue.address,
                                       error, end_error, queue.broker_name)
        if error is not None:
            raise LocalTransactionError(result) from error
        return result

    def _store_half(self, topic: str, immunity: float | None, out: OutgoingMessage
                    ) -> Awaitable[tuple[str, MessageQueue]]:
        """Store the half message on a group, failing over like ``Producer.send`` (the rule is
        in ``tidemq._fault``); the transaction id and the queue that holds it."""
        return self._send_over(topic, _Half(self, topic, immunity, out),
                               started=time.monotonic())

    async def _end(self, topic: str, queue: MessageQueue, item: EndItem) -> str:
        """End a transaction at the group holding its half (``queue``'s), at that group's
        current primary: an end is idempotent, so it is retried (``_retry_call``) until the
        policy's deadline, following a new primary as soon as it is named."""
        def end_at(route: TopicRoute) -> Awaitable[str]:
            address = self._retarget(route, queue).address
            self._topic_at[address] = topic
            return self._batcher.end(address, item, awaited=self.wait_for_end)

        return await self._retry_call(topic, end_at, what=f"end of transaction {item[0]}",
                                      group=queue.broker_name)

    async def _execute(self, message: Message, arg: Any, txid: str
                       ) -> tuple[TransactionState, BaseException | None]:
        try:
            state = await self.listener.execute_local_transaction(message, arg)
            return (state if type(state) is TransactionState else TransactionState(state)), None
        except LocalTransactionFailed as exc:
            log.info("transaction %s: local transaction failed and rolled back (%s); rolling "
                     "back the message", txid, exc.__cause__ or exc)
            return TransactionState.ROLLBACK, exc.__cause__ or exc
        except Exception as exc:
            log.warning("transaction %s: execute_local_transaction raised %s: %s; ending as "
                        "UNKNOWN (the broker will check it)", txid, type(exc).__name__, exc)
            return TransactionState.UNKNOWN, exc

    async def _check(self, message: ReceivedMessage) -> str:
        check = self.listener.check_local_transaction
        if _hooks.tracer is not None:
            return TransactionState(await _hooks.tracer.check(check, message, self.group)).value
        return TransactionState(await check(message)).value

    # -- requests ----------------------------------------------------------------------------

    async def _post(self, broker: str, group: HalfGroup | None,
                    messages: list[OutgoingMessage], ends: list[EndItem],
                    ) -> tuple[list[str | BaseException], list[str | BaseException]]:
        """Half messages (with any waiting ends) to ``POST /v1/transactions``, or ends alone to
        ``POST /v1/transactions/end``; the transaction ids and the end states, in order."""
        wire_ends = [{"transaction_id": t, "action": a, "from_check": c} for t, a, c in ends]
        if group is None:
            return [], self._end_results(await self._post_ends(broker, wire_ends), broker)
        topic, immunity = group
        if not any(has_delay(m) for m in messages):  # a half batch has no delay fields
            return await self._post_batch(broker, topic, immunity, messages, wire_ends)
        body: dict[str, Any] = {"producer_group": self.group, "topic": topic,
                                "messages": [m.to_wire(binary=True) for m in messages]}
        if immunity is not None:
            body["check_immunity_s"] = immunity
        if wire_ends:
            body["ends"] = wire_ends
        answer = await self._half_answer(unless_moved(self._routes, topic, broker, self._http.call(
            "POST", url(broker, "v1", "transactions"), body=body, binary=True, retry=NO_RETRY)),
            topic)
        return self._txids_of(answer, broker), \
            self._end_results(answer, broker) if wire_ends else []

    async def _post_batch(self, broker: str, topic: str, immunity: float | None,
                          messages: list[OutgoingMessage], wire_ends: list[dict[str, Any]],
                          ) -> tuple[list[str | BaseException], list[str | BaseException]]:
        """Half messages as one batch (record format v2, transaction ids made here); ends
        waiting meanwhile go beside it in their own request."""
        txids = [f"{self._txid_prefix}{next(self._txid_seq):016x}" for _ in messages]
        content = encode_halves(self.group, topic, immunity, messages, txids,
                                int(time.time() * 1000))
        target = url(broker, "v1", "transactions") + "?" + urlencode(
            {"producer_group": self.group, "topic": topic})
        halves = unless_moved(self._routes, topic, broker, self._http.call_raw(
            "POST", target, content, CONTENT_BATCH, retry=NO_RETRY))
        if not wire_ends:
            answer = await self._half_answer(halves, topic)
            return self._txids_of(answer, broker, txids), []
        ends = self._post_ends(broker, wire_ends, topic)
        got: tuple[Any, Any] = await asyncio.gather(self._half_answer(halves, topic), ends,
                                                    return_exceptions=True)
        answer, ended = got
        if isinstance(answer, BaseException):
            raise answer  # the batcher sends the ends again on their own (an end is idempotent)
        states: list[str | BaseException] = [ended] * len(wire_ends) \
            if isinstance(ended, BaseException) else self._end_results(ended, broker)
        return self._txids_of(answer, broker, txids), states

    async def _post_ends(self, broker: str, wire_ends: list[dict[str, Any]],
                         topic: str | None = None) -> Any:
        """``POST /v1/transactions/end``, given up (``TransportError``) once the nameservers
        name another primary of ``broker``'s group while it is unanswered: the retry of
        ``_end`` takes it there (an end is idempotent)."""
        request = self._http.call("POST", url(broker, "v1", "transactions", "end"),
                                  body={"producer_group": self.group, "ends": wire_ends},
                                  retry=NO_RETRY)
        topic = topic or self._topic_at.get(broker)
        return await (unless_moved(self._routes, topic, broker, request) if topic else request)

    async def _half_answer(self, request: Awaitable[Any], topic: str) -> Any:
        try:  # no retries here: _store_half decides where a failed half goes
            return await request
        except (TopicNotFoundError, TransportError):
            self._routes.invalidate(topic)
            raise

    @staticmethod
    def _txids_of(answer: Any, broker: str, sent: list[str] | None = None,
                  ) -> list[str | BaseException]:
        """The transaction ids of an answer: per message, or ``{stored: n}`` when the ids
        ``sent`` in a batch all stand."""
        try:
            if sent is not None and "stored" in answer:
                if answer["stored"] != len(sent):
                    raise TypeError(f"{answer['stored']} stored of {len(sent)} sent")
                return list(sent)
            return [str(t["transaction_id"]) for t in answer["transactions"]]
        except (KeyError, TypeError) as exc:
            raise UnexpectedResponseError(f"malformed half answer from {broker}: {exc!r}") \
                from exc

    @staticmethod
    def _end_results(answer: Any, broker: str) -> list[str | BaseException]:
        out: list[str | BaseException] = []
        try:
            for r in answer["results"]:
                out.append(server_error(r["code"], str(r.get("message", ""))) if r.get("code")
                           else str(r["state"]))
        except (KeyError, TypeError) as exc:
            raise UnexpectedResponseError(f"malformed end answer from {broker}: {exc!r}") \
                from exc
        return out


class _Half(Shipment[str]):
    """A half message, through the transaction batcher: its answer is the transaction id."""

    __slots__ = ("explicit", "immunity", "out", "producer", "topic")

    def __init__(self, producer: TransactionProducer, topic: str, immunity: float | None,
                 out: OutgoingMessage) -> None:
        self.producer, self.topic, self.immunity, self.out = producer, topic, immunity, out
        self.explicit = out.queue_id  # its own queue id (None: any)

    @property
    def movable(self) -> bool:
        return self.explicit is None and self.out.sharding_key is None

    def what(self) -> str:
        return f"half message {self.out.message_id}"

    def pick(self, route: TopicRoute, avoid: Collection[str]) -> MessageQueue:
        return self.producer._selector.select(
            route, sharding_key=self.out.sharding_key, queue_id=self.explicit,
            health=self.producer._health, avoid=avoid)

    def submit(self, route: TopicRoute, queue: MessageQueue) -> Awaitable[str]:
        self.out.queue_id = queue.queue_id
        self.producer._checks.add_broker(queue.address)
        return self.producer._batcher.half(queue.address, (self.topic, self.immunity), self.out)


def _log_end_failure(future: asyncio.Future[str]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.warning("ending a transaction failed: %s (the broker will check it)", exc)
