"""Events for the metrics tests: a scripted set of transactions, written to a real broker, and a
reader of Prometheus exposition text."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families
from tidemq.protocol import make_event

from tidemq_server.common.constants import TOKEN_HEADER

Body = dict[str, Any] | str | bytes  # an event, or a raw (malformed) body
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

T0 = 1_700_000_000_000  # born_ms of the first half message of every script (epoch ms)


@dataclass
class Script:
    """Events of scripted transactions of one producer group and topic."""

    group: str
    topic: str
    bodies: list[Body] = field(default_factory=list)
    _n: int = 0

    def _tx(self) -> str:
        self._n += 1
        return f"{self.group}-tx-{self._n}"

    def _event(self, event: str, tx: str, born: int, ts: int, *, source: str = "producer",
               checks: int = 0) -> None:
        self.bodies.append(make_event(event, producer_group=self.group, topic=self.topic,
                                      transaction_id=tx, message_id=f"m-{tx}", source=source,
                                      check_times=checks, born_ms=born, ts_ms=ts))

    def ended(self, action: str, after_ms: int) -> None:
        """Half message, then the producer ends it ``after_ms`` later."""
        tx, born = self._tx(), T0 + self._n
        self._event("half", tx, born, born)
        self._event(action, tx, born, born + after_ms)

    def checked(self, answers: Sequence[str], after_ms: int) -> None:
        """Half message, producer says unknown, then one check per answer (the last one ends
        it ``after_ms`` after the half message)."""
        tx, born = self._tx(), T0 + self._n
        self._event("half", tx, born, born)
        self._event("unknown", tx, born, born + 100)
        for i, answer in enumerate(answers, start=1):
            ts = born + after_ms if i == len(answers) else born + 1000 * i
            self._event("check", tx, born, ts - 1, source="check", checks=i)
            self._event(answer, tx, born, ts, source="check", checks=i)

    def discarded(self, checks: int, after_ms: int) -> None:
        """Half message whose checks all answer unknown, then discarded."""
        tx, born = self._tx(), T0 + self._n
        self._event("half", tx, born, born)
        for i in range(1, checks + 1):
            self._event("check", tx, born, born + 1000 * i, source="check", checks=i)
            self._event("unknown", tx, born, born + 1000 * i + 1, source="check", checks=i)
        self._event("discard", tx, born, born + after_ms, source="check", checks=checks)

    def pending(self) -> None:
        tx, born = self._tx(), T0 + self._n
        self._event("half", tx, born, born)


MALFORMED: list[Body] = [
    b"\xff\xfe not json",  # not_json
    "[1, 2, 3]",  # not_object
    {"event": "half"},  # missing_field
    {**make_event("half", producer_group="g", topic="t", transaction_id="x", born_ms=1,
                  ts_ms=1), "check_times": "3"},  # bad_type
    {**make_event("half", producer_group="g", topic="t", transaction_id="x", born_ms=1,
                  ts_ms=1), "born_ms": True},  # bad_type
    make_event("explode", producer_group="g", topic="t", transaction_id="x", born_ms=1,
               ts_ms=1),  # unknown_event
]
MALFORMED_BY_REASON = {"not_json": 1, "not_object": 1, "missing_field": 1, "bad_type": 2,
                       "unknown_event": 1}


def scenario(group: str = "shop", topic: str = "Orders") -> list[Body]:
    """Every path a transaction can take, plus a second group and the malformed set."""
    orders = Script(group, topic)
    for after in (50, 200, 700, 3000, 40_000):
        orders.ended("commit", after)
    for after in (100, 2000):
        orders.ended("rollback", after)
    orders.checked(["commit"], 7000)
    orders.checked(["unknown", "rollback"], 65_000)
    orders.discarded(15, 500_000)
    orders.pending()
    other = Script('we"ird\\group', "Pay")
    other.ended("commit", 10)
    return [*orders.bodies, *other.bodies, *MALFORMED]


def encode(body: Body) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return orjson.dumps(body)


def put_events(broker_url: str, token: str, topic: str, bodies: Iterable[Body],
               queues: int = 1) -> int:
    """Write bodies round-robin over ``queues`` queues through the internal put (4096 per
    request, msgpack so raw bytes stay raw). Returns how many were written."""
    import msgpack

    records = [{"body": encode(b), "queue_id": i % queues} for i, b in enumerate(bodies)]
    with httpx.Client(base_url=broker_url, timeout=30.0,
                      headers={TOKEN_HEADER: token, "content-type": "application/msgpack",
                               "accept": "application/msgpack"}) as client:
        for start in range(0, len(records), 4096):
            chunk = {"records": records[start:start + 4096]}
            resp = client.post(f"/internal/v1/topics/{topic}/messages",
                               content=msgpack.packb(chunk, use_bin_type=True))
            assert resp.status_code == 200, resp.text
    return len(records)


def parse_exposition(text: str) -> Samples:
    """``{(sample name, labels): value}`` of an exposition (validated by the parser)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]


def promtool(*args: str, stdin: str | None = None, cwd: str | None = None) -> str:
    """Run Debian's promtool; fail (not skip) when it is missing: CI installs it."""
    import shutil
    import subprocess

    exe = shutil.which("promtool")
    assert exe, "promtool is not installed: run scripts/install-system-deps.sh"
    proc = subprocess.run([exe, *args], input=stdin, capture_output=True, text=True,
                          timeout=60, cwd=cwd)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output
