"""What the console measures over time: every ``interval_s`` it reads each live broker's
``/metrics`` (messages stored by sends and handed out by pulls and receives, commit log and disk
use) and each consumer group's total lag (``GET /v1/groups/{g}/offsets``), in memory only.

Rates need two samples: a broker's rate is the counters' difference over the last two of its
samples. A group's lag history is a ring of the last ``keep`` samples. Nothing survives a
restart of the console; the pages say so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

from tidemq_server.common.app import START_TIME_METRIC
from tidemq_server.common.loop import BackgroundLoop
from tidemq_server.console.client import ApiError, ConsoleClient, LiveBroker, segment

log = logging.getLogger(__name__)

SENT = "tidemq_broker_messages_put_total"  # by topic: messages stored by public sends
PULLED = "tidemq_broker_pulled_messages_total"  # by topic: messages handed out by pulls
RECEIVED = "tidemq_broker_simple_delivered_total"  # messages handed out by simple-consumer receives
LOG_MIN = "tidemq_broker_store_commitlog_min_offset"
LOG_MAX = "tidemq_broker_store_commitlog_max_offset"
DISK_RATIO = "tidemq_broker_store_disk_used_ratio"
STARTED = START_TIME_METRIC  # Unix seconds: the broker process's start, for its uptime
WANTED = {SENT, PULLED, RECEIVED, LOG_MIN, LOG_MAX, DISK_RATIO, STARTED}
CONCURRENCY = 4  # requests in flight at once per sampling round
MAX_GROUPS = 256  # consumer groups whose lag one round samples per broker (by name)


@dataclass
class BrokerSample:
    at: float  # monotonic seconds
    sent: dict[str, float] = field(default_factory=dict)  # topic → messages
    consumed: dict[str, float] = field(default_factory=dict)  # topic → messages pulled
    received: float = 0.0
    log_bytes: float = 0.0
    disk_used_ratio: float | None = None
    started_s: float | None = None  # Unix seconds


def parse_metrics(text: str, at: float) -> BrokerSample:
    s = BrokerSample(at)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name not in WANTED:
                continue
            if name == SENT:
                s.sent[sample.labels.get("topic", "")] = sample.value
            elif name == PULLED:
                s.consumed[sample.labels.get("topic", "")] = sample.value
            elif name == RECEIVED:
                s.received = sample.value
            elif name == LOG_MIN:
                s.log_bytes -= sample.value
            elif name == LOG_MAX:
                s.log_bytes += sample.value
            elif name == DISK_RATIO:
                s.disk_used_ratio = sample.value
            elif name == STARTED:
                s.started_s = sample.value
    return s


@dataclass
class Rates:
    """Messages per second over the last two samples of one broker (None: one sample only)."""

    send: float | None
    receive: float | None
    by_topic: dict[str, tuple[float, float]]  # topic → (send, receive) per second
    log_bytes: float
    disk_used_ratio: float | None
    started_s: float | None = None  # the broker process's start (Unix seconds)


def rates(pair: deque[BrokerSample]) -> Rates | None:
    if not pair:
        return None
    new = pair[-1]
    if len(pair) < 2 or new.at <= pair[0].at:
        return Rates(None, None, {}, new.log_bytes, new.disk_used_ratio, new.started_s)
    old, dt = pair[0], new.at - pair[0].at

    def per_s(a: float, b: float) -> float:
        return max(0.0, b - a) / dt

    by_topic = {t: (per_s(old.sent.get(t, 0.0), new.sent.get(t, 0.0)),
                    per_s(old.consumed.get(t, 0.0), new.consumed.get(t, 0.0)))
                for t in set(new.sent) | set(new.consumed)}
    send = sum(v[0] for v in by_topic.values())
    receive = sum(v[1] for v in by_topic.values()) + per_s(old.received, new.received)
    return Rates(send, receive, by_topic, new.log_bytes, new.disk_used_ratio, new.started_s)


class _Rounds(BackgroundLoop):
    """The sampler's rounds, one every ``interval_s`` from one round's start to the next (a
    slow round shortens the pause after it)."""

    name = "console-sampler"

    def __init__(self, sampler: Sampler) -> None:
        super().__init__(sampler.interval_s)
        self.sampler = sampler
        self._began = 0.0

    async def run_once(self) -> None:
        self._began = time.monotonic()
        try:
            await self.sampler.sample()
        except Exception:  # the sampler must outlive any one bad round
            log.exception("console sampler: a round failed")

    async def pause(self) -> None:
        await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - self._began)))


class Sampler:
    def __init__(self, client: ConsoleClient, interval_s: float, keep: int,
                 rounds: Counter | None = None) -> None:
        self.client = client
        self.rounds_done = rounds  # tidemq_console_sample_rounds
        self.interval_s = interval_s
        self.keep = keep
        self.brokers: dict[str, deque[BrokerSample]] = {}  # address → last two samples
        self.lag: dict[str, deque[tuple[int, int]]] = {}  # group → ring of (epoch ms, lag)
        self.errors: list[str] = []  # what the last round could not read
        self.rounds = 0
        self._loop = _Rounds(self)
        self._gate = asyncio.Semaphore(CONCURRENCY)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def sample(self) -> None:
        """One round: every broker's metrics and every group's lag (from the primaries)."""
        errors: list[str] = []
        try:
            brokers = await self.client.brokers(primaries_only=False)
        except ApiError as exc:
            self.errors = [str(exc)]
            return
        lags: dict[str, int] = {}
        await asyncio.gather(*(self._broker(b, lags, errors) for b in brokers))
        now = int(time.time() * 1000)
        for group, lag in lags.items():
            self.lag.setdefault(group, deque(maxlen=self.keep)).append((now, lag))
        self.errors = errors
        self.rounds += 1
        if self.rounds_done is not None:
            self.rounds_done.inc()

    async def _broker(self, b: LiveBroker, lags: dict[str, int], errors: list[str]) -> None:
        try:
            async with self._gate:
                resp = await self.client.http.get(f"{b.address}/metrics")
                resp.raise_for_status()
            sample = parse_metrics(resp.text, time.monotonic())
            self.brokers.setdefault(b.address, deque(maxlen=2)).append(sample)
        except Exception as exc:  # httpx, or a malformed exposition
            errors.append(f"{b.name}: metrics: {type(exc).__name__}: {exc}")
        if b.role != "primary":
            return  # a replica answers its primary's group offsets: counted once
        try:
            async with self._gate:
                groups = await self.client.call("GET", f"{b.address}/v1/groups")
            names = sorted(str(g["group"]) for g in groups.get("groups", []))[:MAX_GROUPS]
            totals = await asyncio.gather(*(self._group_lag(b, g) for g in names))
            for g, total in zip(names, totals, strict=True):
                lags[g] = lags.get(g, 0) + total
        except ApiError as exc:
            errors.append(f"{b.name}: lag: {exc}")

    async def _group_lag(self, b: LiveBroker, group: str) -> int:
        async with self._gate:
            answer = await self.client.call("GET",
                                            f"{b.address}/v1/groups/{segment(group)}/offsets")
        return sum(int(o.get("lag", 0)) for o in answer.get("offsets", []))

    def rates(self, address: str) -> Rates | None:
        pair = self.brokers.get(address)
        return rates(pair) if pair else None

    def history(self, group: str) -> list[tuple[int, int]]:
        return list(self.lag.get(group, ()))
