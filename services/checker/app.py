"""The checker process: a scan loop, its metrics, and a small HTTP surface.

``/healthz``, ``/metrics`` (``tidemq_checker_*``) and ``POST /internal/v1/scan`` (cluster token):
run one scan now and answer its report (tests, the benchmark, an operator in a hurry). The loop
itself is tiny; the work is ``CheckScanner.scan``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, Field
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.checker.progress import ProgressStore, ProgressUnavailable
from tidemq_server.checker.scanner import CheckScanner, ScanConfig, ScanReport
from tidemq_server.checker.settings import CheckerSettings
from tidemq_server.checker.wake import HalfWatch
from tidemq_server.common.app import create_app, reply, token_guard
from tidemq_server.common.auth import acl_gate, use_account
from tidemq_server.common.broker_client import BrokerClient, BrokerDown, BrokerError
from tidemq_server.common.loop import BackgroundLoop
from tidemq_server.common.openapi import errors

log = logging.getLogger(__name__)

DONE_KEEP_INTERVALS = 4  # ended transaction ids are held this many check intervals
SCAN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ScanAnswer(BaseModel):
    """``POST /internal/v1/scan``: the report of the scan (documentation of ScanReport)."""

    examined: int = Field(description="half messages looked at")
    ended: int = Field(description="skipped: their op record was seen")
    checked: int
    deferred: int
    discarded: int
    stale: int = Field(description="the broker answered ended, superseded or not found")
    no_producer: int = Field(description="checks counted while no producer was alive")
    stopped_early: bool
    half_offset: int
    half_end: int
    seconds: float
    outcomes: dict[str, int]


class CheckerMetrics:
    def __init__(self, checker: Checker) -> None:
        self.registry = r = CollectorRegistry()
        self.scans = Counter("tidemq_checker_scans", "Scans by result (ok, failed)", ["result"],
                             registry=r)
        self.scan_seconds = Histogram("tidemq_checker_scan_seconds", "Time of one scan",
                                      buckets=SCAN_BUCKETS, registry=r)
        self.decisions = Counter("tidemq_checker_decisions",
                                 "Half messages by what the scan did (ended, checked, deferred, "
                                 "discarded, stale)", ["decision"], registry=r)
        self.no_producer = Counter("tidemq_checker_checks_without_producer",
                                   "Checks counted while no producer of the group was alive",
                                   registry=r)
        s = checker.scanner
        for name, doc, fn in (
            ("half_offset", "Next half-queue offset to scan", lambda: s.half_offset),
            ("op_offset", "Next op-queue offset to read", lambda: s.op_offset),
            ("half_end_offset", "Half-queue end seen by the last scan", lambda: checker.end),
            ("retention_floor", "Physical offset reported as retention floor",
             lambda: s.floor),
            ("done_ids", "Ended transaction ids held from op records", lambda: s.done_size),
            ("last_scan_timestamp_seconds", "Wall time the last scan finished",
             lambda: checker.last_scan),
            ("peak_rss_bytes", "Peak resident memory of the checker process", _peak_rss),
        ):
            Gauge(f"tidemq_checker_{name}", doc, registry=r).set_function(fn)

    def observe(self, report: ScanReport) -> None:
        self.scans.labels("ok").inc()
        self.scan_seconds.observe(report.seconds)
        for decision in ("ended", "checked", "deferred", "discarded", "stale"):
            value = getattr(report, decision)
            if value:
                self.decisions.labels(decision).inc(value)
        if report.no_producer:
            self.no_producer.inc(report.no_producer)


def _peak_rss() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB


class Checker:
    """The parts of a running checker; ``scan_now`` is the one way a scan runs."""

    def __init__(self, settings: CheckerSettings) -> None:
        self.settings = settings
        resolver = settings.resolver()
        self.client = BrokerClient(settings.broker_url, settings.token, settings.request_timeout_s,
                                   user_agent="tidemq-checker",
                                   resolver=resolver if resolver.discovered else None)
        self.progress = ProgressStore(settings.redis_url, settings.cluster)
        self.scanner = CheckScanner(self.client, self.progress, ScanConfig(
            immunity_ms=settings.transaction_timeout_ms, check_max=settings.check_max,
            max_age_ms=int(settings.max_age_s * 1000), batch_size=settings.batch_size,
            done_keep_ms=DONE_KEEP_INTERVALS * settings.check_interval_ms))
        self.watch = HalfWatch(self.client, self.scanner.cfg,
                               min_sleep_s=settings.check_min_sleep_ms / 1000,
                               slack_s=settings.check_slack_ms / 1000)
        self.metrics = CheckerMetrics(self)
        self.loop = CheckLoop(self, settings.check_interval_ms / 1000)
        self._lock = asyncio.Lock()
        self.bound = ""  # the broker name the progress is bound to ("" = not yet)
        self.bound_url = ""  # the address that broker name was last confirmed at
        self.end = 0
        self.last_scan = 0.0

    async def scan_now(self) -> ScanReport:
        async with self._lock:
            await self._bind()
            try:
                report = await self.scanner.scan()
            except BaseException:
                self.metrics.scans.labels("failed").inc()
                raise
            self.end = report.half_end
            self.last_scan = time.time()
            self.watch.scanned(report.half_offset, report.head_due_ms)
            self.metrics.observe(report)
            if report.checked or report.discarded or report.deferred:
                log.info("scan: %d half message(s) examined, %d checked (%d with no live "
                         "producer), %d discarded, %d deferred, %d already ended, in %.2fs",
                         report.examined, report.checked, report.no_producer,
                         report.discarded, report.deferred, report.ended + report.stale,
                         report.seconds)
            return report

    async def _bind(self) -> None:
        """Bind the progress to the broker's name on first contact, and confirm the name
        again whenever the group's address changed: progress of one group must never be
        applied to another broker's half queue."""
        url = await self.client.follow()
        if self.bound and url == self.bound_url:
            return
        info = await self.client.transactions_info()
        name = str(info["broker_name"])
        want = self.settings.broker_name or self.bound
        if want and name != want:
            if self.client.resolver is not None:
                self.client.resolver.invalidate()
            raise BrokerDown(f"the broker at {url} is {name!r}, not {want!r}: waiting for the "
                             "nameservers to point at the right one", maybe_done=False)
        if not self.bound:
            self.progress.bind(name)
            log.info("checking transactions of broker %s at %s", name, url)
        elif url != self.bound_url:
            log.info("checking transactions of broker %s at its new address %s", name, url)
        self.bound, self.bound_url = name, url

    async def close(self) -> None:
        await self.loop.stop()
        await self.client.close()
        await self.progress.close()


