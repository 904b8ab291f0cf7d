"""Scenarios run with the official RocketMQ 5 Python client, in its own virtualenv.

This file is executed by the interpreter of a separate virtualenv that has
``rocketmq-python-client`` (it installs a top-level ``rocketmq`` module, so it never shares an
environment with tidemq). It imports nothing from tidemq: it speaks to the broker's gRPC front
door exactly as an application would. Each call runs one scenario and prints one JSON object on
its last stdout line; the tests read it.

    python rmq_client.py ENDPOINT SCENARIO [options]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

# RMQ_TLS=1: send and receive over TLS (the CA in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, grpc's own)
TLS = os.environ.get("RMQ_TLS") == "1"


def now_ms() -> int:
    """The wall clock in epoch ms (tests.support.clock.now_ms: this script imports nothing of
    the repository, it runs in the official client's own environment)."""
    return time.time_ns() // 1_000_000


def config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=5)


def message(topic: str, body: str, tag: str | None = None, keys: list[str] | None = None,
            group: str | None = None, props: dict[str, str] | None = None) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    if tag:
        msg.tag = tag
    if keys:
        msg.keys = keys[0]
    if group:
        msg.message_group = group
    for k, v in (props or {}).items():
        msg.add_property(k, v)
    return msg


def describe(msg: Any) -> dict[str, Any]:
    return {"body": msg.body.decode(errors="replace"), "message_id": msg.message_id,
            "topic": msg.topic, "tag": msg.tag, "keys": sorted(msg.keys),
            "properties": dict(msg.properties), "message_group": msg.message_group,
            "delivery_attempt": msg.delivery_attempt, "born_timestamp": msg.born_timestamp,
            "delivery_timestamp": msg.delivery_timestamp, "corrupted": msg.corrupted,
            "message_type": msg.message_type, "received_ms": now_ms()}


# --- producing ------------------------------------------------------------------------------

def send(args: argparse.Namespace) -> dict[str, Any]:
    producer = Producer(config(args.endpoint), (args.topic,), tls_enable=TLS)
    producer.startup()
    sent = []
    try:
        for i in range(args.count):
            group = f"{args.group}-{i % args.groups}" if args.group else None
            msg = message(args.topic, f"{args.prefix}-{i}", args.tag, [f"key-{i}"], group,
                          {"seq": str(i)})
            due = now_ms() + args.delay_ms if args.delay_ms else None
            if due is not None:
                msg.delivery_timestamp = due  # epoch ms, as the client documents
            receipt = producer.send(msg)
            entry = {"body": f"{args.prefix}-{i}", "message_id": receipt.message_id,
                     "offset": receipt.offset, "group": group, "sent_ms": now_ms(),
                     "due_ms": due}
            if args.recall:
                entry["recalled"] = producer.recall_message(args.topic, receipt.recall_handle)
            sent.append(entry)
    finally:
        producer.shutdown()
    return {"sent": sent}


class Checker(TransactionChecker):
    """Answers every check with ``answer`` and remembers what it was asked."""

    def __init__(self, answer: int) -> None:
        self.answer = answer
        self.checked: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def check(self, message: Any) -> int:
        with self.lock:
            self.checked.append(describe(message))
        return self.answer


def transaction(args: argparse.Namespace) -> dict[str, Any]:
    """Half messages, then commit / rollback / nothing (an orphan for the checker)."""
    checker = Checker(TransactionResolution.ROLLBACK)
    producer = Producer(config(args.endpoint), (args.topic,), checker)
    producer.startup()
    sent = []
    try:
        for i in range(args.count):
            tx = producer.begin_transaction()
            receipt = producer.send(message(args.topic, f"{args.prefix}-{i}", args.tag,
                                            [f"key-{i}"]), tx)
            if args.end == "commit":
                tx.commit()
            elif args.end == "rollback":
                tx.rollback()
            sent.append({"body": f"{args.prefix}-{i}", "message_id": receipt.message_id,
                         "transaction_id": receipt.transaction_id})
    finally:
        producer.shutdown()
    return {"sent": sent}


def checker(args: argparse.Namespace) -> dict[str, Any]:
    """A transactional producer that only answers checks (COMMIT) until ``count`` arrived."""
    answer = TransactionResolution.COMMIT if args.answer == "commit" else \
        TransactionResolution.ROLLBACK
    check = Checker(answer)
    producer = Producer(config(args.endpoint), (args.topic,), check)
    # the client calls this when the broker answered the EndTransaction of a check's answer
    ended: list[str] = []
    answered = producer._Producer__server_transaction_check_callback

    def counted(future: Any, message: Any, transaction_id: str, result: Any) -> None:
        answered(future, message=message, transaction_id=transaction_id, result=result)
        ended.append(transaction_id)

    producer._Producer__server_transaction_check_callback = counted
    producer.startup()
    deadline = time.monotonic() + args.timeout
    try:
        # every check asked, and the EndTransaction of every answer answered
        while time.monotonic() < deadline and (
                len(check.checked) < args.count or len(ended) < len(check.checked)):
            time.sleep(0.05)
    finally:
        producer.shutdown()
    return {"checked": check.checked}


# --- consuming ------------------------------------------------------------------------------

