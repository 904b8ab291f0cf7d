"""The checker's scan as a plain class, against an in-memory broker: the decision table,
stopping at the first copy not yet due, paging, progress per page, a crash mid-scan."""

from __future__ import annotations

from typing import Any

import pytest

from tidemq_server.checker.scanner import CheckScanner, Decision, ScanConfig, decide
from tidemq_server.common.constants import CHECKER_FLOOR_OWNER

CFG = ScanConfig(immunity_ms=1000, check_max=3, max_age_ms=100_000, batch_size=2)


def entry(offset: int, txid: str, *, born: int = 0, stored: int | None = None, times: int = 0,
          immunity: float | None = None) -> dict[str, Any]:
    return {"queue_offset": offset, "physical_offset": offset * 100, "transaction_id": txid,
            "message_id": "m-" + txid, "producer_group": "g", "topic": "t",
            "check_times": times, "born_ms": born,
            "store_timestamp_ms": born if stored is None else stored,
            "check_immunity_s": immunity}


@pytest.mark.parametrize(("e", "now", "done", "expected"), [
    (entry(0, "a"), 500, True, Decision.SKIP),
    (entry(0, "a"), 500, False, Decision.WAIT),  # younger than the immunity
    (entry(0, "a"), 1000, False, Decision.CHECK),
    (entry(0, "a", immunity=5), 2000, False, Decision.DEFER),  # its own, longer immunity
    (entry(0, "a", immunity=5, stored=1500), 2000, False, Decision.WAIT),  # deferred lately
    (entry(0, "a", immunity=5, stored=4000), 5000, False, Decision.CHECK),  # counted from born
    (entry(0, "a", immunity=0.1), 200, False, Decision.CHECK),  # a shorter one too
    (entry(0, "a", times=1, stored=9500), 10_000, False, Decision.WAIT),  # since the last check
    (entry(0, "a", times=2, stored=9000), 10_000, False, Decision.CHECK),
    (entry(0, "a", times=3, stored=9000), 10_000, False, Decision.DISCARD),  # had check_max
    (entry(0, "a"), 100_001, False, Decision.DISCARD),  # too old
])
def test_decide(e: dict[str, Any], now: int, done: bool, expected: Decision) -> None:
    assert decide(e, now, CFG, done) is expected


