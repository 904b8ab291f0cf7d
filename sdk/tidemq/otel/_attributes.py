"""Span names, kinds and attributes: the OpenTelemetry messaging conventions (semantic
conventions 1.4x, ``messaging.*`` and ``messaging.rocketmq.*``), and tidemq's own few.

Names are spelled out here rather than imported from ``opentelemetry.semconv._incubating``
(a private module path of a beta package).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from tidemq.protocol import ReceivedMessage

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
SYSTEM = "rocketmq"  # tidemq speaks RocketMQ's model; the conventions have no "tidemq"

# --- messaging.* ------------------------------------------------------------------------------
MESSAGING_SYSTEM = "messaging.system"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"  # create, send, receive, process, settle
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"  # the queue id
MESSAGE_ID = "messaging.message.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
BATCH_COUNT = "messaging.batch.message_count"
CLIENT_ID = "messaging.client.id"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"  # the broker that answered (host)
SERVER_PORT = "server.port"

# --- messaging.rocketmq.* -----------------------------------------------------------------------
MESSAGE_TYPE = "messaging.rocketmq.message.type"  # normal, fifo, delay, transaction
MESSAGE_TAG = "messaging.rocketmq.message.tag"
MESSAGE_KEYS = "messaging.rocketmq.message.keys"
DELIVERY_TIMESTAMP = "messaging.rocketmq.message.delivery_timestamp"  # epoch ms
DELAY_TIME_LEVEL = "messaging.rocketmq.message.delay_time_level"
MESSAGE_GROUP = "messaging.rocketmq.message.group"  # a FIFO message's sharding key
CONSUMPTION_MODEL = "messaging.rocketmq.consumption_model"  # clustering, broadcasting

# --- tidemq.* (no convention covers them) -------------------------------------------------------
TRANSACTION_ID = "tidemq.transaction.id"
LOCAL_STATE = "tidemq.transaction.local_state"  # what execute_local_transaction answered
CHECK_ANSWER = "tidemq.transaction.check_answer"  # what check_local_transaction answered
PRODUCER_GROUP = "tidemq.producer.group"
SETTLE_ACTION = "tidemq.settle.action"  # ack, retry
SETTLE_DESTINATION = "tidemq.settle.destination"  # %RETRY%group or %DLQ%group
RECONSUME_TIMES = "tidemq.message.reconsume_times"


def operation(name: str, kind: str) -> dict[str, Any]:
    """The attributes every span has: system, operation name and type."""
    return {MESSAGING_SYSTEM: SYSTEM, OPERATION_NAME: name, OPERATION_TYPE: kind}


class Shapes:
    """Span names and creation-time attributes, made once per shape and shared by every span
    of that shape (never modify one): the attributes the conventions list as those a sampler
    may look at (system, operation, destination, partition, consumer group), which are the
    same for every message of a topic. A span's per-message attributes (``outgoing``,
    ``about``) are built only when the sampler made it a recording span."""

    LIMIT = 4096  # shapes kept per kind; an application with more topics than this rebuilds

    def __init__(self) -> None:
        self._send: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._process: dict[tuple[str, int, str, bool], tuple[str, dict[str, Any]]] = {}

    def send(self, topic: str, message_type: str) -> tuple[str, dict[str, Any]]:
        """``send {topic}`` (one message of ``message_type``, or a batch)."""
        shape = self._send.get((topic, message_type))
        if shape is None:
            attrs = operation("send", "send")
            attrs[DESTINATION] = topic
            if message_type:
                attrs[MESSAGE_TYPE] = message_type
            shape = _keep(self._send, (topic, message_type), (f"send {topic}", attrs))
        return shape

    def process(self, topic: str, queue_id: int, group: str, clustering: bool
                ) -> tuple[str, dict[str, Any]]:
        """``process {topic}``: a push consumer's handler on a message of that queue."""
        key = (topic, queue_id, group, clustering)
        shape = self._process.get(key)
        if shape is None:
            attrs = operation("process", "process")
            attrs[DESTINATION] = topic
            attrs[PARTITION] = str(queue_id)
            attrs[CONSUMER_GROUP] = group
            attrs[CONSUMPTION_MODEL] = "clustering" if clustering else "broadcasting"
            shape = _keep(self._process, key, (f"process {topic}", attrs))
        return shape


def _keep(shapes: dict[Any, tuple[str, dict[str, Any]]], key: Any,
          shape: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    if len(shapes) >= Shapes.LIMIT:
        shapes.clear()
    shapes[key] = shape
    return shape


def outgoing(*, message_id: str | None = None, tag: str | None = None,
             keys: Sequence[str] | str | None = None, delay_level: int | None = None,
             deliver_at_ms: int | None = None, delay_ms: int | None = None,
             sharding_key: str | None = None) -> dict[str, Any]:
    """A send span's per-message attributes, from the message's fields."""
    attrs: dict[str, Any] = {}
    if message_id:
        attrs[MESSAGE_ID] = message_id
    if tag:
        attrs[MESSAGE_TAG] = tag
    if keys:
        attrs[MESSAGE_KEYS] = [keys] if isinstance(keys, str) else list(keys)
    if delay_level:
        attrs[DELAY_TIME_LEVEL] = int(delay_level)
    elif deliver_at_ms is not None:
        attrs[DELIVERY_TIMESTAMP] = int(deliver_at_ms)
    elif delay_ms is not None:
        attrs[DELIVERY_TIMESTAMP] = time.time_ns() // 1_000_000 + int(delay_ms)
    if sharding_key:
        attrs[MESSAGE_GROUP] = sharding_key
    return attrs


def message_type(*, delayed: bool, sharding_key: str | None, transaction: bool = False) -> str:
    if transaction:
        return "transaction"
    if delayed:
        return "delay"
    return "fifo" if sharding_key else "normal"


def about(message: ReceivedMessage) -> dict[str, Any]:
    """A span's per-message attributes about one received message."""
    attrs: dict[str, Any] = {MESSAGE_ID: message.message_id}
    if message.tag:
        attrs[MESSAGE_TAG] = message.tag
    if message.keys:
        attrs[MESSAGE_KEYS] = list(message.keys)
    if message.reconsume_times:
        attrs[RECONSUME_TIMES] = message.reconsume_times
    return attrs


def received(message: ReceivedMessage, name: str, kind: str) -> dict[str, Any]:
    """A span's attributes about one received message."""
    attrs = operation(name, kind)
    attrs[DESTINATION] = message.topic
    attrs[PARTITION] = str(message.queue_id)
    attrs.update(about(message))
    return attrs



@functools.lru_cache(maxsize=256)
def server(address: str | None) -> dict[str, Any]:
    """``server.address`` / ``server.port`` of a broker URL (``http://host:port``); a shared,
    read-only dict: copy it into a span's attributes, never modify it."""
    if not address:
        return {}
    parts = urlsplit(address if "//" in address else f"//{address}")
    attrs: dict[str, Any] = {}
    if parts.hostname:
        attrs[SERVER_ADDRESS] = parts.hostname
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    if port:
        attrs[SERVER_PORT] = port
    return attrs
