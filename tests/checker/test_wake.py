"""When the checker scans next: the sliding minimum of due times, the bounds of a sleep, and a
sleep that learns a new half message's due time from the held ``halves`` request."""

from __future__ import annotations

from typing import Any

from tests.checker.test_scanner import entry
from tidemq_server.checker.scanner import ScanConfig, due_ms
from tidemq_server.checker.wake import DueTimes, HalfWatch

CFG = ScanConfig(immunity_ms=6000, batch_size=4)


def test_due_times_is_the_minimum_of_what_the_scan_has_not_passed() -> None:
    dues = DueTimes()
    assert dues.earliest() is None
    for offset, due in ((0, 500), (1, 300), (2, 900), (3, 700)):
        dues.add(offset, due)
    assert dues.earliest() == 300
    dues.passed(2)
    assert dues.earliest() == 700
    dues.passed(4)
    assert dues.earliest() is None and len(dues) == 0


def test_due_of_a_copy_waiting_for_its_own_longer_immunity() -> None:
    # first check after its own 60 s; deferred once it has waited the timeout (6 s) in place
    assert due_ms(entry(0, "a", born=1000, stored=2000, immunity=60), CFG) == 8000
    assert due_ms(entry(0, "a", born=1000, immunity=2), CFG) == 3000  # a shorter one
    assert due_ms(entry(0, "a", born=1000, stored=5000, times=1), CFG) == 11_000


class Source:
    """A half queue on a simulated clock; ``arrivals`` are appended when the clock passes them
    (a held request returns at the first arrival, as the broker's does)."""

    def __init__(self, arrivals: list[tuple[float, dict[str, Any]]]) -> None:
        self.now = 100.0
        self.queue: list[dict[str, Any]] = []
        self.arrivals = arrivals
        self.requests: list[tuple[int, int]] = []

    def clock(self) -> float:
        return self.now

    async def halves(self, offset: int, max_count: int, wait_ms: int = 0) -> dict[str, Any]:
        self.requests.append((offset, wait_ms))
        if offset >= len(self.queue):
            until = self.now + wait_ms / 1000
            if self.arrivals and self.arrivals[0][0] <= until:
                at, e = self.arrivals.pop(0)
                self.now = max(self.now, at)
                self.queue.append(e)
            else:
                self.now = until
        page = self.queue[offset:offset + max_count]
        return {"entries": page, "next_offset": offset + len(page), "min_offset": 0,
                "max_offset": len(self.queue)}


def watch_of(source: Source) -> HalfWatch:
    return HalfWatch(source, CFG, min_sleep_s=0.2, slack_s=0.02, clock=source.clock)


def test_wake_at_is_bounded_by_the_least_sleep_and_the_interval() -> None:
    w = watch_of(Source([]))
    assert w.wake_at(100.0, 30.0) == 130.0  # nothing known: the interval
    w.dues.add(0, 101_000)
    assert w.wake_at(100.0, 30.0) == 101.02  # the due time plus the slack
    w.dues.add(1, 99_000)
    assert w.wake_at(100.0, 30.0) == 100.2  # already due: not sooner than the least sleep
    w.scanned(2)
    assert w.wake_at(100.0, 30.0) == 130.0 and w.offset == 2



def test_a_copy_due_sooner_behind_the_scans_stop_does_not_wake_it_early() -> None:
    w = watch_of(Source([]))
    w.scanned(0, head_due_ms=105_000)  # the scan stopped at a copy due at 105 s
    w.dues.add(0, 105_000)
    w.dues.add(1, 101_000)  # behind it, due sooner: the scan cannot reach it before 105 s
    assert w.wake_at(100.0, 30.0) == 105.02
    w.scanned(2)  # a later scan passed everything: no stop, back to the watched due times
    w.dues.add(3, 110_000)
    assert w.wake_at(100.0, 30.0) == 110.02

async def test_sleep_wakes_for_a_half_that_arrives_meanwhile() -> None:
    # a half born at 101 s with a 2 s immunity arrives while the checker sleeps for 30 s
    source = Source([(101.0, entry(0, "a", born=101_000, immunity=2))])
    w = watch_of(source)
    await w.sleep(30.0)
    assert abs(source.now - 103.02) < 1e-6
    assert source.requests[0] == (0, 30_000)  # held at the end of the queue


async def test_sleep_without_halves_is_the_interval() -> None:
    source = Source([])
    await watch_of(source).sleep(30.0)
    assert source.now == 130.0
