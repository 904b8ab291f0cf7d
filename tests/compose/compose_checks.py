"""docker-compose.yml run for real, checked from the host like a user, on the published ports.

``scripts/compose-test.sh`` (``make compose-test``) builds the images, brings every service but
Grafana up and runs this file against them; it is not part of ``make test`` (pytest collects only
``test_*.py`` files by itself). It reads what the script exports: ``DOCKER_HOST``,
``COMPOSE_PROJECT_NAME``, the ``…_HOST_PORT`` variables of docker-compose.yml (their defaults
otherwise), ``TIDEMQ_TLS_CA`` (the compose CA) and ``TIDEMQ_ACCESS_KEY`` / ``_SECRET_KEY`` (the
admin account the init step made).

Checked, in order: every service healthy; the console signs the admin in; a topic created on both
groups (CLI) and messages sent and consumed through the SDK on both; a transaction left UNKNOWN is
checked back and committed; a delayed message arrives, not early; a broker process killed (a crash:
``docker kill`` would count as a manual stop, which Docker never restarts) is restarted by
``restart: unless-stopped`` and every acknowledged message is consumed; Prometheus (the container)
has every tidemq target up and the sidecar's check and discard series.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from tidemq import (
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    TidemqError,
    TransactionProducer,
    TransactionState,
)

from tests.support.clock import now_ms
from tests.support.compose import preflight
from tests.support.procs import REPO
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

T = TypeVar("T")


PUBLISHED = {p.service: p for p in preflight().load()}


def url(service: str, scheme: str = "https") -> str:
    p = PUBLISHED[service]
    return f"{scheme}://127.0.0.1:{p.port(os.environ)}"


NAMESERVERS = [url("nameserver-1"), url("nameserver-2")]
BROKERS = {"broker-a": url("broker-a"), "broker-b": url("broker-b")}
PROMETHEUS = url("prometheus", "http")
DELAY_MS = 5_000
# Bounds of the waits below, never speed targets: on a quiet 2-core machine each takes seconds
# (the check-back up to ~40 s: the checker scans every 30 s, its default, after a 6 s immunity),
# but at a load average of 30 on 2 cores Spark's session alone took 234 s to start.
CHECK_WAIT_S = 180.0
SEEN_WAIT_S = 120.0
SIDECAR_WAIT_S = 600.0
POLL_S = 0.5
TIDEMQ_JOBS = {"tidemq-nameserver", "tidemq-broker", "tidemq-checker", "tidemq-scheduler",
               "tidemq-metrics", "tidemq-console"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def containers() -> dict[str, str]:
    """Compose service → its container id, from the labels compose gives (one docker call:
    each docker-compose 1.29 call costs seconds)."""
    return preflight().containers(os.environ.get("COMPOSE_PROJECT_NAME", "tidemq"))


def container(service: str) -> str:
    return containers()[service]


def cli(*args: str) -> str:
    where = ["--nameserver", ",".join(NAMESERVERS)]
    return subprocess.run([str(Path(sys.executable).parent / "tidemq"), *where, *args],
                          capture_output=True, text=True, check=True, timeout=60).stdout



def tls() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=os.environ["TIDEMQ_TLS_CA"])


class Loop:
    """One asyncio loop in a thread for the whole module: the SDK clients live on it (the
    transactional producer must stay up to answer its check) while tests wait from outside."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Seen:
    """What a push consumer got: message id → (arrival wall clock ms, message)."""

    def __init__(self) -> None:
        self.messages: dict[str, tuple[int, ReceivedMessage]] = {}

    async def handle(self, message: ReceivedMessage) -> ConsumeResult:
        self.messages.setdefault(message.message_id, (now_ms(), message))
        return ConsumeResult.SUCCESS

    def has(self, ids: set[str]) -> bool:
        return ids <= self.messages.keys()


