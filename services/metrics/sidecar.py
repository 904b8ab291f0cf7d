"""The sidecar process: the Spark job in a background thread, ``/metrics`` and ``/healthz``.

Spark's driver calls block (py4j), so the job lives in one daemon thread (``JobRunner``) and the
event loop only ever reads a small file: ``/metrics`` serves the exposition the last batch
wrote and the job's liveness file (``liveness``), followed by a few live gauges about the job
itself. ``/healthz`` answers as soon as the process serves (Spark takes seconds to start);
``/v1/status`` tells how the job is doing. A failed query is restarted from its checkpoint after
``restart_delay_s``.

With ``run_job`` off the sidecar only serves what a job elsewhere writes (spark-submit on a
cluster, a cron ``--once`` run): it then reports *that* job — its master, application id and
mode, read from the liveness file the job writes — and counts it up while it completed a
trigger (or started, or finished a run) within ``stale_after_s``.

Staleness means "the job stopped", not "nothing happened": a micro-batch runs only when events
arrive, so ``tidemq_metrics_last_batch_completed_age_seconds`` — which every trigger resets,
empty polls of the broker included — is the figure to alert on, while
``tidemq_metrics_newest_event_age_seconds`` only tells how long the system has been quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from tidemq_server.common.app import create_app, reply
from tidemq_server.common.auth import service_gate
from tidemq_server.metrics.exposition import Family
from tidemq_server.metrics.liveness import liveness_path, read_liveness
from tidemq_server.metrics.settings import MetricsSettings

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
POLL_S = 0.5  # how often the runner looks at its query and at the stop flag


class JobState(StrEnum):
    IDLE = "idle"  # not started (or run_job is off)
    STARTING = "starting"  # the Spark session is being built
    RUNNING = "running"  # the query runs
    RESTARTING = "restarting"  # the query failed; it restarts after a delay
    DONE = "done"  # mode=once: the available-now run finished
    STOPPED = "stopped"  # stopped on shutdown
    EXTERNAL = "external"  # run_job is off: a job elsewhere writes the files served here


class JobStatus(BaseModel):
    """``GET /v1/status`` (documentation of ``JobRunner.status``); ages in seconds, null until
    there is one."""

    state: JobState
    up: bool = Field(description="the job runs (or finished its available-now run); for an "
                     "external job: it showed life within stale_after_s")
    mode: str = Field(description='"continuous" or "once" ("" while an external job never said)')
    master: str = Field(description="the Spark master URL of the job that writes the output")
    app_id: str | None = Field(description="the job's Spark application id, once it started")
    restarts: int
    last_error: str
    batches_written: int | None = Field(description="null when the job runs elsewhere")
    last_batch_id: int | None
    last_batch_completed_age_s: float | None
    newest_event_age_s: float | None
    exposition_age_s: float | None
    job_started_age_s: float | None
    job_finished_age_s: float | None = Field(description="an available-now run: since it ended")
    stale_after_s: float | None = Field(description="older triggers than this mean the job "
                                        "stopped (null: a finished available-now run expects "
                                        "none)")


class JobRunner:
    """Runs the streaming query in a daemon thread, restarting it when it fails."""

    def __init__(self, settings: MetricsSettings) -> None:
        self.settings = settings
        self.state = JobState.IDLE
        self.restarts = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._query: Any = None
        self._spark: Any = None
        self._writer: Any = None  # the query's ExpositionWriter (batches written)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="spark-job", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the query and the session (blocking: call it off the event loop)."""
        self._stop.set()
        query = self._query
        if query is not None:
            with contextlib.suppress(Exception):
                query.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.state is not JobState.DONE:
            self.state = JobState.STOPPED

    def _run(self) -> None:
        from tidemq_server.metrics.job import (  # Spark is touched only in this thread
            ExpositionWriter,
            build_session,
            start_query,
        )

        cfg = self.settings.job_config()
        self._writer = ExpositionWriter(cfg.output)
        while not self._stop.is_set():
            try:
                if self._spark is None:
                    self.state = JobState.STARTING
                    self._spark = build_session(self.settings.session_config())
                if self._stop.is_set():
                    break
                self._query = start_query(self._spark, cfg, self._writer)
                self.state = JobState.RUNNING
                while not self._stop.is_set() and self._query.isActive:
                    self._query.awaitTermination(POLL_S)
                error = self._query.exception()
                if self._stop.is_set():
                    break
                if error is None and cfg.once:
                    self._writer.liveness.finished()
                    self.state = JobState.DONE
                    log.info("available-now run finished: exposition in %s", cfg.output)
                    break
                raise RuntimeError(f"query ended: {error or 'stopped'}")
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.restarts += 1
                self.last_error = f"{type(exc).__name__}: {str(exc)[:500]}"
                self.state = JobState.RESTARTING
                log.error("metrics job failed (%s); restarting in %.0fs", self.last_error,
                          self.settings.restart_delay_s)
                self._stop.wait(self.settings.restart_delay_s)
            finally:
                self._query = None
        if self._spark is not None:
            with contextlib.suppress(Exception):
                self._spark.stop()
            self._spark = None

    def status(self, exposition: Path) -> dict[str, Any]:
        now = time.time()
        try:
            age: float | None = max(0.0, now - exposition.stat().st_mtime)
        except OSError:
            age = None
        live = read_liveness(liveness_path(exposition))
        completed_age, event_age = live.ages(now)
        job = live.job
        common = {"restarts": self.restarts, "last_error": self.last_error,
                  "app_id": job.app_id if job else None,
                  "last_batch_completed_age_s": _rounded(completed_age),
                  "newest_event_age_s": _rounded(event_age),
                  "exposition_age_s": _rounded(age),
                  "job_started_age_s": _rounded(_since(job.started_s if job else None, now)),
                  "job_finished_age_s": _rounded(_since(job.finished_s if job else None, now))}
        if not self.settings.run_job:
            last_seen = max((t for t in (live.completed_s, job.started_s if job else None,
                                         job.finished_s if job else None) if t is not None),
                            default=None)
            up = last_seen is not None and now - last_seen <= self.settings.stale_after_s
            return {**common, "state": JobState.EXTERNAL.value, "up": up,
                    "mode": job.mode if job else "", "master": job.master if job else "",
                    "batches_written": None, "last_batch_id": _batch_id(exposition),
                    "stale_after_s": self.settings.stale_after_s}
        writer = self._writer
        finished = self.state is JobState.DONE
        return {**common, "state": self.state.value,
                "up": self.state in (JobState.RUNNING, JobState.DONE),
                "mode": self.settings.mode, "master": job.master if job else self.settings.master,
                "batches_written": writer.batches if writer else 0,
                "last_batch_id": writer.last_batch_id if writer else None,
                "stale_after_s": None if finished else self.settings.stale_after_s}


