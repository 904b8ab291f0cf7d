"""The sidecar process: the Spark job in a background thread, ``/metrics`` and ``/healthz``.

Spark's driver calls block (py4j), so the job lives in one daemon thread (``JobRunner``) and the
event loop only ever reads a small file: ``/metrics`` serves the exposition the last batch
wrote, followed by a few live gauges about the job itself. ``/healthz`` answers as soon as the
process serves (Spark takes seconds to start); ``/v1/status`` tells how the job is doing. A
failed query is restarted from its checkpoint after ``restart_delay_s``.
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

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry

from services.common.app import create_app
from services.metrics.exposition import Family
from services.metrics.settings import MetricsSettings

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
        from services.metrics.job import (  # Spark is touched only in this thread
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
        try:
            age: float | None = max(0.0, time.time() - exposition.stat().st_mtime)
        except OSError:
            age = None
        writer = self._writer
        return {"state": self.state.value, "mode": self.settings.mode,
                "master": self.settings.master, "restarts": self.restarts,
                "last_error": self.last_error,
                "batches_written": writer.batches if writer else 0,
                "last_batch_id": writer.last_batch_id if writer else None,
                "exposition_age_s": None if age is None else round(age, 3)}


def health_lines(runner: JobRunner, status: dict[str, Any]) -> str:
    """Live gauges about the job, appended after the batch's exposition."""
    up = Family("tidemq_metrics_job_up", "gauge",
                "1 while the Spark query runs (or finished its available-now run)")
    up.add([], 1 if runner.state in (JobState.RUNNING, JobState.DONE) else 0)
    restarts = Family("tidemq_metrics_job_restarts_total", "counter",
                      "Times the Spark query failed and was restarted")
    restarts.add([], runner.restarts)
    age = Family("tidemq_metrics_exposition_age_seconds", "gauge",
                 "Seconds since a batch last wrote the exposition (batches run when events "
                 "arrive; -1: none yet)")
    value = status["exposition_age_s"]
    age.add([], -1 if value is None else value)
    return "\n".join([*up.render(), *restarts.render(), *age.render()]) + "\n"


def create_sidecar_app(settings: MetricsSettings) -> FastAPI:
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

    app = create_app("tidemq metrics sidecar", CollectorRegistry(), lifespan)
    # /metrics here is the batch's file, not a prometheus_client registry: replace the route
    app.router.routes = [r for r in app.router.routes
                         if not (isinstance(r, APIRoute) and r.path == "/metrics")]

    def read_exposition() -> str:
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        text = await asyncio.to_thread(read_exposition)
        status = runner.status(path)
        return Response(text + health_lines(runner, status), media_type=CONTENT_TYPE)

    @app.get("/v1/status", tags=["ops"], summary="State of the Spark job")
    async def status() -> dict[str, Any]:
        return runner.status(path)

    return app
