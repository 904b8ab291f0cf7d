"""One scan of a broker's half queue: the checker's whole job, as a plain class tests call.

A scan (RocketMQ's ``TransactionalMessageCheckService``, reshaped):

1. reads the op queue from its progress: every transaction id ended since, into ``done``;
2. walks the half queue from its progress up to the end seen when the scan began, page by page.
   For each half copy, in order:

   - its transaction is in ``done`` → skip it (ended);
   - not due yet → stop the scan here, since later copies are younger — except a first check
     held back by the message's own, longer ``check_immunity_s``: once that copy has waited the
     transaction timeout at its place, it is *deferred* (re-put at the end of the queue,
     unchanged) so it does not hold up the others;
   - checked ``check_max`` times already, or older than ``max_age_s`` → *discard*;
   - else → *check*: the broker re-puts it with check count + 1 and hands the check to one live
     producer of its group.

   A half copy is due ``transaction_timeout_ms`` (or its own immunity) after it was born for the
   first check, and that long after the previous check's copy for the next ones.
3. after each page: the page's decisions go to the broker in one request, then the progress is
   saved in Redis and reported to the broker as the checker's retention floor.

A checked or deferred message is re-put at the end of the half queue, so everything before the
progress is resolved or has a newer copy after it: a scan costs in proportion to what is new or
pending, never to the whole log. Killed at any moment, the checker repeats at most one page, and
the broker refuses decisions on copies it has already replaced (``superseded``).

The ended ids (``done``) are memory, held ``done_keep_ms``; the progress also keeps ``op_from``,
the op-queue offset from which every id still held was read. A restarted checker reads the op
queue again from there up to its progress before its first scan, so it knows what it knew: the
halves ended before the restart are skipped, not checked once more.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from tidemq_server.common.constants import CHECKER_FLOOR_OWNER

log = logging.getLogger(__name__)

OP_PAGE = 2048
MAX_DONE = 1_000_000  # ended transaction ids held at most
PRUNES_PER_KEEP = 4  # ended ids are pruned this many times per ``done_keep_ms``


class Decision(StrEnum):
    SKIP = "skip"  # already ended (op record seen)
    WAIT = "wait"  # not due: stop the scan here
    DEFER = "defer"  # not due by its own immunity: re-put at the end, no check counted
    CHECK = "check"
    DISCARD = "discard"


class ScanBroker(Protocol):
    async def halves(self, offset: int, max_count: int) -> dict[str, Any]: ...
    async def ops(self, offset: int, max_count: int) -> dict[str, Any]: ...
    async def act(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    async def retention_floor(self, owner: str, physical_offset: int) -> None: ...


class Progress(Protocol):
    async def load(self) -> tuple[int, int, int]: ...  # (half, op, op_from)
    async def save(self, half: int, op: int, op_from: int) -> None: ...


@dataclass(frozen=True, slots=True)
class ScanConfig:
    immunity_ms: int = 6_000  # first check this long after a half message was stored
    check_max: int = 15  # checks before discarding
    max_age_ms: int = 72 * 3600 * 1000  # discard half messages older than this
    batch_size: int = 512  # half copies per page
    # an ended transaction id (read from the op queue) is held this long at least (ms): four
    # check intervals, as when the checker scanned once per interval; scans now run as often as
    # halves fall due, so a count of scans would forget ids a re-put copy still needs
    done_keep_ms: int = 120_000


@dataclass(slots=True)
class ScanReport:
    examined: int = 0
    ended: int = 0  # skipped: their op record was seen
    checked: int = 0
    deferred: int = 0
    discarded: int = 0
    stale: int = 0  # the broker answered ended / superseded / not_found
    no_producer: int = 0  # checks counted while no producer of the group was alive
    stopped_early: bool = False
    head_due_ms: int | None = None  # when the copy the scan stopped at falls due (wall ms)
    half_offset: int = 0
    half_end: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def first_wait_ms(entry: dict[str, Any], cfg: ScanConfig) -> int:
    """How long after its birth a half message is first checked: its own immunity, if any."""
    own = entry.get("check_immunity_s")
    return int(own * 1000) if own is not None else cfg.immunity_ms


def check_due_ms(entry: dict[str, Any], cfg: ScanConfig) -> int:
    """When a half copy may be checked (wall ms): ``first_wait_ms`` after birth for the first
    check, the transaction timeout after the previous check's copy was stored for the next."""
    if int(entry.get("check_times") or 0) == 0:
        return int(entry["born_ms"]) + first_wait_ms(entry, cfg)
    return int(entry["store_timestamp_ms"]) + cfg.immunity_ms