class FakeBroker:
    """A half queue, an op queue and the broker's answers to actions (re-puts at the end)."""

    def __init__(self, entries: list[dict[str, Any]], ops: list[str] | None = None) -> None:
        self.queue = entries
        self.op_queue = list(ops or [])
        self.acts: list[list[dict[str, Any]]] = []
        self.floors: list[int] = []
        self.fail_act_after = -1
        self.clock_ms = 10_000

    async def halves(self, offset: int, max_count: int) -> dict[str, Any]:
        page = self.queue[offset:offset + max_count]
        nxt = offset + len(page)
        return {"entries": page, "next_offset": nxt, "min_offset": 0,
                "max_offset": len(self.queue),
                "next_physical_offset": nxt * 100}

    async def ops(self, offset: int, max_count: int) -> dict[str, Any]:
        page = self.op_queue[offset:offset + max_count]
        return {"transaction_ids": page, "next_offset": offset + len(page),
                "max_offset": len(self.op_queue), "next_physical_offset": 10**9}

    async def act(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.fail_act_after == len(self.acts):
            raise ConnectionError("killed")
        self.acts.append(actions)
        out = []
        for a in actions:
            if a["action"] == "check":
                old = next(e for e in self.queue if e["physical_offset"] == a["physical_offset"])
                self.queue.append(entry(len(self.queue), a["transaction_id"], born=old["born_ms"],
                                        stored=self.clock_ms, times=old["check_times"] + 1))
            out.append({"transaction_id": a["transaction_id"], "outcome": {
                "check": "checked", "discard": "discarded", "defer": "deferred"}[a["action"]]})
        return out

    async def retention_floor(self, owner: str, physical_offset: int) -> None:
        assert owner == CHECKER_FLOOR_OWNER
        self.floors.append(physical_offset)


class MemoryProgress:
    def __init__(self) -> None:
        self.saved: list[tuple[int, int]] = []  # (half, op)
        self.op_from = 0

    async def load(self) -> tuple[int, int, int]:
        half, op = self.saved[-1] if self.saved else (0, 0)
        return half, op, min(self.op_from, op)

    async def save(self, half: int, op: int, op_from: int) -> None:
        self.saved.append((half, op))
        self.op_from = op_from


async def test_scan_checks_due_halves_and_stops_at_the_first_young_one() -> None:
    broker = FakeBroker([entry(0, "a"), entry(1, "b"), entry(2, "c"), entry(3, "d", born=9500),
                         entry(4, "e")], ops=["b"])
    progress = MemoryProgress()
    scanner = CheckScanner(broker, progress, CFG, clock=lambda: 10.0)
    report = await scanner.scan()
    assert [[a["transaction_id"] for a in page] for page in broker.acts] == [["a"], ["c"]]
    assert (report.checked, report.ended, report.stopped_early) == (2, 1, True)
    assert scanner.half_offset == 3  # "d" is not due: it and everything after wait
    assert progress.saved[-1] == (3, 1) and broker.floors[-1] == 300
    assert len(progress.saved) == 2  # one save per page
    # later: "d" and "e" are due; the re-puts of "a" and "c" (checked at 10 s) are not
    report = await CheckScanner(broker, progress, CFG, clock=lambda: 10.6).scan()
    assert [a["transaction_id"] for a in broker.acts[-1]] == ["d", "e"]
    assert report.half_offset == 5


async def test_scan_discards_after_check_max_and_defers_own_immunity() -> None:
    broker = FakeBroker([entry(0, "x", times=3, stored=8000), entry(1, "y", born=9000,
                                                                     immunity=30)])
    report = await CheckScanner(broker, MemoryProgress(), CFG, clock=lambda: 10.0).scan()
    assert [(a["transaction_id"], a["action"]) for page in broker.acts for a in page] == \
        [("x", "discard"), ("y", "defer")]
    assert (report.discarded, report.deferred) == (1, 1)


async def test_a_crash_mid_scan_repeats_at_most_the_page_it_was_in() -> None:
    broker = FakeBroker([entry(i, f"t{i}") for i in range(6)])
    progress = MemoryProgress()
    broker.fail_act_after = 1  # the second page's request dies with the checker
    with pytest.raises(ConnectionError):
        await CheckScanner(broker, progress, CFG, clock=lambda: 10.0).scan()
    assert progress.saved == [(2, 0)]
    broker.fail_act_after = -1
    restarted = CheckScanner(broker, progress, CFG, clock=lambda: 10.0)
    await restarted.scan()
    asked = [a["transaction_id"] for page in broker.acts for a in page]
    assert asked == ["t0", "t1", "t2", "t3", "t4", "t5"]  # page 2 was never applied: asked once
    assert restarted.half_offset == 6


async def test_progress_past_the_end_of_a_new_store_starts_over() -> None:
    broker = FakeBroker([entry(0, "a"), entry(1, "b")])
    progress = MemoryProgress()
    progress.saved.append((500, 0))  # saved against a store that was since wiped
    scanner = CheckScanner(broker, progress, CFG, clock=lambda: 10.0)
    await scanner.scan()
    assert [a["transaction_id"] for page in broker.acts for a in page] == ["a", "b"]
    assert scanner.half_offset == 2


async def test_ended_ids_are_held_for_a_time_not_a_number_of_scans() -> None:
    # many scans in quick succession (as when halves fall due often) keep what the op queue
    # said; the ids go once they are older than done_keep_ms (CFG: the default, 120 s)
    broker = FakeBroker([], ops=["a", "b"])
    now = [10.0]
    scanner = CheckScanner(broker, MemoryProgress(), CFG, clock=lambda: now[0])
    for _ in range(20):
        await scanner.scan()
        now[0] += 0.2
    assert scanner.done_size == 2
    now[0] += 120.0
    await scanner.scan()
    assert scanner.done_size == 0


async def test_a_restarted_checker_reads_its_ended_ids_again() -> None:
    # "a" and "b" were ended (op records) while a young copy ("y") held the scan before them
    broker = FakeBroker([entry(0, "y", born=9500), entry(1, "a"), entry(2, "b")],
                        ops=["x", "a", "b"])
    progress = MemoryProgress()
    first = CheckScanner(broker, progress, CFG, clock=lambda: 10.0)
    await first.scan()
    assert broker.acts == [] and first.half_offset == 0  # "y" is not due: nothing passed
    assert progress.saved[-1] == (0, 3) and progress.op_from == 0
    # the checker restarts; later "y" is due, and no op record is new
    restarted = CheckScanner(broker, progress, CFG, clock=lambda: 11.0)
    report = await restarted.scan()
    assert restarted.rebuilt == 3
    assert [a["transaction_id"] for page in broker.acts for a in page] == ["y"]
    assert report.ended == 2  # "a" and "b" skipped as ended, not checked again


async def test_op_from_moves_on_as_held_ids_are_forgotten() -> None:
    now = [10.0]
    cfg = ScanConfig(immunity_ms=1000, check_max=3, max_age_ms=100_000, batch_size=2,
                     done_keep_ms=1000)
    broker = FakeBroker([], ops=["a", "b"])
    progress = MemoryProgress()
    scanner = CheckScanner(broker, progress, cfg, clock=lambda: now[0])
    await scanner.scan()
    assert scanner.op_from == 0  # "a" and "b" are held, read from offset 0
    broker.op_queue.append("c")
    now[0] = 10.8
    await scanner.scan()
    assert scanner.op_from == 0
    now[0] = 11.5  # "a" and "b" (read at 10.0) are past done_keep_ms; "c" (10.8) is not
    await scanner.scan()
    assert scanner.op_from == 2 and progress.op_from == 2
    assert scanner.done_size == 1
