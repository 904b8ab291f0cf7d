"""``PushConsumer``: a group shares the queues of its subscribed topics; messages go to a handler.

    async def handle(message: ReceivedMessage) -> ConsumeResult:
        print(message.topic, message.tag, message.text)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer("billing", nameservers=["http://127.0.0.1:9876"], handler=handle)
    consumer.subscribe("orders", "created || paid")
    async with consumer:
        await stop_event.wait()

Clustering (default): every ``heartbeat_interval_s`` the consumer heartbeats each broker of its
topics, gets the group's sorted members and takes its share of the sorted queue list
(``allocate_averagely``) — queues of every subscribed topic plus ``%RETRY%<group>`` (subscribed
automatically once it exists). Revoked queues stop and commit first; added queues start at the
group's committed offset, else at the queue's first offset (``consume_from="first"``) or its end
(``"last"``). Offsets are committed every ``offset_commit_interval_s``, on rebalance and on close;
a crash redelivers at most that much (at-least-once). All members of a group must subscribe to
the same topics, as in RocketMQ.

The queues are those of every broker group serving the topics (a ``MessageQueue`` names its
broker), and offsets are committed to the broker of each queue: per (group, topic, broker,
queue). A broker that cannot be reached backs off (``BrokerHealth``, shared by heartbeats, pulls
and commits, logged once each way): its queues pause and resume at their offsets when it is
back, and the others go on meanwhile. A queue dropped from the routes is released; when it
returns it starts again at the group's committed offset.

Broadcasting: every instance consumes every queue and keeps its offsets **in memory only**:
committing them under the shared group would make instances overwrite one another's progress.
A restarted broadcasting instance therefore starts again from ``consume_from``. Failed messages
are retried locally and then dropped (there is no per-instance retry topic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Literal, Self

from tidemq import _constants as C
from tidemq import _validate as V
from tidemq._allocate import allocate_averagely
from tidemq._auth import Credentials
from tidemq._broker_api import BrokerApi
from tidemq._broker_puller import BrokerPuller
from tidemq._client import Client
from tidemq._exceptions import ConfigurationError, TidemqError, TopicNotFoundError
from tidemq._handler_pool import HandlerPool
from tidemq._http import DEFAULT_RETRY, RetryPolicy, Transport
from tidemq._message import new_client_id
from tidemq._offsets import OffsetTracker
from tidemq._puller import Handler, PullerSettings, QueuePuller, broker_down
from tidemq._routes import MessageQueue
from tidemq._tags import TagExpression
from tidemq._tasks import cancel_tasks
from tidemq.protocol import retry_topic

log = logging.getLogger("tidemq.consumer")

Mode = Literal["clustering", "broadcasting"]
ConsumeFrom = Literal["first", "last"]

# heartbeats, commits, leave: retried within 5 s (s); a failed one is made again next period
_BACKGROUND_RETRY = RetryPolicy(deadline_s=5.0)


class PushConsumer(Client):
    """Pulls the queues allocated to this instance and calls ``handler`` for each message.

    ``nameservers`` / ``broker_url`` are given as to ``Producer`` (neither:
    ``TIDEMQ_NAMESERVER_URL``). The group, the topics and the tag expressions are checked by the
    broker's rules when given (``ConfigurationError``), not by a failing heartbeat later."""

    def __init__(
        self,
        group: str,
        *,
        handler: Handler,
        nameservers: str | Sequence[str] | None = None,
        broker_url: str | None = None,
        subscriptions: Mapping[str, str] | None = None,
        mode: Mode = "clustering",
        orderly: bool = False,
        max_concurrency: int = 16,
        pull_batch: int = 32,
        pull_wait_ms: int = C.PULL_WAIT_MS,
        offset_commit_interval_s: float = C.OFFSET_COMMIT_INTERVAL_S,
        heartbeat_interval_s: float = C.CONSUMER_HEARTBEAT_INTERVAL_S,
        consume_from: ConsumeFrom = "first",
        max_reconsume_times: int = C.MAX_RECONSUME_TIMES,
        consume_timeout_s: float | None = C.CONSUME_TIMEOUT_S,
        orderly_retry_pause_s: float = C.ORDERLY_RETRY_PAUSE_S,
        local_retry_pause_s: float = C.LOCAL_RETRY_PAUSE_S,
        close_timeout_s: float = C.CLOSE_TIMEOUT_S,
        client_id: str | None = None,
        request_timeout_s: float = C.REQUEST_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        route_refresh_s: float = C.ROUTE_REFRESH_INTERVAL_S,
        transport: Transport | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        V.group_name(group)
        for name, value in (("max_concurrency", max_concurrency), ("pull_batch", pull_batch),
                            ("pull_wait_ms", pull_wait_ms),
                            ("max_reconsume_times", max_reconsume_times)):
            V.integer(value, name)
        if mode not in ("clustering", "broadcasting"):
            raise ConfigurationError(f"mode must be 'clustering' or 'broadcasting', got {mode!r}")
        if consume_from not in ("first", "last"):
            raise ConfigurationError(
                f"consume_from must be 'first' or 'last', got {consume_from!r}")
        if max_concurrency < 1 or not 1 <= pull_batch <= 1024:
            raise ConfigurationError("max_concurrency must be >= 1 and pull_batch 1-1024")
        if not 0 <= pull_wait_ms <= C.LONG_POLL_MAX_WAIT_MS:
            raise ConfigurationError(f"pull_wait_ms must be 0-{C.LONG_POLL_MAX_WAIT_MS}")
        self.group = group
        self.mode: Mode = mode
        self.client_id = client_id or new_client_id()
        self._handler = handler
        self._consume_from = consume_from
        self._commit_interval_s = offset_commit_interval_s
        self._heartbeat_interval_s = heartbeat_interval_s
        self._close_timeout_s = close_timeout_s
        self._connect(nameservers=nameservers, broker_url=broker_url,
                      request_timeout_s=request_timeout_s, retry=retry,
                      route_refresh_s=route_refresh_s, transport=transport,
                      credentials=credentials,
                      backoff_max_s=C.CONSUMER_BROKER_BACKOFF_MAX_S)
        self._api = BrokerApi(self._http)
        self._settings = PullerSettings(
            group=group, clustering=mode == "clustering", orderly=orderly,
            pull_batch=pull_batch, pull_wait_ms=pull_wait_ms,
            max_reconsume_times=max_reconsume_times, orderly_retry_pause_s=orderly_retry_pause_s,
            local_retry_pause_s=local_retry_pause_s, consume_timeout_s=consume_timeout_s)
        self._permits = asyncio.Semaphore(max_concurrency)
        self._pool = HandlerPool(self._permits, max_concurrency, consume_timeout_s)
        self._subscriptions: dict[str, TagExpression] = {}
        self._pullers: dict[MessageQueue, QueuePuller] = {}
        self._broker_pullers: dict[str, BrokerPuller] = {}  # one shared long poll per broker
        self._local_offsets: dict[MessageQueue, int] = {}  # broadcasting: the only offset store
        self._brokers: set[str] = set()  # every broker heartbeated, to leave on close
        self._members: list[str] = []
        self._last_heartbeat_ok = time.monotonic()
        self._rebalance_lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = self._closed = False
        for topic, expression in (subscriptions or {}).items():
            self.subscribe(topic, expression)

    # -- public ------------------------------------------------------------------------------

    def subscribe(self, topic: str, tag_expression: str = "*") -> None:
        """Consume ``topic`` messages matching ``tag_expression`` (``*`` or ``a || b``).

        A topic name or tag expression the broker would refuse raises ``ConfigurationError``
        here, not a failing heartbeat later."""
        V.topic_name(topic)
        expression = TagExpression.parse(V.tag_expression(tag_expression))
        self._subscriptions[topic] = expression
        self._wakeup.set()

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)
        self._wakeup.set()

    @property
    def subscriptions(self) -> dict[str, str]:
        """Topic → tag expression as sent in heartbeats (with the retry topic in clustering)."""
        subs = {topic: str(expr) for topic, expr in self._subscriptions.items()}
        if self._settings.clustering and subs:
            subs[retry_topic(self.group)] = "*"
        return subs

    @property
    def assignment(self) -> list[MessageQueue]:
        """The queues this instance consumes now, sorted."""
        return sorted(self._pullers)

    @property
    def members(self) -> list[str]:
        """The group's members at the last heartbeat, sorted."""
        return list(self._members)

    async def start(self) -> Self:
        """Join the group, take this instance's queues and start consuming."""
        if self._closed:
            raise ConfigurationError("a closed consumer cannot be started again")
        if not self._started:
            if not self._subscriptions:
                raise ConfigurationError("subscribe(topic, ...) before starting the consumer")
            self._started = True
            self._routes.start()
            self._wakeup.clear()
            await self.rebalance()
            self._tasks = [
                asyncio.create_task(self._heartbeat_loop(), name="tidemq-heartbeat"),
                asyncio.create_task(self._commit_loop(), name="tidemq-offset-commit"),
            ]
        return self

    async def _shutdown(self) -> None:
        """On ``close``: stop pulling, wait (bounded) for handlers, commit offsets and leave the
        group."""
        await cancel_tasks(self._tasks)
        async with self._rebalance_lock:
            pullers = list(self._pullers.values())
            await asyncio.gather(*(p.stop(self._close_timeout_s) for p in pullers))
            await asyncio.gather(*(b.stop() for b in self._broker_pullers.values()))
            self._broker_pullers.clear()
            await self._pool.close()
            await self._commit(pullers)
            self._pullers.clear()
        await asyncio.gather(*(self._leave(b) for b in sorted(self._brokers)
                               if self._health.usable(b)))  # a dead one expires us anyway
        log.info("consumer %s of group %s closed", self.client_id, self.group)

    async def commit_offsets(self) -> None:
        """Commit every queue's committable offset now (also runs periodically and on close)."""
        await self._commit(list(self._pullers.values()))

    async def rebalance(self) -> None:
        """Heartbeat and re-allocate queues now (also runs every ``heartbeat_interval_s``)."""
        async with self._rebalance_lock:
            if self._closed:
                return
            queues, brokers = await self._subscribed_queues()
            if not await self._heartbeat(brokers):
                if time.monotonic() - self._last_heartbeat_ok > C.CONSUMER_EXPIRY_S:
                    log.warning("no heartbeat reached a broker for %.0fs: the group has dropped "
                                "this consumer, releasing its queues", C.CONSUMER_EXPIRY_S)
                    await self._apply([])
                return
            if self._settings.clustering:
                target = allocate_averagely(self.client_id, self._members, queues)
            else:
                target = queues
            await self._apply(target)

    # -- rebalance ---------------------------------------------------------------------------

    async def _subscribed_queues(self) -> tuple[list[MessageQueue], set[str]]:
        """The sorted readable queues of every subscribed topic and the brokers serving them.

        The topics are looked up at once. The group's retry topic exists only once a message
        of the group has failed, so it is asked for once, without retries, and its absence is
        not worth a warning: it must not hold up the consumer's start."""
        own_retry = retry_topic(self.group)
        topics = list(self.subscriptions)
        routes = await asyncio.gather(*(self._routes.get(t, patient=t != own_retry)
                                        for t in topics), return_exceptions=True)
        queues: list[MessageQueue] = []
        for topic, route in zip(topics, routes, strict=True):
            if isinstance(route, BaseException):
                if not isinstance(route, TidemqError):
                    raise route
                if topic == own_retry:
                    log.debug("retry topic %s is not served yet: %s", topic, route)
                elif isinstance(route, TopicNotFoundError):
                    log.warning("subscribed topic %r does not exist", topic)
                else:
                    log.warning("no route for %r, its queues are skipped this round: %s",
                                topic, route)
                continue
            queues.extend(route.read_queues())
        brokers = {q.address for q in queues}
        if not brokers and self._routes.direct_broker:
            brokers.add(self._routes.direct_broker)
        return sorted(queues), brokers

    async def _heartbeat(self, brokers: set[str]) -> bool:
        """Heartbeat every broker; the members are the union of their answers (plus us)."""
        targets = sorted(b for b in brokers if self._health.usable(b))  # skip those backing off
        if not targets:
            return False
        mode = self.mode
        subs = self.subscriptions
        answers = await asyncio.gather(*(
            self._api.heartbeat(b, self.group, client_id=self.client_id, subscriptions=subs,
                                mode=mode, retry=_BACKGROUND_RETRY)
            for b in targets), return_exceptions=True)
        members = {self.client_id}
        ok = False
        for broker, answer in zip(targets, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, TidemqError):
                    raise answer
                self._failed(broker, "heartbeat", answer)
                continue
            self._succeeded(broker)
            ok = True
            self._brokers.add(broker)
            members.update(answer)
        if ok:
            self._last_heartbeat_ok = time.monotonic()
            new = sorted(members)
            if new != self._members:
                log.info("group %s members: %s", self.group, ", ".join(new))
            self._members = new
        return ok

    def _failed(self, broker: str, what: str, exc: TidemqError) -> None:
        """A request to ``broker`` failed: back off if the broker is down, log once."""
        if not broker_down(exc):
            log.warning("%s to %s failed: %s", what, broker, exc)
        elif self._health.failed(broker):
            log.warning("broker %s unreachable (%s failed: %s): its queues pause until it is "
                        "back", broker, what, exc)
        else:
            log.debug("%s to %s failed again: %s", what, broker, exc)

    def _succeeded(self, broker: str) -> None:
        if self._health and self._health.succeeded(broker):
            log.info("broker %s is reachable again", broker)

    async def _apply(self, target: Sequence[MessageQueue]) -> None:
        wanted = set(target)
        revoked = [p for q, p in self._pullers.items() if q not in wanted]
        added = [q for q in target if q not in self._pullers]
        if revoked:
            drain = min(self._close_timeout_s, C.REBALANCE_DRAIN_S)
            await asyncio.gather(*(p.stop(drain) for p in revoked))
            await self._commit(revoked)
            for p in revoked:
                del self._pullers[p.queue]
            log.info("released %d queue(s): %s", len(revoked),
                     ", ".join(str(p.queue) for p in revoked))
        if added:
            starts = await self._start_offsets(added)
            for queue in added:
                if queue not in starts:
                    continue  # its offset is unknown this round: try again at the next one
                puller = QueuePuller(queue, OffsetTracker(starts[queue]),
                                     self._subscriptions.get(queue.topic, TagExpression(None)),
                                     self._api, self._handler, self._permits, self._settings,
                                     on_route_error=self._routes.invalidate,
                                     health=self._health, pool=self._pool)
                self._pullers[queue] = puller
                self._start_puller(puller)
            if starts:
                log.info("took %d queue(s): %s", len(starts),
                         ", ".join(f"{q}@{o}" for q, o in sorted(starts.items())))

    def _start_puller(self, puller: QueuePuller) -> None:
        """Concurrent mode: the queue joins its broker's shared long poll; ordered mode (one
        message at a time per queue) keeps a pull loop per queue."""
        if self._settings.orderly:
            puller.start()
            return
        address = puller.queue.address
        shared = self._broker_pullers.get(address)
        if shared is None:
            shared = self._broker_pullers[address] = BrokerPuller(
                address, self._api, self._settings, self._health, self._routes.invalidate)
        shared.add(puller)

    async def _start_offsets(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        by_topic: dict[tuple[str, str], list[MessageQueue]] = defaultdict(list)
        for q in queues:
            by_topic[(q.address, q.topic)].append(q)
        starts: dict[MessageQueue, int] = {}
        for (broker, topic), group in by_topic.items():
            if not self._health.usable(broker):
                continue  # backing off: its queues start at a later rebalance
            try:
                if self._settings.clustering:
                    committed = await self._api.committed_offsets(broker, self.group, topic)
                else:
                    committed = {q.queue_id: self._local_offsets[q] for q in group
                                 if q in self._local_offsets}
                bounds = {}
                if any(q.queue_id not in committed for q in group):
                    bounds = await self._api.topic_offsets(broker, topic)
            except TidemqError as exc:
                self._failed(broker, f"reading the offsets of {topic}", exc)
                continue
            for q in group:
                if q.queue_id in committed:
                    starts[q] = committed[q.queue_id]
                elif q.queue_id in bounds:
                    b = bounds[q.queue_id]
                    starts[q] = b.max_offset if self._consume_from == "last" else b.min_offset
                else:
                    starts[q] = 0  # not in the broker's answer yet: the pull reads from min
        return starts

    # -- offsets and background loops ------------------------------------------------------

    async def _commit(self, pullers: Sequence[QueuePuller]) -> None:
        due: dict[str, list[tuple[QueuePuller, int]]] = defaultdict(list)
        for p in pullers:
            offset = p.tracker.commit_due()
            if offset is not None:
                due[p.queue.address].append((p, offset))
        if not self._settings.clustering:
            for items in due.values():
                for p, offset in items:
                    self._local_offsets[p.queue] = p.tracker.committed = offset
            return
        for broker, items in due.items():
            if not self._health.usable(broker):
                continue  # backing off: the offsets stay due until it is back
            try:
                await self._api.commit_offsets(
                    broker, self.group, [(p.queue.topic, p.queue.queue_id, o) for p, o in items],
                    retry=_BACKGROUND_RETRY)
            except TidemqError as exc:
                self._failed(broker, f"committing {len(items)} offset(s)", exc)
                continue
            self._succeeded(broker)
            for p, offset in items:
                p.tracker.committed = offset

    async def _leave(self, broker: str) -> None:
        try:
            await self._api.leave(broker, self.group, self.client_id, retry=_BACKGROUND_RETRY)
        except TidemqError as exc:
            log.warning("leaving group %s on %s failed (it expires in %.0fs): %s", self.group,
                        broker, C.CONSUMER_EXPIRY_S, exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self._heartbeat_interval_s)
            self._wakeup.clear()
            try:
                await self.rebalance()
            except Exception:
                log.exception("rebalance of group %s failed", self.group)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self._commit_interval_s)
            try:
                await self.commit_offsets()
            except Exception:
                log.exception("offset commit of group %s failed", self.group)