def _deferrable(entry: dict[str, Any], cfg: ScanConfig) -> bool:
    """A first check held back by the message's own immunity, longer than the timeout."""
    return int(entry.get("check_times") or 0) == 0 and first_wait_ms(entry, cfg) > cfg.immunity_ms


def due_ms(entry: dict[str, Any], cfg: ScanConfig) -> int:
    """When a scan next acts on a half copy (wall ms): checks it, or defers it once the copy has
    waited the transaction timeout at its place (so a copy is re-put at most once per timeout,
    however often the checker scans; copies behind it are not due before that anyway)."""
    due = check_due_ms(entry, cfg)
    if _deferrable(entry, cfg):
        due = min(due, int(entry["store_timestamp_ms"]) + cfg.immunity_ms)
    return due


def decide(entry: dict[str, Any], now_ms: int, cfg: ScanConfig, done: bool) -> Decision:
    """What to do with one half copy (pure: the whole policy is here)."""
    if done:
        return Decision.SKIP
    if now_ms < check_due_ms(entry, cfg):
        return Decision.DEFER if now_ms >= due_ms(entry, cfg) else Decision.WAIT
    if (int(entry.get("check_times") or 0) >= cfg.check_max
            or now_ms - int(entry["born_ms"]) > cfg.max_age_ms):
        return Decision.DISCARD
    return Decision.CHECK


