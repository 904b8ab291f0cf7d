"""Who is connected over gRPC: one session per client id, with the settings it reported.

A RocketMQ 5 client identifies itself by the ``x-mq-client-id`` header on every call and reports
its settings (type, producer topics or consumer group and subscriptions) on its Telemetry stream.
``Sessions`` keeps what later calls need from them: Heartbeat registers the client with the
broker's group or producer registry from them, ReceiveMessage falls back on the long polling
time they name, and transaction checks go to a producer session's open Telemetry stream (its
``outbox``). Producers belong to one producer group per topic they publish (the group is the
topic's name), as in RocketMQ 5's proxy.

``server_settings`` builds the settings the broker answers with: the client's own, completed by
the server's side (body size limit, retry back-off, long polling, batch size).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidemq_server.broker.grpc.proto import ClientType, FilterType, duration_ms, pb, set_duration

log = logging.getLogger(__name__)

CONSUMER_TYPES = frozenset({ClientType.PUSH_CONSUMER, ClientType.SIMPLE_CONSUMER})

#: Consumer retry back-off (docs/api.md, ``POST /v1/groups/{group}/retry``): delay levels 3..
#: of the default table, in seconds.
RETRY_BACKOFF_S = (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600,
                   7200)
PRODUCER_MAX_ATTEMPTS = 3  # a send is tried this often by the client
PRODUCER_BACKOFF_MS = (10, 1000)  # exponential back-off between send attempts: initial, max
RECEIVE_BATCH_SIZE = 32  # messages a push consumer asks for per receive


@dataclass(frozen=True, slots=True)
class ServerSide:
    """The server's half of every client's settings."""

    max_body_bytes: int
    max_reconsume_times: int
    long_polling_ms: int  # push consumers long-poll this long per receive
    request_timeout_ms: int = 3_000
    # where clients export their OTLP metrics (a pb.Endpoints: the door itself, grpc/otlp.py);
    # None: Settings.metric says off
    metric_endpoints: Any = None


@dataclass(slots=True)
class Session:
    client_id: str
    last_seen: float
    client_type: int = ClientType.CLIENT_TYPE_UNSPECIFIED
    settings: Any = None  # the client's last Settings
    group: str | None = None  # consumer group
    topics: tuple[str, ...] = ()  # producer: the topics it publishes (= its producer groups)
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic → tag expression
    long_polling_ms: int | None = None  # a simple consumer's await duration
    outbox: asyncio.Queue[Any] | None = None  # commands for its open Telemetry stream
    pumps: list[asyncio.Task[None]] = field(default_factory=list)  # its check pumps (orphans)

    @property
    def is_consumer(self) -> bool:
        return self.client_type in CONSUMER_TYPES

    @property
    def is_producer(self) -> bool:
        return self.client_type == ClientType.PRODUCER


class Sessions:
    """client id → Session; sessions silent past ``expiry_s`` are dropped by ``expire``."""

    def __init__(self, expiry_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.expiry_s = expiry_s
        self.clock = clock
        self._by_id: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def all(self) -> list[Session]:
        return list(self._by_id.values())

    def get(self, client_id: str) -> Session | None:
        return self._by_id.get(client_id)

    def touch(self, client_id: str) -> Session:
        now = self.clock()
        session = self._by_id.get(client_id)
        if session is None:
            session = self._by_id[client_id] = Session(client_id, now)
        session.last_seen = now
        return session

    def apply_settings(self, session: Session, settings: Any) -> None:
        """Record the settings a client reported on its Telemetry stream (the session is
        registered again if it was dropped meanwhile: its stream is still open)."""
        self._by_id[session.client_id] = session
        session.last_seen = self.clock()
        session.settings = settings
        session.client_type = int(settings.client_type)
        if settings.HasField("publishing"):
            session.topics = tuple(dict.fromkeys(t.name for t in settings.publishing.topics
                                                 if t.name))
        if settings.HasField("subscription"):
            sub = settings.subscription
            if sub.HasField("group") and sub.group.name:
                session.group = sub.group.name
            session.subscriptions = {e.topic.name: tag_expression(e.expression)
                                     for e in sub.subscriptions if e.topic.name}
            if sub.HasField("long_polling_timeout"):
                session.long_polling_ms = duration_ms(sub.long_polling_timeout)

    def remove(self, client_id: str) -> Session | None:
        return self._by_id.pop(client_id, None)

    def expire(self) -> list[Session]:
        """Drop sessions silent past ``expiry_s`` that have no open stream."""
        oldest = self.clock() - self.expiry_s
        gone = [s for s in self._by_id.values() if s.last_seen < oldest and s.outbox is None]
        for session in gone:
            del self._by_id[session.client_id]
        return gone


def tag_expression(expression: Any) -> str:
    """A FilterExpression as tidemq's tag expression ("*" or "a || b")."""
    if expression.type == FilterType.SQL:
        return "*"  # a receive with an SQL filter is refused (consuming.tags_of)
    text = expression.expression.strip()
    return text or "*"


def server_settings(client: Any, side: ServerSide) -> Any:
    """The client's settings completed by the server's side, as answered on Telemetry."""
    out = pb.Settings()
    out.CopyFrom(client)
    set_duration(out.request_timeout, side.request_timeout_ms)
    policy = out.backoff_policy
    if client.HasField("publishing") or client.client_type == ClientType.PRODUCER:
        out.publishing.max_body_size = side.max_body_bytes
        out.publishing.validate_message_type = True
        policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        initial, longest = PRODUCER_BACKOFF_MS
        set_duration(policy.exponential_backoff.initial, initial)
        set_duration(policy.exponential_backoff.max, longest)
        policy.exponential_backoff.multiplier = 2.0
    elif client.HasField("subscription") or client.client_type in CONSUMER_TYPES:
        sub = out.subscription
        sub.fifo = False
        sub.receive_batch_size = RECEIVE_BATCH_SIZE
        if client.client_type != ClientType.SIMPLE_CONSUMER or not sub.HasField(
                "long_polling_timeout"):
            set_duration(sub.long_polling_timeout, side.long_polling_ms)
        policy.max_attempts = side.max_reconsume_times + 1
        policy.customized_backoff.ClearField("next")
        for seconds in RETRY_BACKOFF_S:
            policy.customized_backoff.next.add(seconds=seconds)
    if side.metric_endpoints is not None:
        out.metric.on = True
        out.metric.endpoints.CopyFrom(side.metric_endpoints)
    else:
        out.metric.on = False
        out.metric.ClearField("endpoints")
    return out
