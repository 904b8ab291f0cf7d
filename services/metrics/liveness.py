"""Liveness of the streaming job: when it last completed a trigger, and when it last read events.

A micro-batch runs only when the broker has new events, so the exposition file's age cannot tell
a stopped job from a quiet system. Spark reports every trigger to a query listener
(``job.ProgressListener``): a progress event after each micro-batch, with the rows it read, and,
with ``spark.sql.streaming.noDataProgressEventInterval`` at 0, an idle event after each trigger
whose poll of the broker found nothing new. ``Liveness`` keeps both times and writes them beside
the exposition (``metrics-liveness.prom`` next to ``metrics.prom``) in the Prometheus text format,
so the sidecar serves them whether the job runs in it or under ``spark-submit``, and a textfile
collector can read them as they are. The job also says who it is when its query starts (its
Spark master, application id and mode) and when an available-now run ends, so a sidecar that
only serves the files (``RUN_JOB=false``) reports the job that wrote them, not itself. Pure
Python: the sidecar reads the file without Spark.

====================================================  =======  ====================================
tidemq_metrics_last_batch_completed_timestamp_seconds  gauge    last micro-batch or empty poll
tidemq_metrics_newest_event_read_timestamp_seconds     gauge    last micro-batch that read events
tidemq_metrics_job_info{master, app_id, mode}          gauge    1: the job that writes these files
tidemq_metrics_job_started_timestamp_seconds           gauge    when that job's query started
tidemq_metrics_job_finished_timestamp_seconds          gauge    when its available-now run ended
====================================================  =======  ====================================
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tidemq_server.common.files import write_atomic
from tidemq_server.metrics.exposition import Family

log = logging.getLogger(__name__)

COMPLETED = "tidemq_metrics_last_batch_completed_timestamp_seconds"
NEWEST_EVENT = "tidemq_metrics_newest_event_read_timestamp_seconds"
JOB_INFO = "tidemq_metrics_job_info"
JOB_STARTED = "tidemq_metrics_job_started_timestamp_seconds"
JOB_FINISHED = "tidemq_metrics_job_finished_timestamp_seconds"
SUFFIX = "-liveness"  # metrics.prom → metrics-liveness.prom


def liveness_path(exposition: Path) -> Path:
    """The liveness file of the exposition file ``exposition`` (same directory)."""
    return exposition.with_name(f"{exposition.stem}{SUFFIX}{exposition.suffix}")


@dataclass(frozen=True, slots=True)
class JobInfo:
    """Who writes the files: the job's Spark master as its context reports it, e.g.
    ``spark://host:7077`` under spark-submit, its application id and its mode."""

    master: str
    app_id: str
    mode: str  # "continuous" or "once"
    started_s: float  # when its query started (Unix time)
    finished_s: float | None = None  # when its available-now run ended (Unix time)


@dataclass(frozen=True, slots=True)
class LivenessState:
    completed_s: float | None = None  # a trigger last completed (Unix time; None: never)
    newest_event_s: float | None = None  # a completed micro-batch last read events (Unix time)
    job: JobInfo | None = None  # the job that wrote the file (None: a file from before it said)

    def ages(self, now: float) -> tuple[float | None, float | None]:
        """Seconds since ``completed_s`` and since ``newest_event_s`` (``None``: never)."""
        return _since(self.completed_s, now), _since(self.newest_event_s, now)


def _since(at: float | None, now: float) -> float | None:
    return None if at is None else max(0.0, now - at)


def render_liveness(state: LivenessState) -> str:
    completed = Family(COMPLETED, "gauge",
                       "When the job last completed a trigger: a micro-batch, or a poll of the "
                       "broker that found no new events (Unix time)")
    newest = Family(NEWEST_EVENT, "gauge",
                    "When the job last completed a micro-batch that read transaction events "
                    "(Unix time)")
    for family, value in ((completed, state.completed_s), (newest, state.newest_event_s)):
        if value is not None:
            family.add([], round(value, 3))
    lines = [*completed.render(), *newest.render()]
    job = state.job
    if job is not None:
        info = Family(JOB_INFO, "gauge", "1: the Spark job that writes this file (its master, "
                      "application id and mode)")
        info.add([("master", job.master), ("app_id", job.app_id), ("mode", job.mode)], 1)
        started = Family(JOB_STARTED, "gauge", "When the job's query started (Unix time)")
        started.add([], round(job.started_s, 3))
        lines += [*info.render(), *started.render()]
        if job.finished_s is not None:
            finished = Family(JOB_FINISHED, "gauge",
                              "When the job's available-now run ended (Unix time)")
            finished.add([], round(job.finished_s, 3))
            lines += finished.render()
    return "\n".join(lines) + "\n"


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_ESCAPED = re.compile(r"\\(.)")


def _labels(body: str) -> dict[str, str]:
    """Label values of one sample line, unescaped (``\\n``, ``\\"``, ``\\\\``)."""
    def unescape(value: str) -> str:
        return _ESCAPED.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)
    return {key: unescape(value) for key, value in _LABEL.findall(body)}


def parse_liveness(text: str) -> LivenessState:
    """The state written by ``render_liveness`` (unknown or broken lines are ignored)."""
    values: dict[str, float] = {}
    info: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith(JOB_INFO + "{"):
            body, _, _ = line[len(JOB_INFO) + 1:].rpartition("}")
            info = _labels(body)
            continue
        name, _, value = line.partition(" ")
        if name in (COMPLETED, NEWEST_EVENT, JOB_STARTED, JOB_FINISHED):
            try:
                values[name] = float(value)
            except ValueError:
                continue
    job = None
    if info is not None and JOB_STARTED in values:
        job = JobInfo(master=info.get("master", ""), app_id=info.get("app_id", ""),
                      mode=info.get("mode", ""), started_s=values[JOB_STARTED],
                      finished_s=values.get(JOB_FINISHED))
    return LivenessState(values.get(COMPLETED), values.get(NEWEST_EVENT), job)


def read_liveness(path: Path) -> LivenessState:
    try:
        return parse_liveness(path.read_text(encoding="utf-8"))
    except OSError:  # not written yet (or unreadable): nothing known
        return LivenessState()


class Liveness:
    """The job's side: records completed triggers and rewrites the file after each. Listener
    callbacks arrive on Spark's callback threads, hence the lock. A restarted job starts from the
    file it finds, so the time of the newest event survives restarts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.state = read_liveness(path)
        self.triggers = 0  # triggers completed by this process

    def completed(self, rows: int, now: float | None = None) -> None:
        """A trigger completed, after reading ``rows`` events (0 for an empty poll)."""
        at = time.time() if now is None else now
        with self._lock:
            state = replace(self.state, completed_s=at)
            if rows > 0:
                state = replace(state, newest_event_s=at)
            self.triggers += 1
            self._write(state)

    def started(self, master: str, app_id: str, mode: str, now: float | None = None) -> None:
        """The job's query started: from now on the file names this job."""
        at = time.time() if now is None else now
        with self._lock:
            self._write(replace(self.state, job=JobInfo(master, app_id, mode, at)))

    def finished(self, now: float | None = None) -> None:
        """The job's available-now run ended (its last batch is in the exposition)."""
        at = time.time() if now is None else now
        with self._lock:
            if self.state.job is not None:
                self._write(replace(self.state, job=replace(self.state.job, finished_s=at)))

    def _write(self, state: LivenessState) -> None:
        self.state = state
        try:
            write_atomic(self.path, render_liveness(state))
        except OSError as exc:  # the next trigger tries again; the age shows the gap
            log.warning("cannot write %s: %s", self.path, exc)