class CheckLoop(BackgroundLoop):
    """Scans, then sleeps until the earliest half message falls due (``HalfWatch``), at most
    the check interval; after a failed scan, the check interval."""

    name = "transaction-check"

    def __init__(self, checker: Checker, interval_s: float) -> None:
        super().__init__(interval_s)
        self.checker = checker
        self.scanned = False  # the last run scanned: its due times are worth waiting for

    async def run_once(self) -> None:
        self.scanned = False
        try:
            await self.checker.scan_now()
        except (BrokerError, ProgressUnavailable) as exc:
            log.warning("scan stopped: %s; retrying in %.1fs", exc, self.interval_s)
            return
        self.scanned = True

    async def pause(self) -> None:
        if not self.scanned:
            await super().pause()
            return
        watch = self.checker.watch
        began = time.time()
        try:
            await watch.sleep(self.interval_s)
        except Exception as exc:  # sleep until the due time known so far, without watching
            rest = watch.wake_at(began, self.interval_s) - time.time()
            log.warning("watching the half queue: %s; next scan in %.1fs", exc, max(0.0, rest))
            if rest > 0:
                await asyncio.sleep(rest)


def create_checker_app(settings: CheckerSettings | None = None) -> FastAPI:
    settings = settings if settings is not None else CheckerSettings()
    use_account(settings.access_key, settings.secret_key)  # before the broker client is built
    checker = Checker(settings)
    gate = acl_gate(settings.acl_file, checker.metrics.registry)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.checker = checker
        checker.loop.start()
        log.info("checker of cluster %s: broker %s, every %d ms, first check after %d ms, "
                 "discard after %d checks", settings.cluster, checker.client.describe(),
                 settings.check_interval_ms, settings.transaction_timeout_ms, settings.check_max)
        try:
            yield
        finally:
            await checker.close()
            log.info("checker stopped")

    app = create_app("tidemq checker", checker.metrics.registry, lifespan, gate=gate)

    token = token_guard(lambda _: settings.token)

    @app.post("/internal/v1/scan", tags=["internal"], dependencies=[Depends(token)],
              summary="Run one scan now; answers its report", response_model=ScanAnswer,
              responses=errors(ErrorCode.UNAVAILABLE))
    async def scan(request: Request) -> Response:
        try:
            report = await checker.scan_now()
        except (BrokerError, ProgressUnavailable) as exc:
            raise ProtocolError(ErrorCode.UNAVAILABLE, str(exc)) from exc
        return reply(request, report.to_wire())

    return app