class Listener:
    """The local transaction ends UNKNOWN; a check answers COMMIT and is counted."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    async def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState.UNKNOWN

    async def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        self.checked.append(message.message_id)
        return TransactionState.COMMIT


class System:
    """The clients of the module, and what was started before the tests wait for it."""

    def __init__(self, loop: Loop, topic: str) -> None:
        self.loop = loop
        self.topic = topic
        self.tx_group = unique("compose-tx")
        self.seen = Seen()
        self.listener = Listener()
        self.producer = Producer(nameservers=NAMESERVERS)
        self.tx = TransactionProducer(self.tx_group, self.listener, nameservers=NAMESERVERS)
        self.consumer = PushConsumer(unique("compose-billing"), nameservers=NAMESERVERS,
                                     handler=self.seen.handle)
        self.consumer.subscribe(self.topic, "*")
        self.tx_id = ""
        self.delayed_id = ""
        self.deliver_at_ms = 0

    async def start(self) -> None:
        await self.producer.start()
        await self.tx.start()
        result = await self.tx.send(Message(b"order paid", topic=self.topic))
        assert result.local_state is TransactionState.UNKNOWN
        self.tx_id = result.message_id
        delayed = await self.producer.send(b"check payment", topic=self.topic, delay_ms=DELAY_MS)
        assert delayed.state == "scheduled" and delayed.deliver_at_ms
        self.delayed_id, self.deliver_at_ms = delayed.message_id, delayed.deliver_at_ms
        await self.consumer.start()

    async def close(self) -> None:
        for client in (self.consumer, self.tx, self.producer):
            await client.close()


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    loop = Loop()
    topic = unique("ComposeOrders")
    out = cli("topic", "create", topic, "--queues", "4")
    assert "broker-a" in out and "broker-b" in out, out  # on both groups
    started = System(loop, topic)
    loop.run(started.start())
    yield started
    loop.run(started.close())
    loop.close()


def test_every_service_is_healthy() -> None:
    services = set(yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"])
    states = preflight().states(containers())
    # CI runs everything but Grafana (docs/operations.md)
    assert set(states) == services - {"grafana"}
    assert states.pop("init-secrets") == "done"
    assert set(states.values()) == {"healthy"}, states


def test_the_console_answers_a_signed_in_admin() -> None:
    """Compose runs the console with ACL: a visitor is sent to the sign-in page, and the admin
    account's keys (admin.env) open the cluster page."""
    with httpx.Client(base_url=url("console"), verify=tls(), timeout=10) as http:
        first = http.get("/")
        assert first.status_code == 303 and first.headers["location"].startswith("/login"), \
            first.text[:300]
        form = http.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text[:300]
        signed = http.post("/login", headers={"Origin": url("console")}, data={
            "csrf": csrf.group(1), "access_key": os.environ["TIDEMQ_ACCESS_KEY"],
            "secret_key": os.environ["TIDEMQ_SECRET_KEY"], "next": "/"})
        assert signed.status_code == 303 and signed.headers["location"] == "/", signed.text[:300]
        page = http.get("/")
        assert page.status_code == 200, page.text[:300]
        assert "<title>Cluster" in page.text
        assert "broker-a" in page.text and "broker-b" in page.text


def test_sent_and_consumed_through_the_sdk_on_both_groups(system: System) -> None:
    async def send() -> set[str]:
        results = await asyncio.gather(*(system.producer.send(f"order {i}".encode(),
                                                              topic=system.topic)
                                         for i in range(64)))
        return {r.message_id for r in results}

    ids = system.loop.run(send())
    wait_until(lambda: system.seen.has(ids), SEEN_WAIT_S, "every message consumed", POLL_S)
    shown = json.loads(cli("topic", "show", system.topic, "--json"))  # every group's queues
    stored = {g["broker_name"]: sum(q["max"] for q in g["offsets"]) for g in shown["groups"]}
    assert set(stored) == set(BROKERS), shown
    assert all(count > 0 for count in stored.values()), f"a group stored nothing: {stored}"


def test_an_unknown_transaction_is_checked_back_and_committed(system: System) -> None:
    wait_until(lambda: system.seen.has({system.tx_id}), CHECK_WAIT_S,
               "the UNKNOWN transaction committed by its check", POLL_S)
    assert system.tx_id in system.listener.checked


def test_a_delayed_message_arrives_not_early(system: System) -> None:
    wait_until(lambda: system.seen.has({system.delayed_id}), SEEN_WAIT_S, "the delayed message",
               POLL_S)
    arrived_ms, message = system.seen.messages[system.delayed_id]
    assert message.store_timestamp_ms >= system.deliver_at_ms  # delivered when due, not before
    assert arrived_ms >= system.deliver_at_ms