def receive(args: argparse.Namespace) -> dict[str, Any]:
    """Receive until ``count`` messages or ``timeout``; ack each unless --no-ack."""
    consumer = SimpleConsumer(config(args.endpoint), args.consumer_group,
                              {args.topic: FilterExpression(args.tag or "*")},
                              await_duration=args.wait, tls_enable=TLS)
    consumer.startup()
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.timeout
    try:
        while len(got) < args.count and time.monotonic() < deadline:
            for msg in consumer.receive(args.batch, args.invisible):
                got.append(describe(msg))
                if not args.no_ack:
                    consumer.ack(msg)
    finally:
        consumer.shutdown()
    return {"received": got}


def push(args: argparse.Namespace) -> dict[str, Any]:
    """A PushConsumer (QueryAssignment, then receive loops) until ``count`` messages."""
    got: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, message: Any) -> Any:
            with lock:
                got.append(describe(message))
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(config(args.endpoint), args.consumer_group, Listener(),
                            {args.topic: FilterExpression(args.tag or "*")})
    consumer.startup()
    deadline = time.monotonic() + args.timeout
    try:
        while len(got) < args.count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # acks of the last messages
    finally:
        consumer.shutdown()
    return {"received": got}


def metrics_on(client: Any) -> bool | None:
    """Whether the client's own metrics (OTLP export) are on, as the broker's settings said."""
    return getattr(client.client_metrics, "_ClientMetrics__enabled", None)


def metrics(args: argparse.Namespace) -> dict[str, Any]:
    """A producer and a push consumer exchanging ``count`` messages while the broker's
    Settings.metric applies; both shut down (which flushes their metric export)."""
    got: list[str] = []
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, message: Any) -> Any:
            with lock:
                got.append(message.message_id)
            return ConsumeResult.SUCCESS

    producer = Producer(config(args.endpoint), (args.topic,))
    consumer = PushConsumer(config(args.endpoint), args.consumer_group, Listener(),
                            {args.topic: FilterExpression("*")})
    producer.startup()
    consumer.startup()
    states: dict[str, bool | None] = {}
    try:
        sent = [producer.send(message(args.topic, f"metrics-{i}")).message_id
                for i in range(args.count)]
        deadline = time.monotonic() + args.timeout
        # every message in, and the broker's Settings (metrics on) applied by both clients
        while (len(got) < args.count or not (metrics_on(producer) and metrics_on(consumer))) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        states = {"producer": metrics_on(producer), "consumer": metrics_on(consumer)}
    finally:
        consumer.shutdown()
        producer.shutdown()
    return {"sent": sent, "received": got, "metrics_on": states}


def invisibility(args: argparse.Namespace) -> dict[str, Any]:
    """Receive 3 messages invisible for ``invisible`` s: ack the first, extend the second to
    ``extend`` s, leave the third; then receive until both come back (ack them)."""
    consumer = SimpleConsumer(config(args.endpoint), args.consumer_group,
                              {args.topic: FilterExpression("*")}, await_duration=args.wait)
    consumer.startup()
    events: list[dict[str, Any]] = []
    try:
        first: list[Any] = []
        deadline = time.monotonic() + args.timeout
        while len(first) < 3 and time.monotonic() < deadline:
            first.extend(consumer.receive(3 - len(first), args.invisible))
        acked, extended, left = first[:3]
        consumer.ack(acked)
        consumer.change_invisible_duration(extended, args.extend)
        events.append({"event": "first", "at_ms": now_ms(),
                       "messages": [describe(m) for m in (acked, extended, left)]})
        back: list[dict[str, Any]] = []
        while len(back) < 2 and time.monotonic() < deadline:
            for msg in consumer.receive(4, args.invisible):
                back.append(describe(msg))
                consumer.ack(msg)
        events.append({"event": "again", "messages": back})
    finally:
        consumer.shutdown()
    return {"events": events}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    sub = ap.add_subparsers(dest="scenario", required=True)
    s = sub.add_parser("send")
    s.add_argument("--group", default=None, help="message group prefix (FIFO)")
    s.add_argument("--groups", type=int, default=1)
    s.add_argument("--delay-ms", type=int, default=0)
    s.add_argument("--recall", action="store_true", help="recall each message after sending")
    t = sub.add_parser("transaction")
    t.add_argument("--end", choices=["commit", "rollback", "none"], default="commit")
    c = sub.add_parser("checker")
    c.add_argument("--answer", choices=["commit", "rollback"], default="commit")
    r = sub.add_parser("receive")
    r.add_argument("--no-ack", action="store_true")
    r.add_argument("--batch", type=int, default=16)
    v = sub.add_parser("invisibility")
    v.add_argument("--extend", type=int, default=8)
    u = sub.add_parser("push")
    m = sub.add_parser("metrics")
    for p in (s, t, c, r, v, u, m):
        p.add_argument("--topic", required=True)
        p.add_argument("--count", type=int, default=1)
        p.add_argument("--tag", default=None)
        p.add_argument("--prefix", default="m")
        p.add_argument("--consumer-group", default="G")
        p.add_argument("--invisible", type=int, default=30)
        p.add_argument("--wait", type=int, default=2)
        p.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    scenarios = {"send": send, "transaction": transaction, "checker": checker,
                 "receive": receive, "invisibility": invisibility, "push": push,
                 "metrics": metrics}
    result = scenarios[args.scenario](args)
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
