"""Riding over a lost broker group: per-broker back-off, and the retry decisions of one send.

``BrokerHealth`` keeps, per broker, a "not available until" time (RocketMQ's latency fault
tolerance, driven by failures). A failure makes the broker unavailable for
``initial_s * 2 ** (failures in a row - 1)``, capped at ``max_s``; failures reported while it
is already unavailable (the other requests of the same outage) do not count again. Once the time
has passed, producers let one request through as a probe (``claim``): while it is out, the
others keep avoiding the broker. A success forgets everything.

``SendAttempts`` decides what a failed send (one message, or one batch) does next:

- nothing was stored — no connection could be opened, the broker answered 503 (busy,
  unavailable, disk full) or does not have the topic: try another group at once (503
  NOT_PRIMARY and NOT_ENOUGH_REPLICAS excepted: a primary answers them also for a record it
  wrote before its fence shut or its replicas failed to confirm it — "maybe stored");
- it may have been stored — the request was sent and the answer was lost (timeout, reset,
  500/502/504): send it to the *same* broker once more right away. The broker answers a repeated
  ``message_id`` with the first result (within its dedup window, across its restarts), so a
  message that was stored is not stored again. While the group keeps failing that way (it is
  alive but slow or erring: timeouts, resets, 5xx), the send keeps to it (at its current
  primary, with back-off) for ``MAYBE_STORED_STICK_S`` (at most half the deadline) before it may
  move. When the group stops taking connections (its process is down: killed, or restarting
  for seconds or for good) the send moves to another group at once, for availability: the one
  case where two groups may each hold a copy (``uncertain``, counted by the producers in
  ``possible_duplicates``). That residual risk needs a group that stored the message, lost the
  answer and then refused connections: a crash (SIGKILL) with that send in flight; a graceful
  stop (SIGTERM) answers what it took first. With one group nothing moves, so nothing is
  stored twice: the retries meet the restarted broker's dedup;
- a pinned send (explicit queue id, or a sharding key without ``ordered_failover``) never moves:
  it is retried on its own queue with back-off until the deadline;
- an answer that is final for that broker for now (topic missing, disk full) moves a send to
  another group; TOPIC_NOT_FOUND is raised when there is none, while DISK_FULL is retried like
  BROKER_BUSY until the deadline (a disk fills and frees as retention or an operator acts; a
  call that cannot move, such as a cancel or a pinned send, would otherwise fail through a
  transient full disk);
- when every group has failed this send, pause (the retry policy's back-off, capped at about a
  second, honouring ``Retry-After``) and start over, until the policy's one deadline, measured
  from the send's first attempt (``max_attempts``, None by default, may bound it further);
- a failure that means "this group is replacing its primary" (``electing``: the group has
  replicas and its primary cannot be reached, or it answers NOT_PRIMARY / NOT_ENOUGH_REPLICAS)
  is waited out: the send polls for the new primary every ``PRIMARY_WAIT_POLL_S`` until the
  deadline, whatever ``max_attempts`` says. A NOT_PRIMARY answer naming a primary the route
  knows (``primary_hint``) is followed at once (``moved``), without waiting for the nameservers.

The error a send finally raises says how many attempts it made over how long (``gave_up``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import Enum

from tidemq._constants import MAYBE_STORED_STICK_S, PRIMARY_WAIT_POLL_S
from tidemq._exceptions import (
    NotEnoughReplicasError,
    NotPrimaryError,
    ServerError,
    TidemqError,
    TopicNotFoundError,
    TransportError,
)
from tidemq._retry import RetryPolicy, gave_up

log = logging.getLogger("tidemq.fault")

_UNAVAILABLE_STATUS = 503  # busy, unavailable or disk full: refused, nothing stored
# a replica's NOT_PRIMARY message names its group's primary (services/broker/replication/role.py)
_PRIMARY_IS = re.compile(r"the primary is (\S+?)[.;,)]?(?:\s|$)")
_MAX_FOLLOWS = 3  # NOT_PRIMARY hints followed at once per send (two confused brokers: no ping-pong)


@dataclass(slots=True)
class _Entry:
    failures: int  # in a row
    until: float  # unavailable before this (clock seconds)
    probing_until: float = 0.0  # a probe is out until this


class BrokerHealth:
    """Per-broker availability, keyed by whatever the caller uses (a broker name or address)."""

    def __init__(self, *, initial_s: float, max_s: float, probe_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.probe_timeout_s = probe_timeout_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    def __bool__(self) -> bool:
        """True while some broker has failures on record (the send path checks this first)."""
        return bool(self._entries)

    def usable(self, broker: str) -> bool:
        """Not backing off, and no probe out."""
        entry = self._entries.get(broker)
        if entry is None:
            return True
        now = self._clock()
        return now >= entry.until and now >= entry.probing_until

    def claim(self, broker: str) -> None:
        """A request is about to go to ``broker``: if it is failing, this one is the probe."""
        entry = self._entries.get(broker)
        if entry is not None:
            entry.probing_until = self._clock() + self.probe_timeout_s

    def wait_s(self, broker: str) -> float:
        """Seconds until ``broker`` may be tried again (0 when it may be now)."""
        entry = self._entries.get(broker)
        return 0.0 if entry is None else max(0.0, entry.until - self._clock())

    def failures(self, broker: str) -> int:
        entry = self._entries.get(broker)
        return 0 if entry is None else entry.failures

    def failed(self, broker: str) -> bool:
        """Record a failure; True when ``broker`` was fine until now (log that one loudly)."""
        now = self._clock()
        entry = self._entries.get(broker)
        if entry is not None and now < entry.until:
            return False  # the same outage, seen by another request
        failures = 1 if entry is None else entry.failures + 1
        pause = min(self.max_s, self.initial_s * 2 ** (failures - 1))
        self._entries[broker] = _Entry(failures, now + pause)
        return entry is None

    def succeeded(self, broker: str) -> bool:
        """Forget the failures of ``broker``; True when it had some (it is back)."""
        return self._entries.pop(broker, None) is not None


class Outcome(Enum):
    NOT_STORED = "not stored"  # the request cannot have been acted on: any group may take it
    MAYBE_STORED = "maybe stored"  # sent, answer lost: the same broker first
    FINAL = "final"  # not retriable: the caller gets it


def outcome(exc: BaseException) -> Outcome:
    """How a failed send ended, for ``SendAttempts``."""
    if isinstance(exc, TransportError):
        return Outcome.MAYBE_STORED if exc.sent else Outcome.NOT_STORED
    if isinstance(exc, TopicNotFoundError):
        return Outcome.NOT_STORED  # this broker lacks the topic; another group may have it
    if isinstance(exc, NotEnoughReplicasError | NotPrimaryError):
        # the primary may have written it before its replicas failed to confirm, or before its
        # fence shut (a lease renewal late: the write gate answers NOT_PRIMARY after the
        # write): once the copies catch up the record counts, so another group must not store
        # one; the retry keeps to the group, whose successor's dedup meets it
        return Outcome.MAYBE_STORED
    if isinstance(exc, ServerError) and exc.status == _UNAVAILABLE_STATUS:
        return Outcome.NOT_STORED
    if isinstance(exc, TidemqError) and exc.retriable:
        return Outcome.MAYBE_STORED  # 500/502/504: the broker may have stored it first
    return Outcome.FINAL


def primary_hint(exc: BaseException) -> str | None:
    """The primary a NOT_PRIMARY answer names (a base URL), if it names one."""
    if not isinstance(exc, NotPrimaryError):
        return None
    found = _PRIMARY_IS.search(exc.message)
    if found is None or found.group(1) in ("unknown", "None"):
        return None
    return found.group(1)


def electing(exc: BaseException, replicated: bool) -> bool:
    """Whether ``exc`` means the group is replacing (or re-gathering behind) its primary."""
    if isinstance(exc, NotPrimaryError | NotEnoughReplicasError):
        return True
    return replicated and outcome(exc) is not Outcome.FINAL


class Step(Enum):
    SAME = "same"  # send to the same queue again now (at its group's current address)
    SELECT = "select"  # select a queue again, avoiding ``SendAttempts.tried``


class SendAttempts:
    """The retry state of one send; ``after_failure`` raises when the send must give up."""

    def __init__(self, health: BrokerHealth, policy: RetryPolicy, *, movable: bool,
                 first: str, what: str, started: float | None = None) -> None:
        self.health = health
        self.policy = policy
        self.movable = movable
        self.first = first  # the group of the first attempt
        self.what = what  # for logs: "message <id>", "batch of 12"
        self.tried: set[str] = set()  # groups that failed this send since the last pause
        self.uncertain: set[str] = set()  # groups that may hold a copy
        self._same_done: set[str] = set()
        self._attempts = 1
        self._pauses = 0
        self._follows = 0
        # the one deadline runs from the send's first attempt (``started``: its monotonic time)
        self._started = time.monotonic() if started is None else started
        deadline = policy.deadline_s
        self._stick_s = MAYBE_STORED_STICK_S if deadline is None else min(MAYBE_STORED_STICK_S,
                                                                          deadline / 2)

    @property
    def attempts(self) -> int:
        return self._attempts

    def duplicated_on(self, stored_on: str) -> bool:
        """After success on ``stored_on``: whether another group may hold a copy too."""
        return bool(self.uncertain - {stored_on})

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    async def after_failure(self, exc: TidemqError, broker: str,
                            groups: Collection[str], *, replicated: bool = False,
                            moved: bool = False) -> Step:
        """What to do after ``exc`` from ``broker``; ``groups`` are the route's writable ones;
        ``replicated``: ``broker``'s group has replicas (a lost primary gets a successor);
        ``moved``: the group's route names a new primary already (a NOT_PRIMARY hint): try it
        at once. Raises ``exc`` (saying how long it tried) when the send must give up."""
        kind = outcome(exc)
        waiting = electing(exc, replicated) and self.policy.deadline_s is not None
        limit = self.policy.max_attempts
        made = self._attempts  # attempts so far, the failed one included
        if kind is Outcome.FINAL:
            raise gave_up(exc, made, self.elapsed_s())
        if limit is not None and made >= limit and not waiting:
            raise gave_up(exc, made, self.elapsed_s(), f"max_attempts={limit}")
        self._attempts += 1
        if moved and self._follows < _MAX_FOLLOWS:
            self._follows += 1
            log.debug("%s: %s names a new primary of its group: sending there", self.what, broker)
            return Step.SAME
        if kind is Outcome.MAYBE_STORED:
            self.uncertain.add(broker)
            if broker not in self._same_done:
                self._same_done.add(broker)
                return Step.SAME
        if not isinstance(exc, TopicNotFoundError) and self.health.failed(broker):
            log.warning("broker %s failed (%s); sends avoid it for %.1fs, then probe it",
                        broker, exc, self.health.wait_s(broker))
        self.tried.add(broker)
        # a live group that may hold the message is preferred for a while: no second copy; so
        # is a replicated one that may hold it, while its successor is elected (the successor
        # has the copy, or the copy was never acknowledged and is gone)
        sticky = self.elapsed_s() < self._stick_s and (
            kind is Outcome.MAYBE_STORED or (replicated and broker in self.uncertain))
        if self.movable and not sticky and any(g not in self.tried for g in groups):
            log.debug("%s: %s on %s (%s), trying another group", self.what, kind.value, broker,
                      exc)
            return Step.SELECT
        if not exc.retriable:
            raise gave_up(exc, made, self.elapsed_s())
        pause = self.policy.backoff_s(self._pauses + 1, getattr(exc, "retry_after", None))
        if waiting:
            pause = min(pause, PRIMARY_WAIT_POLL_S)  # the new primary is a route refresh away
        elapsed = self.elapsed_s()
        deadline = self.policy.deadline_s
        if deadline is not None and elapsed + pause > deadline:
            raise gave_up(exc, made, elapsed, f"retry deadline {deadline:g}s")
        self._pauses += 1
        log.debug("%s: every group failed (last %s: %s); again in %.3fs", self.what, broker,
                  exc, pause)
        await asyncio.sleep(pause)
        self.tried.clear()
        self._same_done.clear()
        return Step.SAME if sticky else Step.SELECT
