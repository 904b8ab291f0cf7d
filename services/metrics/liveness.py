"""Liveness of the streaming job: when it last completed a trigger, and when it last read events.

A micro-batch runs only when the broker has new events, so the exposition file's age cannot tell
a stopped job from a quiet system. Spark reports every trigger to a query listener
(``job.ProgressListener``): a progress event after each micro-batch, with the rows it read, and,
with ``spark.sql.streaming.noDataProgressEventInterval`` at 0, an idle event after each trigger
whose poll of the broker found nothing new. ``Liveness`` keeps both times and writes them beside
the exposition (``metrics-liveness.prom`` next to ``metrics.prom``) in the Prometheus text format,
so the sidecar serves them whether the job runs in it or under ``spark-submit``, and a textfile
collector can read them as they are. Pure Python: the sidecar reads the file without Spark.

====================================================  =======  ====================================
tidemq_metrics_last_batch_completed_timestamp_seconds  gauge    last micro-batch or empty poll
tidemq_metrics_newest_event_read_timestamp_seconds     gauge    last micro-batch that read events
====================================================  =======  ====================================
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from services.common.files import write_atomic
from services.metrics.exposition import Family

log = logging.getLogger(__name__)

COMPLETED = "tidemq_metrics_last_batch_completed_timestamp_seconds"
NEWEST_EVENT = "tidemq_metrics_newest_event_read_timestamp_seconds"
SUFFIX = "-liveness"  # metrics.prom → metrics-liveness.prom


def liveness_path(exposition: Path) -> Path:
    """The liveness file of the exposition file ``exposition`` (same directory)."""
    return exposition.with_name(f"{exposition.stem}{SUFFIX}{exposition.suffix}")


@dataclass(frozen=True, slots=True)
class LivenessState:
    completed_s: float | None = None  # a trigger last completed (Unix time; None: never)
    newest_event_s: float | None = None  # a completed micro-batch last read events (Unix time)

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
    return "\n".join([*completed.render(), *newest.render()]) + "\n"


def parse_liveness(text: str) -> LivenessState:
    """The state written by ``render_liveness`` (unknown or broken lines are ignored)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (COMPLETED, NEWEST_EVENT):
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return LivenessState(values.get(COMPLETED), values.get(NEWEST_EVENT))


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
            self.state = state
            self.triggers += 1
            try:
                write_atomic(self.path, render_liveness(state))
            except OSError as exc:  # the next trigger tries again; the age shows the gap
                log.warning("cannot write %s: %s", self.path, exc)
