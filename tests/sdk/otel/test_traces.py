"""``tidemq.otel`` against a real system (the ``tidemq_system`` fixture): an in-memory exporter
receives the spans of a send → consume, of a transactional send committed by a check-back and
of a message delayed by two days, each one trace from the send to the handler; a simple
consumer's receive and ack; a handler's failure settled to the retry topic. Off again, the SDK's
methods are its own and no span is made."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tidemq import (
    ConsumeResult,
    Message,
    ReceivedMessage,
    SimpleConsumer,
    TransactionState,
)
from tidemq.otel import TidemqInstrumentor
from tidemq.testing import TidemqSystem

from tests.sdk.otel.printing import format_trace
from tests.support.wait import hang

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TidemqInstrumentor().instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        TidemqInstrumentor().uninstrument()


def spans_of(exporter: InMemorySpanExporter, message_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans()
            if (s.attributes or {}).get("messaging.message.id") == message_id]


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def assert_consumed_in_the_send_trace(send: ReadableSpan, process: ReadableSpan) -> None:
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == send.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]


class Orders:
    """Its local transaction's outcome is lost (UNKNOWN); the check-back finds it committed."""

    async def execute_local_transaction(self, message: Message, arg: object) -> TransactionState:
        return TransactionState.UNKNOWN

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.COMMIT


async def consume_one(system: TidemqSystem, topic: str, group: str,
                      result: ConsumeResult = ConsumeResult.SUCCESS) -> ReceivedMessage:
    seen: asyncio.Queue[ReceivedMessage] = asyncio.Queue()

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        await seen.put(message)
        return result

    async with system.consumer(group, handler, {topic: "*"}):
        return await asyncio.wait_for(seen.get(), timeout=20)


async def test_send_then_consume_is_one_trace(tidemq_system: TidemqSystem,
                                              exporter: InMemorySpanExporter) -> None:
    topic = await tidemq_system.create_topic()
    async with tidemq_system.producer() as producer:
        sent = await producer.send(b"order 1 paid", topic=topic, tag="Paid",
                                   keys=["order-1"])
    got = await consume_one(tidemq_system, topic, "otel-billing")
    spans = spans_of(exporter, sent.message_id)
    send, process = one(spans, f"send {topic}"), one(spans, f"process {topic}")
    # W3C traceparent: version-trace_id-parent_id-flags
    assert got.properties["traceparent"].startswith(
        f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-")
    assert_consumed_in_the_send_trace(send, process)
    assert dict(send.attributes or {}) == {
        "messaging.system": "rocketmq", "messaging.operation.name": "send",
        "messaging.operation.type": "send", "messaging.destination.name": topic,
        "messaging.message.id": sent.message_id, "messaging.rocketmq.message.type": "normal",
        "messaging.rocketmq.message.tag": "Paid", "messaging.rocketmq.message.keys": ("order-1",),
        "messaging.destination.partition.id": str(sent.queue_id),
        "messaging.client.id": producer.client_id,  # the producer instance
        "server.address": "127.0.0.1",  # the broker that stored it
        "server.port": int(tidemq_system.broker_url.rsplit(":", 1)[1])}
    attrs = process.attributes or {}
    assert attrs["messaging.consumer.group.name"] == "otel-billing"
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.rocketmq.consumption_model"] == "clustering"
    assert attrs["messaging.rocketmq.message.tag"] == "Paid"
    print("\n" + format_trace(spans))


async def test_a_delayed_commit_by_check_back_stays_in_the_send_trace(
        tidemq_system: TidemqSystem, exporter: InMemorySpanExporter) -> None:
    """half → local transaction UNKNOWN → check-back → commit → two days → handler."""
    topic = await tidemq_system.create_topic()
    async with tidemq_system.transaction_producer("otel-shop", Orders()) as producer:
        sent = await producer.send(Message(b"order 2", topic=topic, delay_ms=2 * DAY_MS),
                                   check_immunity_s=0)
        for _ in range(100):  # the check is answered by this producer, in the background
            await tidemq_system.check_now()
            if any(s.name == f"check {topic}" for s in spans_of(exporter, sent.message_id)):
                break
            await asyncio.sleep(0.1)
    await tidemq_system.advance_clock(2 * DAY_MS / 1000)
    await consume_one(tidemq_system, topic, "otel-tx-billing")
    spans = spans_of(exporter, sent.message_id)
    send, check = one(spans, f"send {topic}"), one(spans, f"check {topic}")
    process = one(spans, f"process {topic}")
    assert (send.attributes or {})["messaging.rocketmq.message.type"] == "transaction"
    assert (send.attributes or {})["tidemq.transaction.local_state"] == "unknown"
    assert (send.attributes or {})["tidemq.transaction.id"] == sent.transaction_id
    assert (send.attributes or {})["messaging.client.id"] == producer.client_id
    assert (send.attributes or {})["server.address"] == "127.0.0.1"
    assert "messaging.rocketmq.message.delivery_timestamp" in (send.attributes or {})
    assert check.kind is SpanKind.CONSUMER and check.context.trace_id == send.context.trace_id
    assert check.parent is not None and check.parent.span_id == send.context.span_id
    assert (check.attributes or {})["tidemq.transaction.check_answer"] == "commit"
    assert_consumed_in_the_send_trace(send, process)
    print("\n" + format_trace(spans))


async def test_a_message_delayed_two_days_stays_in_the_send_trace(
        tidemq_system: TidemqSystem, exporter: InMemorySpanExporter) -> None:
    topic = await tidemq_system.create_topic()
    async with tidemq_system.producer() as producer:
        sent = await producer.send(b"remind order 3", topic=topic, delay_ms=2 * DAY_MS)
    await tidemq_system.advance_clock(2 * DAY_MS / 1000)
    await consume_one(tidemq_system, topic, "otel-reminders")
    spans = spans_of(exporter, sent.message_id)
    send, process = one(spans, f"send {topic}"), one(spans, f"process {topic}")
    attrs = send.attributes or {}
    assert attrs["messaging.rocketmq.message.type"] == "delay"
    assert sent.deliver_at_ms is not None
    assert abs(int(attrs["messaging.rocketmq.message.delivery_timestamp"])  # type: ignore[arg-type]
               - sent.deliver_at_ms) < 5000
    assert_consumed_in_the_send_trace(send, process)


async def test_delays_as_timedelta_and_datetime_are_traced_and_delivered(
        tidemq_system: TidemqSystem, exporter: InMemorySpanExporter) -> None:
    """Issue 34 item 3: the send span reads a ``timedelta`` delay and a ``datetime`` due time
    as milliseconds (the span's ``int()`` of them raised ``TypeError``), and both are
    delivered."""
    topic = await tidemq_system.create_topic()
    due = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=500_000)
    async with tidemq_system.producer() as producer:
        by_delta = await producer.send(b"in two days", topic=topic, delay_ms=timedelta(days=2))
        by_date = await producer.send(Message(b"tomorrow", topic=topic, deliver_at_ms=due))
    assert by_date.deliver_at_ms == int(due.timestamp() * 1000)
    for sent in (by_delta, by_date):
        attrs = one(spans_of(exporter, sent.message_id), f"send {topic}").attributes or {}
        assert sent.deliver_at_ms is not None
        assert abs(int(attrs["messaging.rocketmq.message.delivery_timestamp"])  # type: ignore[arg-type]
                   - sent.deliver_at_ms) < 5000
    await tidemq_system.advance_clock(2 * DAY_MS / 1000)
    seen: asyncio.Queue[ReceivedMessage] = asyncio.Queue()

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        await seen.put(message)
        return ConsumeResult.SUCCESS

    async with tidemq_system.consumer("otel-timedelta", handler, {topic: "*"}):
        got = {(await asyncio.wait_for(seen.get(), timeout=20)).message_id for _ in range(2)}
    assert got == {by_delta.message_id, by_date.message_id}


