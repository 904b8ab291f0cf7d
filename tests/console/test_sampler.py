"""The console's sampler and charts as functions: a broker's /metrics exposition (as
prometheus_client writes it) read into a sample, rates over two samples, and the timers
histogram's contiguous window."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tests.support.wait import wait_until_async
from tidemq_server.console.charts import DAY_MS, HOUR_BARS, HOUR_MS, line_chart, timer_bars
from tidemq_server.console.client import ConsoleClient
from tidemq_server.console.sampler import BrokerSample, Sampler, parse_metrics, rates


def exposition(sent: dict[str, int], pulled: dict[str, int], received: int, log: tuple[int, int],
               disk: float) -> str:
    r = CollectorRegistry()
    put = Counter("tidemq_broker_messages_put", "x", ["topic"], registry=r)
    got = Counter("tidemq_broker_pulled_messages", "x", ["topic"], registry=r)
    for t, n in sent.items():
        put.labels(t).inc(n)
    for t, n in pulled.items():
        got.labels(t).inc(n)
    Counter("tidemq_broker_simple_delivered", "x", registry=r).inc(received)
    Gauge("tidemq_broker_store_commitlog_min_offset", "x", registry=r).set(log[0])
    Gauge("tidemq_broker_store_commitlog_max_offset", "x", registry=r).set(log[1])
    Gauge("tidemq_broker_store_disk_used_ratio", "x", registry=r).set(disk)
    Gauge("tidemq_broker_unrelated", "x", registry=r).set(7)
    Gauge("tidemq_service_start_time_seconds", "x", registry=r).set(1_800_000_000)
    return generate_latest(r).decode()


def test_rates_over_two_samples() -> None:
    first = parse_metrics(exposition({"A": 10, "B": 5}, {"A": 4}, 2, (100, 1100), 0.25), 10.0)
    assert first.sent == {"A": 10, "B": 5} and first.consumed == {"A": 4}
    assert first.log_bytes == 1000 and first.disk_used_ratio == 0.25
    assert first.started_s == 1_800_000_000
    pair: deque[BrokerSample] = deque([first], maxlen=2)
    one = rates(pair)
    assert one is not None and one.send is None and one.log_bytes == 1000  # one sample: no rate
    pair.append(parse_metrics(exposition({"A": 30, "B": 5, "C": 4}, {"A": 14}, 6,
                                         (100, 3100), 0.5), 12.0))
    two = rates(pair)
    assert two is not None
    assert two.send == (20 + 0 + 4) / 2 and two.receive == (10 + 4) / 2
    assert two.by_topic["A"] == (10.0, 5.0) and two.by_topic["C"] == (2.0, 0.0)
    assert two.log_bytes == 3000 and two.disk_used_ratio == 0.5
    assert two.started_s == 1_800_000_000  # the broker's start, for its uptime


def test_timer_bars_are_contiguous_and_count_what_lies_beyond() -> None:
    start = 1_800_000_000_000 - 1_800_000_000_000 % DAY_MS
    buckets = [{"start_ms": start, "count": 3}, {"start_ms": start + 2 * HOUR_MS, "count": 1},
               {"start_ms": start + (HOUR_BARS + 5) * HOUR_MS, "count": 4}]
    chart, beyond = timer_bars(buckets, "hour")
    assert len(chart.bars) == HOUR_BARS and beyond == 4
    assert [b.h for b in chart.bars[:3]] == [100, 0, 33] and chart.peak == 3
    days, beyond = timer_bars([{"start_ms": start, "count": 4},
                               {"start_ms": start + 2 * DAY_MS, "count": 1}], "day")
    assert [b.title.split(": ")[1] for b in days.bars] == ["4 timer(s)", "0 timer(s)",
                                                           "1 timer(s)"]
    assert beyond == 0


def test_line_chart_spans_the_samples() -> None:
    chart = line_chart([(1000, 0), (2000, 5), (3000, 10)], width=250)
    assert [x for x, _, _ in chart.dots] == [40, 140, 240]
    assert [y for _, y, _ in chart.dots] == [105, 55, 5] and chart.peak == 10
    assert line_chart([]).points == ""


class FlakySampler(Sampler):
    """A sampler whose first round fails; it counts the rounds it was asked for."""

    def __init__(self) -> None:
        super().__init__(cast(ConsoleClient, None), interval_s=0.01, keep=4)
        self.asked = 0

    async def sample(self) -> None:
        self.asked += 1
        if self.asked == 1:
            raise RuntimeError("the first round breaks")


async def test_the_sampler_outlives_a_failed_round_and_stops() -> None:
    sampler = FlakySampler()
    sampler.start()
    await wait_until_async(lambda: sampler.asked >= 3, what="rounds after the failed one")
    await sampler.stop()
    asked = sampler.asked
    await asyncio.sleep(0.05)  # five intervals: a loop still running would sample again
    assert sampler.asked == asked
