"""The transactional producer's side of the check channel: heartbeats and check long polls.

While started, a producer heartbeats every broker it knows (``POST /v1/producers/{group}/
heartbeat``) and long-polls each for checks (``GET /v1/producers/{group}/checks``). Each batch of
checks is answered concurrently by the listener's ``check_local_transaction`` and sent back as
one ``POST /v1/transactions/end`` with ``from_check: true``. Nothing needs an inbound port, and
any instance of the group may answer: checks survive a producer restart.

Brokers: the one ``broker_url``, or every broker the nameservers list (``GET /v1/cluster``,
asked of the last nameserver that answered first), plus any broker a half message went to. A
broker that cannot be reached is logged once when it goes and once when it is back; its poll
backs off meanwhile (``ERROR_PAUSE_S`` doubling up to ``MAX_ERROR_PAUSE_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tidemq._constants import NAMESERVER_TIMEOUT_S
from tidemq._exceptions import TidemqError, UnexpectedResponseError
from tidemq._http import NO_RETRY, HttpClient, normalize_address, url
from tidemq.protocol import ReceivedMessage

log = logging.getLogger("tidemq.transactions.checks")

#: ``check(message)`` → the action to answer: "commit", "rollback" or "unknown".
CheckFunction = Callable[[ReceivedMessage], Awaitable[str]]

ERROR_PAUSE_S = 1.0  # after a failed poll, doubling with each failure in a row
MAX_ERROR_PAUSE_S = 10.0  # cap of that pause
MAX_ANSWERING = 4  # batches of checks being answered at once per broker


class CheckPoller:
    def __init__(self, http: HttpClient, group: str, client_id: str, check: CheckFunction, *,
                 nameservers: Sequence[str] = (), broker_url: str | None = None,
                 heartbeat_s: float, wait_ms: int, max_checks: int, concurrency: int) -> None:
        self.http = http
        self.group = group
        self.client_id = client_id
        self.check = check
        self.nameservers = [normalize_address(n) for n in nameservers]
        self.heartbeat_s = heartbeat_s
        self.wait_ms = wait_ms
        self.max_checks = max_checks
        self._sem = asyncio.Semaphore(concurrency)
        self._brokers: set[str] = {normalize_address(broker_url)} if broker_url else set()
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._answering: set[asyncio.Task[None]] = set()
        self._beat: asyncio.Task[None] | None = None
        self._alive: set[str] = set()  # brokers that accepted a heartbeat since the last error
        self._down: set[str] = set()  # brokers reported unreachable (logged once)
        self._next_ns = 0  # the nameserver asked first: the last one that answered
        self.answered = 0  # checks answered (tests and stats)

    def start(self) -> None:
        if self._beat is None:
            self._beat = asyncio.create_task(self._heartbeats(), name="tidemq-tx-heartbeat")
            for broker in self._brokers:
                self._start_poller(broker)

    def add_broker(self, broker: str) -> None:
        if broker not in self._brokers:
            self._brokers.add(broker)
            if self._beat is not None:
                self._start_poller(broker)

    async def close(self, timeout_s: float) -> None:
        tasks = [t for t in (self._beat, *self._pollers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._answering:
            await asyncio.wait(set(self._answering), timeout=timeout_s)
        for broker in self._brokers:  # leave at once: the broker stops sending us checks
            with contextlib.suppress(TidemqError):
                await self.http.call("DELETE", url(broker, "v1", "producers", self.group,
                                                   "members", self.client_id), retry=NO_RETRY)

    def _start_poller(self, broker: str) -> None:
        self._pollers[broker] = asyncio.create_task(self._poll(broker),
                                                    name=f"tidemq-tx-checks-{broker}")

    async def _heartbeat(self, broker: str) -> None:
        await self.http.call("POST", url(broker, "v1", "producers", self.group, "heartbeat"),
                             body={"client_id": self.client_id}, retry=NO_RETRY)
        self._alive.add(broker)
        self._reachable(broker)

    async def _heartbeats(self) -> None:
        while True:
            await self._discover()
            for broker in sorted(self._brokers):
                try:
                    await self._heartbeat(broker)
                except TidemqError as exc:
                    self._alive.discard(broker)
                    self._unreachable(broker, "heartbeat", exc)
            await asyncio.sleep(self.heartbeat_s)

    def _unreachable(self, broker: str, what: str, exc: TidemqError) -> None:
        if broker in self._down:
            log.debug("producer %s: %s on %s failed again: %s", self.group, what, broker, exc)
            return
        self._down.add(broker)
        log.warning("producer %s: %s on %s failed: %s; retrying with back-off (checks of the "
                    "half messages it holds wait until it is back)", self.group, what, broker,
                    exc)

    def _reachable(self, broker: str) -> None:
        if broker in self._down:
            self._down.discard(broker)
            log.info("producer %s: broker %s is reachable again", self.group, broker)

    async def _discover(self) -> None:
        count = len(self.nameservers)
        for i in range(count):
            index = (self._next_ns + i) % count
            ns = self.nameservers[index]
            try:
                answer = await self.http.call(
                    "GET", url(ns, "v1", "cluster"), retry=NO_RETRY,
                    timeout_s=min(self.http.timeout_s, NAMESERVER_TIMEOUT_S))
            except TidemqError as exc:
                log.debug("nameserver %s: cluster lookup failed: %s", ns, exc)
                continue
            self._next_ns = index
            for b in answer.get("brokers") or [] if isinstance(answer, dict) else []:
                if isinstance(b, dict) and b.get("address"):
                    self.add_broker(normalize_address(str(b["address"])))
            return

    async def _poll(self, broker: str) -> None:
        target = url(broker, "v1", "producers", self.group, "checks")
        params: dict[str, str | int] = {"client_id": self.client_id, "max": self.max_checks,
                                        "wait_ms": self.wait_ms}
        timeout = self.wait_ms / 1000 + self.http.timeout_s
        failures = 0
        while True:
            try:
                if broker not in self._alive:
                    await self._heartbeat(broker)
                while len(self._answering) >= MAX_ANSWERING:
                    await asyncio.wait(set(self._answering), return_when=asyncio.FIRST_COMPLETED)
                began = time.monotonic()
                answer = await self.http.call("GET", target, params=params, binary=True,
                                              timeout_s=timeout, retry=NO_RETRY)
                checks = answer.get("checks") if isinstance(answer, dict) else None
                if not isinstance(checks, list):
                    raise UnexpectedResponseError(f"check poll answer from {broker} has no list")
            except TidemqError as exc:
                self._alive.discard(broker)
                self._unreachable(broker, "check poll", exc)
                failures += 1
                await asyncio.sleep(min(MAX_ERROR_PAUSE_S, ERROR_PAUSE_S * 2 ** (failures - 1)))
                continue
            failures = 0
            self._reachable(broker)
            if checks:
                task = asyncio.create_task(self._answer(broker, checks))
                self._answering.add(task)
                task.add_done_callback(self._answering.discard)
            elif time.monotonic() - began < self.wait_ms / 10_000:
                await asyncio.sleep(ERROR_PAUSE_S)  # answered empty at once: broker closing

    async def _answer(self, broker: str, checks: list[dict[str, Any]]) -> None:
        ends = await asyncio.gather(*(self._one(c) for c in checks))
        ends = [e for e in ends if e is not None]
        if not ends:
            return
        try:
            answer = await self.http.call("POST", url(broker, "v1", "transactions", "end"),
                                          body={"producer_group": self.group, "ends": ends})
        except TidemqError as exc:
            log.warning("producer %s: answering %d check(s) on %s failed: %s (they will be "
                        "checked again)", self.group, len(ends), broker, exc)
            return
        self.answered += len(ends)
        for r in answer.get("results") or [] if isinstance(answer, dict) else []:
            if isinstance(r, dict) and r.get("code"):
                log.debug("check answer for %s: %s %s", r.get("transaction_id"), r["code"],
                          r.get("message"))

    async def _one(self, check: dict[str, Any]) -> dict[str, Any] | None:
        try:
            txid = str(check["transaction_id"])
            message = ReceivedMessage.from_wire(check["message"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("producer %s: malformed check %r: %s", self.group, check, exc)
            return None
        async with self._sem:
            try:
                action = await self.check(message)
            except Exception:
                log.exception("producer %s: check_local_transaction failed for %s; answering "
                              "unknown", self.group, txid)
                action = "unknown"
        return {"transaction_id": txid, "action": action, "from_check": True}