class CheckScanner:
    def __init__(self, broker: ScanBroker, progress: Progress, cfg: ScanConfig,
                 clock: Callable[[], float] = time.time) -> None:
        self.broker = broker
        self.progress = progress
        self.cfg = cfg
        self.clock = clock
        self.half_offset = 0
        self.op_offset = 0
        self.loaded = False
        self.scans = 0
        self.floor = -1
        self._done: dict[str, float] = {}  # transaction id → clock() when its op was read
        self._pruned = clock()
        # (clock() at the end of a read of the op queue, the op offset it started at), for the
        # reads whose ids may still be held, oldest first
        self._op_marks: deque[tuple[float, int]] = deque()
        self.rebuilt = 0  # ended ids read again after a restart

    @property
    def op_from(self) -> int:
        """The op-queue offset from which every ended id still held was read."""
        return self._op_marks[0][1] if self._op_marks else self.op_offset

    @property
    def done_size(self) -> int:
        return len(self._done)

    async def scan(self) -> ScanReport:
        began = time.perf_counter()
        if not self.loaded:
            self.half_offset, self.op_offset, op_from = await self.progress.load()
            self.loaded = True
            log.info("checker progress: half queue offset %d, op queue offset %d",
                     self.half_offset, self.op_offset)
            await self._rebuild(op_from)
        self.scans += 1
        report = ScanReport()
        op_floor = await self._read_ops()
        self._prune()  # before the pages: the progress they save names the ids still held
        page = await self.broker.halves(self.half_offset, self.cfg.batch_size)
        end = int(page["max_offset"])
        if self.half_offset > end:  # a new store under the same broker name: start over
            log.warning("half queue ends at %d, before the saved progress %d: scanning it "
                        "from the start", end, self.half_offset)
            self.half_offset = 0
            page = await self.broker.halves(0, self.cfg.batch_size)
        self.half_offset = max(self.half_offset, int(page["min_offset"]))
        report.half_end = end
        while True:
            stop, floor = await self._page(page, end, report)
            self.floor = min(floor, op_floor)
            await self.progress.save(self.half_offset, self.op_offset, self.op_from)
            await self.broker.retention_floor(CHECKER_FLOOR_OWNER, self.floor)
            if stop or self.half_offset >= end or not page["entries"]:
                report.stopped_early = stop
                break
            page = await self.broker.halves(self.half_offset, self.cfg.batch_size)
        report.half_offset = self.half_offset
        report.seconds = time.perf_counter() - began
        return report

    async def _rebuild(self, op_from: int) -> None:
        """After a restart: the ended ids read since ``op_from`` (the oldest still held when
        the progress was saved), up to the saved op offset, as if just read."""
        end, offset = self.op_offset, min(op_from, self.op_offset)
        start = offset
        while offset < end:
            page = await self.broker.ops(offset, min(OP_PAGE, end - offset))
            read_at = self.clock()
            ids = page["transaction_ids"]
            for txid in ids:
                self._done[txid] = read_at
            self.rebuilt += len(ids)
            nxt = int(page["next_offset"])
            if nxt <= offset:
                break  # the op queue was cut below the saved offset (retention): that is all
            offset = nxt
        if self.rebuilt:
            self._op_marks.append((self.clock(), start))
            log.info("checker restarted: %d ended transaction id(s) read again from op queue "
                     "offset %d", self.rebuilt, op_from)

    async def _read_ops(self) -> int:
        """Read the op queue to its end; the physical offset of the first op not yet read."""
        start = self.op_offset
        while True:
            page = await self.broker.ops(self.op_offset, OP_PAGE)
            read_at = self.clock()
            for txid in page["transaction_ids"]:
                self._done[txid] = read_at
            nxt = int(page["next_offset"])
            advanced = nxt > self.op_offset
            self.op_offset = nxt
            if not advanced or nxt >= int(page["max_offset"]):
                if self.op_offset > start:
                    self._op_marks.append((read_at, start))
                return int(page["next_physical_offset"])

    async def _page(self, page: dict[str, Any], end: int, report: ScanReport
                    ) -> tuple[bool, int]:
        """Decide one page and send the decisions; (stop here?, physical floor)."""
        now = int(self.clock() * 1000)
        actions: list[dict[str, Any]] = []
        stop = False
        nxt = int(page["next_offset"])
        floor = int(page["next_physical_offset"])
        for entry in page["entries"]:
            offset = int(entry["queue_offset"])
            if offset >= end:
                stop, nxt, floor = True, offset, int(entry["physical_offset"])
                break
            txid = entry["transaction_id"]
            decision = decide(entry, now, self.cfg, txid in self._done)
            if decision is Decision.WAIT:
                stop, nxt, floor = True, offset, int(entry["physical_offset"])
                report.head_due_ms = due_ms(entry, self.cfg)
                break
            report.examined += 1
            if decision is Decision.SKIP:
                self._done.pop(txid, None)
                report.ended += 1
                continue
            actions.append({"transaction_id": txid, "action": decision.value,
                            "physical_offset": int(entry["physical_offset"])})
        if actions:
            for result in await self.broker.act(actions):
                outcome = str(result.get("outcome"))
                report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
                if outcome == "checked":
                    report.checked += 1
                    if not result.get("producer_alive", True):
                        report.no_producer += 1
                elif outcome == "deferred":
                    report.deferred += 1
                elif outcome == "discarded":
                    report.discarded += 1
                    log.info("transaction %s discarded after %s check(s)",
                             result.get("transaction_id"), result.get("check_times"))
                else:
                    report.stale += 1
        self.half_offset = max(self.half_offset, nxt)
        return stop, floor

    def _prune(self) -> None:
        """Forget op ids read more than ``done_keep_ms`` ago (their copies were passed: an id
        still needed later costs one ``ended`` answer from the broker, nothing more); a walk
        over the ids a few times per ``done_keep_ms``, not at every scan."""
        now = self.clock()
        keep_s = self.cfg.done_keep_ms / 1000
        if len(self._done) <= MAX_DONE and now - self._pruned < keep_s / PRUNES_PER_KEEP:
            return
        self._pruned = now
        oldest = now - keep_s
        while self._op_marks and self._op_marks[0][0] < oldest:
            self._op_marks.popleft()  # every id that read gave is forgotten now
        kept = {t: at for t, at in self._done.items() if at >= oldest}
        if len(kept) > MAX_DONE:
            kept = dict(list(kept.items())[-MAX_DONE:])
        self._done = kept
