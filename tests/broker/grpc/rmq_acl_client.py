"""One call of the official RocketMQ 5 Python client with credentials, for the ACL tests.

Run by the interpreter of the client's own virtualenv (see conftest.py); imports nothing from
tidemq. Prints one JSON object: ``{"ok": true, ...}`` or ``{"ok": false, "error": <exception
class>, "code": <RocketMQ code or null>, "message": ...}``.

    python rmq_acl_client.py ENDPOINT AK SK send|receive|transaction TOPIC [GROUP]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


class Rollback(TransactionChecker):
    def check(self, message: Any) -> int:
        return TransactionResolution.ROLLBACK


def run(endpoint: str, ak: str, sk: str, action: str, topic: str, group: str) -> dict[str, Any]:
    config = ClientConfiguration(endpoint, Credentials(ak, sk), request_timeout=5)
    if action in ("send", "transaction"):
        producer = Producer(config, (topic,), Rollback() if action == "transaction" else None)
        producer.startup()
        try:
            msg = Message()
            msg.topic = topic
            msg.body = f"grpc-{ak}".encode()
            if action == "transaction":
                tx = producer.begin_transaction()
                receipt = producer.send(msg, tx)
                tx.commit()
            else:
                receipt = producer.send(msg)
            return {"ok": True, "message_id": receipt.message_id}
        finally:
            producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=1)
    consumer.startup()
    try:
        bodies: list[str] = []
        for _ in range(5):  # until a receive after the first messages brings nothing more
            got = consumer.receive(16, 15)
            for m in got:
                consumer.ack(m)
                bodies.append(bytes(m.body).decode())
            if bodies and not got:
                break
        return {"ok": True, "bodies": sorted(bodies)}
    finally:
        consumer.shutdown()


#: RocketMQ codes → the exception the client's result checker raises for them
REFUSALS = {"40100": "UnauthorizedException", "40300": "ForbiddenException"}


def logged_refusals() -> list[str]:
    """The refusals the client's log recorded: a refused route query is logged there with its
    code ("query topic raise exception, 40300, ...") and re-raised as a plain Exception."""
    found = set()
    for path in sorted(Path(os.path.expanduser("~/logs/rocketmq_python")).glob("*.log*")):
        for line in path.read_text(errors="replace").splitlines():
            if "raise exception" in line:
                found.update(name for code, name in REFUSALS.items() if f", {code}," in line)
    return sorted(found)


def main() -> None:
    endpoint, ak, sk, action, topic = sys.argv[1:6]
    group = sys.argv[6] if len(sys.argv) > 6 else "G"
    try:
        result = run(endpoint, ak, sk, action, topic, group)
    except Exception as exc:  # the test reads the class and the RocketMQ code
        result = {"ok": False, "error": type(exc).__name__,
                  "code": getattr(exc, "code", None), "message": str(exc)[:500],
                  "logged": logged_refusals()}
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