def _since(at: float | None, now: float) -> float | None:
    return None if at is None else max(0.0, now - at)


def _rounded(age: float | None) -> float | None:
    return None if age is None else round(age, 3)


def _batch_id(exposition: Path) -> int | None:
    """The batch id the exposition file says it was written by (None: no file or no id)."""
    try:
        text = exposition.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("tidemq_metrics_batch_id "):
            try:
                return int(float(line.split(" ", 1)[1]))
            except ValueError:
                return None
    return None


def health_lines(runner: JobRunner, status: dict[str, Any]) -> str:
    """Live gauges about the job, appended after the batch's exposition."""
    up = Family("tidemq_metrics_job_up", "gauge",
                "1 while the Spark query runs (or finished its available-now run); for a job "
                "run elsewhere (run_job off): 1 while it showed life within stale_after_s")
    up.add([], 1 if status["up"] else 0)
    stale = Family("tidemq_metrics_job_stale_after_seconds", "gauge",
                   "Liveness ages above this mean the job stopped (absent after a finished "
                   "available-now run, which expects no more triggers)")
    if status["stale_after_s"] is not None:
        stale.add([], status["stale_after_s"])
    restarts = Family("tidemq_metrics_job_restarts_total", "counter",
                      "Times the Spark query failed and was restarted")
    restarts.add([], runner.restarts)
    liveness = Family("tidemq_metrics_last_batch_completed_age_seconds", "gauge",
                      "Seconds since the job last completed a micro-batch or a poll of the broker "
                      "that found no new events: stays within a few trigger intervals while the "
                      "job runs, quiet or not (-1: none yet)")
    newest = Family("tidemq_metrics_newest_event_age_seconds", "gauge",
                    "Seconds since the job last read a transaction event: grows while nothing "
                    "happens, so it is no sign of a stopped job (-1: none read yet)")
    for family, key in ((liveness, "last_batch_completed_age_s"), (newest, "newest_event_age_s")):
        value = status[key]
        family.add([], -1 if value is None else value)
    return "\n".join([*up.render(), *restarts.render(), *liveness.render(),
                      *newest.render(), *stale.render()]) + "\n"


def create_sidecar_app(settings: MetricsSettings) -> FastAPI:
    registry = CollectorRegistry()
    gate = service_gate(settings, registry)
    runner = JobRunner(settings)
    path = settings.exposition_path

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.runner = runner
        if settings.run_job:
            runner.start()
        else:
            log.info("run_job is off: serving %s as another job writes it", path)
        try:
            yield
        finally:
            await asyncio.to_thread(runner.stop)

    app = create_app("tidemq metrics sidecar", registry, lifespan, gate=gate)
    # /metrics here is the batch's file, not a prometheus_client registry: replace the route
    app.router.routes = [r for r in app.router.routes
                         if not (isinstance(r, APIRoute) and r.path == "/metrics")]

    def read_exposition() -> str:
        """The last batch's exposition, then the job's liveness file ("" for a missing one)."""
        texts = []
        for file in (path, liveness_path(path)):
            try:
                texts.append(file.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
        return "".join(texts)

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse,
             summary="The last batch's exposition and the job's own gauges (text format)")
    async def metrics() -> Response:
        text = await asyncio.to_thread(read_exposition)
        status = runner.status(path)
        own = generate_latest(registry).decode()  # start time, process_*, python_*, ACL
        return Response(text + health_lines(runner, status) + own, media_type=CONTENT_TYPE)

    @app.get("/v1/status", tags=["ops"], summary="State of the Spark job",
             response_model=JobStatus)
    async def status(request: Request) -> Response:
        return reply(request, runner.status(path))

    return app