def crash(service: str) -> int:
    """SIGKILL the service's process inside its container, as a crash; the restart count."""
    cid = container(service)
    before = int(docker("inspect", "-f", "{{.RestartCount}}", cid))
    top = docker("top", cid, "-o", "pid,args").splitlines()[1:]
    [pid] = [int(line.split()[0]) for line in top if "python -m tidemq_server." in line
             and "docker-init" not in line]
    os.kill(pid, signal.SIGKILL)
    return before


def test_a_crashed_broker_comes_back_and_nothing_acknowledged_is_lost(system: System) -> None:
    acked: set[str] = set()

    async def send_through(stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set() or i < 50:
            try:
                acked.add((await system.producer.send(f"during {i}".encode(),
                                                      topic=system.topic)).message_id)
            except TidemqError:
                pass  # not acknowledged: may or may not be stored
            i += 1
            await asyncio.sleep(0.02)

    stop = asyncio.Event()
    sending = asyncio.run_coroutine_threadsafe(send_through(stop), system.loop.loop)
    wait_until(lambda: len(acked) >= 20, what="sends acknowledged before the crash")
    cid = container("broker-a")
    before = crash("broker-a")
    wait_until(lambda: int(docker("inspect", "-f", "{{.RestartCount}}", cid)) > before, 60,
               "broker-a restarted by its policy", POLL_S)
    wait_until(lambda: docker("inspect", "-f", "{{.State.Health.Status}}", cid) == "healthy",
               SEEN_WAIT_S, "broker-a healthy again", POLL_S)
    system.loop.loop.call_soon_threadsafe(stop.set)
    sending.result(120)
    assert len(acked) >= 50
    # a new group reads the topic from the start on both groups: every acknowledged id is there
    seen = Seen()
    late = PushConsumer(unique("compose-audit"), nameservers=NAMESERVERS, handler=seen.handle)
    late.subscribe(system.topic, "*")
    system.loop.run(late.start())
    try:
        wait_until(lambda: seen.has(acked), SEEN_WAIT_S, "every acknowledged message consumed",
                   POLL_S)
    finally:
        system.loop.run(late.close())


def prometheus(query: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{PROMETHEUS}/api/v1/query", params={"query": query}, timeout=10)
    answer.raise_for_status()
    return list(answer.json()["data"]["result"])


@pytest.mark.timeout(SIDECAR_WAIT_S + CHECK_WAIT_S + 2 * SEEN_WAIT_S)
def test_prometheus_has_every_target_up_and_the_sidecars_check_series(system: System) -> None:
    # last: the Spark sidecar has had the longest to start (under load that took minutes)
    def targets_up() -> dict[str, str]:  # instance → health, once all are up (else empty)
        active = httpx.get(f"{PROMETHEUS}/api/v1/targets", timeout=10).json()["data"][
            "activeTargets"]
        health = {t["labels"]["instance"]: t["health"] for t in active
                  if t["labels"]["job"] in TIDEMQ_JOBS}
        jobs = {t["labels"]["job"] for t in active}
        return health if jobs >= TIDEMQ_JOBS and set(health.values()) == {"up"} else {}

    health = wait_until(targets_up, SEEN_WAIT_S, "every tidemq target up", POLL_S)
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert set(health) == {f"{name}:{svc['expose'][0]}" for name, svc in services.items()
                           if svc.get("image") == "tidemq:local" and name != "init-secrets"}
    wait_until(lambda: system.seen.has({system.tx_id}), CHECK_WAIT_S,
               "the check-back test's transaction", POLL_S)
    group = f'producer_group="{system.tx_group}"'

    def series() -> dict[str, list[dict[str, Any]]]:  # both families, once both are there
        found = {"checks": prometheus(f"tidemq_transaction_checks_total{{{group}}} >= 1"),
                 "discards": prometheus(f"tidemq_transaction_discards_total{{{group}}}")}
        return found if all(found.values()) else {}

    found = wait_until(series, SIDECAR_WAIT_S, "the sidecar's check and discard series", POLL_S)
    checks, discards = found["checks"], found["discards"]
    assert [c["metric"]["topic"] for c in checks] == [system.topic]
    assert [d["metric"]["topic"] for d in discards] == [system.topic]
    assert [float(d["value"][1]) for d in discards] == [0.0]  # committed, nothing discarded
