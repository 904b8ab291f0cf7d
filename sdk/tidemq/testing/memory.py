"""``TestBroker``: a tidemq broker and nameserver in memory, for an application's unit tests.

It needs nothing but the SDK (``pip install tidemq``): no processes, no Redis, no ports. Every
client of the SDK takes ``transport=``; a ``TestBroker``'s transport answers the public REST
API (docs/api.md) from memory, so ``Producer``, ``TransactionProducer``, ``PushConsumer`` and
``SimpleConsumer`` run unchanged against it::

    from tidemq import Producer
    from tidemq.testing.memory import TestBroker

    async def test_order_is_published():
        async with TestBroker() as broker:
            broker.create_topic("Orders")
            async with Producer(**broker.client_options()) as producer:
                sent = await producer.send(b"order 42", topic="Orders", tag="Created")
            got = await broker.wait_for_message("Orders", message_id=sent.message_id)
            assert got.body == b"order 42"

or with the pytest fixture ``tidemq_test_broker`` (a fresh broker per test). What it keeps:

- topics created explicitly (``create_topic``); a send to an unknown one is 404
  ``TOPIC_NOT_FOUND``, a bad name 400 ``INVALID_TOPIC_NAME``, a system topic 403;
- dedup by (topic, message_id) within 10 minutes of its clock; tag filtering; batches;
- per-group committed offsets; ``%RETRY%{group}`` copies after a back-off delay (level 3 + the
  retries so far) and ``%DLQ%{group}`` after ``max_reconsume_times`` retries;
- the simple consumer's receive / ack / change of invisibility;
- transactions: a half message is invisible until committed, a rolled-back one is never
  delivered; one left ``unknown`` (or not ended) is checked back by a polling
  ``TransactionProducer`` of its group once the clock passes its immunity
  (``check_immunity_s``, else ``transaction_timeout_s``), and again each
  ``transaction_timeout_s`` after (15 checks, then discarded);
- delays (``delay_level``, ``delay_ms``, ``deliver_at_ms``): never delivered before the clock
  passes their due time; cancel (``DELETE /v1/messages/{id}/schedule``, ``?topic=``) and
  ``GET /v1/scheduled``; message queries by id, key or time.

**The clock.** ``broker.clock.now_ms`` starts at the real time and only moves with
``broker.advance(seconds)``, which delivers what came due and wakes waiting consumers and
check polls: delays, retry back-offs, invisibility and check-backs take no real time at all.
Long polls and heartbeats run in real time (a consumer's poll returns as soon as something
happens). Differences from a real broker: one broker group, no ACL, no flow control, a group's
retry topic is routable as soon as a consumer asks for it, and checks count only when a
producer takes them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from tidemq._producer import Producer
from tidemq._puller import Handler
from tidemq._push_consumer import PushConsumer
from tidemq._simple_consumer import SimpleConsumer
from tidemq._transaction import TransactionListener, TransactionProducer
from tidemq.protocol import ReceivedMessage
from tidemq.testing._memory_routes import MemoryTransport, Signal
from tidemq.testing._memory_simple import MemorySimple
from tidemq.testing._memory_store import (
    DEFAULT_DELAY_LEVELS_S,
    DEFAULT_MAX_RECONSUME_TIMES,
    DEFAULT_QUEUES,
    ManualClock,
    MemoryStore,
)
from tidemq.testing._memory_tx import DEFAULT_TRANSACTION_TIMEOUT_S, MemoryTransactions

NAMESERVER_URL = "http://nameserver.tidemq-memory:9876"  # never resolved: the transport answers
BROKER_URL = "http://broker.tidemq-memory:10911"
WAIT_TIMEOUT_S = 5.0  # default of wait_for_message (real seconds)
CONSUMER_HEARTBEAT_S = 1.0  # consumer() rebalances this often


class TestBroker:
    """An in-memory tidemq (see the module doc). Usable as ``async with`` or as is; clients
    made from it (``producer()``, ``client_options()``) must be closed by their owner.

    ``delay_levels_s``: levels 1-18 in seconds (the broker's default table);
    ``max_reconsume_times``: retries before the DLQ; ``transaction_timeout_s``: the first
    check of a half message without its own immunity, and the pause between checks;
    ``start_ms``: the clock's start (epoch ms; default: now).
    """

    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(self, *, delay_levels_s: Iterable[float] = DEFAULT_DELAY_LEVELS_S,
                 max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
                 transaction_timeout_s: float = DEFAULT_TRANSACTION_TIMEOUT_S,
                 start_ms: int | None = None) -> None:
        self.clock = ManualClock(start_ms)
        self.store = MemoryStore(self.clock, delay_levels_s=delay_levels_s,
                                 max_reconsume_times=max_reconsume_times)
        self.transactions = MemoryTransactions(self.store,
                                               transaction_timeout_s=transaction_timeout_s)
        self.simple = MemorySimple(self.store)
        self._signal = Signal()
        self.nameserver_url = NAMESERVER_URL
        self.broker_url = BROKER_URL
        self.transport = MemoryTransport(self.store, self.transactions, self.simple, self._signal,
                                         nameserver_url=NAMESERVER_URL, broker_url=BROKER_URL)

    @property
    def nameservers(self) -> list[str]:
        return [self.nameserver_url]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Wake every waiting long poll (nothing else to release)."""
        self._signal.notify()

    # -- state -------------------------------------------------------------------------------

    def create_topic(self, name: str | None = None, *, queues: int = DEFAULT_QUEUES) -> str:
        """Create (or grow) a topic; a fresh name when none is given. Returns its name."""
        topic = name or f"T-{uuid.uuid4().hex[:10]}"
        self.store.create_topic(topic, queues)
        return topic

    def advance(self, seconds: float) -> None:
        """Move the clock forward: what came due is delivered (delays, retries), half
        messages past their immunity are checked, received messages past their invisibility
        are received again."""
        self.clock.advance(seconds)
        self.store.deliver_due()
        self._signal.notify()

    def messages(self, topic: str) -> list[ReceivedMessage]:
        """Every message stored in ``topic`` (queue by queue), whoever consumed it."""
        return [ReceivedMessage.from_wire(m.wire())
                for q in self.store.topic(topic).queues for m in q]

    async def wait_for_message(
        self, topic: str, *, message_id: str | None = None,
        match: Callable[[ReceivedMessage], bool] | None = None,
        timeout_s: float = WAIT_TIMEOUT_S,
    ) -> ReceivedMessage:
        """The first message of ``topic`` with ``message_id`` that satisfies ``match``,
        waiting for it (real time) up to ``timeout_s``; ``TimeoutError`` after. It does not
        move the clock: a delayed message needs ``advance``."""
        deadline = time.monotonic() + timeout_s
        while True:
            for m in self.messages(topic):
                if (message_id is None or m.message_id == message_id) and \
                        (match is None or match(m)):
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching message in {topic!r} after {timeout_s}s")
            await self._signal.wait(left)

    # -- clients -----------------------------------------------------------------------------

    def client_options(self) -> dict[str, Any]:
        """``nameservers`` and ``transport`` for any client's constructor."""
        return {"nameservers": self.nameservers, "transport": self.transport}

    def producer(self, **options: Any) -> Producer:
        return Producer(**self.client_options(), **options)

    def transaction_producer(self, group: str, listener: TransactionListener,
                             **options: Any) -> TransactionProducer:
        return TransactionProducer(group, listener, **self.client_options(), **options)

    def consumer(self, group: str, handler: Handler, subscriptions: Mapping[str, str],
                 **options: Any) -> PushConsumer:
        options = {"heartbeat_interval_s": CONSUMER_HEARTBEAT_S, **options}
        return PushConsumer(group, handler=handler, subscriptions=subscriptions,
                            **self.client_options(), **options)

    def simple_consumer(self, group: str, topic: str, **options: Any) -> SimpleConsumer:
        return SimpleConsumer(group, topic=topic, **self.client_options(), **options)