async def test_receive_and_ack_link_the_creation_context(
        tidemq_system: TidemqSystem, exporter: InMemorySpanExporter) -> None:
    topic = await tidemq_system.create_topic(queues=1)
    async with tidemq_system.producer() as producer:
        sent = await producer.send(b"audit 4", topic=topic)
    async with SimpleConsumer("otel-audit", topic=topic,
                              nameservers=tidemq_system.nameservers) as simple:
        got = await simple.receive(max=4, wait_ms=5000)
        assert [m.message_id for m in got] == [sent.message_id]
        assert await simple.ack(got) == 1
    send = one(spans_of(exporter, sent.message_id), f"send {topic}")
    settle = one(spans_of(exporter, sent.message_id), f"settle {topic}")
    receive = [s for s in exporter.get_finished_spans() if s.name == f"receive {topic}"
               and (s.attributes or {}).get("messaging.batch.message_count") == 1]
    assert len(receive) == 1 and receive[0].kind is SpanKind.CLIENT
    assert [link.context.span_id for link in receive[0].links] == [send.context.span_id]
    assert settle.kind is SpanKind.CLIENT
    assert (settle.attributes or {})["tidemq.settle.action"] == "ack"
    assert [link.context.span_id for link in settle.links] == [send.context.span_id]


async def test_a_failed_handler_is_settled_to_the_retry_topic(
        tidemq_system: TidemqSystem, exporter: InMemorySpanExporter) -> None:
    topic = await tidemq_system.create_topic(queues=1)
    async with tidemq_system.producer() as producer:
        sent = await producer.send(b"order 5", topic=topic)
    failures = 0

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        nonlocal failures
        failures += 1
        raise ValueError("no such customer")

    async with tidemq_system.consumer("otel-failing", handler, {topic: "*"}):
        for _ in range(200):
            if any(s.name == f"settle {topic}" for s in spans_of(exporter, sent.message_id)):
                break
            await asyncio.sleep(0.05)
    spans = spans_of(exporter, sent.message_id)
    process = next(s for s in spans if s.name == f"process {topic}")
    assert process.status.status_code is StatusCode.ERROR
    assert (process.attributes or {})["error.type"] == "ValueError"
    settle = next(s for s in spans if s.name == f"settle {topic}")
    assert (settle.attributes or {})["tidemq.settle.action"] == "retry"
    assert (settle.attributes or {})["tidemq.settle.destination"] == "%RETRY%otel-failing"


async def test_a_handler_past_its_timeout_ends_its_span_as_cancelled(
        tidemq_system: TidemqSystem, exporter: InMemorySpanExporter) -> None:
    topic = await tidemq_system.create_topic(queues=1)
    async with tidemq_system.producer() as producer:
        sent = await producer.send(b"order 6", topic=topic)

    async def slow(message: ReceivedMessage) -> None:
        await hang()

    async with tidemq_system.consumer("otel-slow", slow, {topic: "*"}, consume_timeout_s=0.3):
        for _ in range(200):
            if any(s.name == f"process {topic}" for s in spans_of(exporter, sent.message_id)):
                break
            await asyncio.sleep(0.05)
    process = next(s for s in spans_of(exporter, sent.message_id)
                   if s.name == f"process {topic}")
    assert process.status.status_code is StatusCode.ERROR
    assert (process.attributes or {})["error.type"] == "cancelled"
