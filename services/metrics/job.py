"""The streaming job: events from the broker → rollups → a Prometheus exposition file.

``start_query`` runs it in a Spark session the caller owns (the sidecar, the tests); ``main`` is
the ``spark-submit`` entry point (``services/metrics/README.md``)::

    spark-submit --master spark://host:7077 --py-files tidemq-metrics.zip \\
        services/metrics/job.py --broker-url http://broker:10911 --token T \\
        --output /srv/tidemq/metrics.prom --checkpoint /srv/tidemq/checkpoint [--once]

(``--nameservers http://ns1:9876,http://ns2:9876`` instead of ``--broker-url`` reads every
broker group the nameservers list.)

The aggregation is stateful (complete output mode): Spark keeps the rollups in its state store
and the source offsets in its offset log, both under the checkpoint, so a restarted query
counts nothing twice. Each micro-batch hands the whole (small) result table to
``ExpositionWriter``, which renders and atomically replaces the exposition file.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

if __package__ in (None, "") and importlib.util.find_spec("tidemq_server") is None:
    # run as a file by spark-submit without the zip (--py-files) or an install: the folder
    # services/ is the package tidemq_server (package-dir in pyproject.toml)
    _folder = Path(__file__).resolve().parents[1]
    _spec = importlib.util.spec_from_file_location(
        "tidemq_server", _folder / "__init__.py", submodule_search_locations=[str(_folder)])
    assert _spec is not None and _spec.loader is not None
    sys.modules["tidemq_server"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["tidemq_server"])

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from tidemq_server.common.constants import (
    METRICS_MAX_EVENTS_PER_BATCH,
    METRICS_SPARK_MASTER,
    METRICS_TRIGGER_INTERVAL_S,
)
from tidemq_server.common.files import write_atomic
from tidemq_server.common.logs import format_from_env, setup_logging
from tidemq_server.metrics.aggregate import aggregate, to_rollup
from tidemq_server.metrics.config import JobConfig, SessionConfig
from tidemq_server.metrics.exposition import BatchInfo, render
from tidemq_server.metrics.liveness import Liveness, liveness_path
from tidemq_server.metrics.source import FORMAT, TransactionEventSource

log = logging.getLogger(__name__)

QUERY_NAME = "tidemq_transaction_metrics"


def choose_master(configured: str, env: Mapping[str, str] = os.environ) -> str | None:
    """The master to give the session builder, or None to keep spark-submit's.

    ``--master`` / ``TIDEMQ_METRICS_MASTER`` (``configured``) come first. Under spark-submit the
    driver's JVM already exists and holds spark-submit's ``--master`` (or spark-defaults'):
    spark-submit starts the Python driver with ``PYSPARK_GATEWAY_PORT`` set, so that is the sign
    to leave the master alone. (A ``SparkConf()`` made before the JVM is attached knows nothing
    of spark-submit's settings, so it cannot tell.) Otherwise: ``local[*]``."""
    if configured:
        return configured
    if env.get("PYSPARK_GATEWAY_PORT"):
        return None
    return METRICS_SPARK_MASTER


def build_session(cfg: SessionConfig) -> SparkSession:
    """A Spark session for the job (or the one already running in this process)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(cfg.app_name)
    master = choose_master(cfg.master)
    if master is not None:
        builder = builder.master(master)
    conf = {
        "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions),
        "spark.ui.enabled": str(cfg.ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "false",  # not used by stateful streaming anyway
        "spark.sql.debug.maxToStringFields": "200",  # the rollup plan is wide: no warning
        # an idle event after every trigger that found no new events (not one per 10 s): the
        # liveness file advances on each poll of the broker, empty ones included
        "spark.sql.streaming.noDataProgressEventInterval": "0",
        **cfg.extra,
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    started = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per callback otherwise
    register(spark)
    log.info("spark session ready in %.1fs (master %s, Spark %s)", time.monotonic() - started,
             spark.sparkContext.master, spark.version)
    return spark


_registered: set[int] = set()  # ids of the sessions the source is registered with


def register(spark: SparkSession) -> None:
    """Make ``format("tidemq_events")`` known to ``spark`` (once per session)."""
    if id(spark) not in _registered:
        spark.dataSource.register(TransactionEventSource)
        _registered.add(id(spark))


class ProgressListener(StreamingQueryListener):
    """One per session: hands every completed trigger of a tracked query run (by run id) to its
    ``Liveness`` — a micro-batch with the rows it read, or an idle trigger (an empty poll).
    ``expect`` names a query about to start: its start event, which Spark posts before any
    progress, binds the run."""

    def __init__(self) -> None:
        self.runs: dict[str, Liveness] = {}
        self._starting: dict[str, Liveness] = {}  # query name → its liveness, until it starts

    def expect(self, name: str, liveness: Liveness) -> None:
        self._starting[name] = liveness

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        liveness = self._starting.pop(event.name or "", None)
        if liveness is not None:
            self.runs[str(event.runId)] = liveness

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        liveness = self.runs.get(str(progress.runId))
        if liveness is not None:
            liveness.completed(int(progress.numInputRows))

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        liveness = self.runs.get(str(event.runId))
        if liveness is not None:
            liveness.completed(0)

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        self.runs.pop(str(event.runId), None)


_listeners: dict[int, ProgressListener] = {}  # session id → its listener


def progress_listener(spark: SparkSession) -> ProgressListener:
    """The session's ``ProgressListener`` (added to it on first use)."""
    listener = _listeners.get(id(spark))
    if listener is None:
        listener = _listeners[id(spark)] = ProgressListener()
        spark.streams.addListener(listener)
    return listener


def event_stream(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    return spark.readStream.format(FORMAT).options(**cfg.source_options()).load()


class ExpositionWriter:
    """The ``foreachBatch`` sink: the complete rollup table → the exposition file."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.batches = 0
        self.last_batch_id = -1
        self.last_write_s = 0.0
        self.liveness = Liveness(liveness_path(output))  # fed by the session's listener

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        rollups = [to_rollup(row) for row in batch.collect()]
        now = time.time()
        write_atomic(self.output, render(rollups, BatchInfo(batch_id, now)))
        self.batches += 1
        self.last_batch_id = batch_id
        self.last_write_s = now
        events = sum(r.events for r in rollups)
        log.info("batch %d: %d rollup rows, %d events in all; computed and written in %.2fs",
                 batch_id, len(rollups), events, time.monotonic() - began)


def start_query(spark: SparkSession, cfg: JobConfig,
                writer: ExpositionWriter | None = None) -> StreamingQuery:
    """Start the job; with ``cfg.once`` it stops by itself when it has caught up."""
    register(spark)
    writer = writer if writer is not None else ExpositionWriter(cfg.output)
    stream = (aggregate(event_stream(spark, cfg)).writeStream
              .queryName(QUERY_NAME)
              .outputMode("complete")
              .foreachBatch(writer)
              .option("checkpointLocation", str(cfg.checkpoint)))
    if cfg.once:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{cfg.trigger_interval_s} seconds")
    progress_listener(spark).expect(QUERY_NAME, writer.liveness)  # each trigger → liveness
    query = stream.start()
    context = spark.sparkContext
    writer.liveness.started(context.master or "", context.applicationId,
                            "once" if cfg.once else "continuous")
    log.info("query %s started (%s), checkpoint %s, output %s", QUERY_NAME,
             "available-now" if cfg.once else f"every {cfg.trigger_interval_s}s",
             cfg.checkpoint, cfg.output)
    return query


def parse_args(argv: list[str] | None) -> tuple[JobConfig, SessionConfig]:
    ap = argparse.ArgumentParser(prog="services/metrics/job.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--broker-url", default="", help="read this one broker")
    where.add_argument("--nameservers", default="",
                       help="comma-separated nameserver URLs: read every broker group")
    ap.add_argument("--token", default=os.environ.get("TIDEMQ_METRICS_TOKEN", ""))
    ap.add_argument("--output", type=Path, required=True, help="exposition file to replace")
    ap.add_argument("--checkpoint", required=True, type=Path, help="Spark checkpoint directory")
    ap.add_argument("--once", action="store_true", help="Trigger.AvailableNow, then exit")
    ap.add_argument("--trigger-interval", type=float, default=METRICS_TRIGGER_INTERVAL_S)
    ap.add_argument("--max-events-per-batch", type=int, default=METRICS_MAX_EVENTS_PER_BATCH)
    ap.add_argument("--master", default=os.environ.get("TIDEMQ_METRICS_MASTER", ""),
                    help="Spark master URL (default: $TIDEMQ_METRICS_MASTER, else spark-submit's "
                         "--master, else local[*])")
    ap.add_argument("--topic", default="", help="event topic (default TIDE_SYS_TRANS_EVENTS)")
    ap.add_argument("--shuffle-partitions", type=int, default=2)
    args = ap.parse_args(argv)
    job = JobConfig(broker_url=args.broker_url, nameservers=args.nameservers,
                    token=args.token, output=args.output,
                    checkpoint=args.checkpoint, once=args.once,
                    trigger_interval_s=args.trigger_interval,
                    max_events_per_batch=args.max_events_per_batch, topic=args.topic)
    return job, SessionConfig(master=args.master, shuffle_partitions=args.shuffle_partitions)


def main(argv: list[str] | None = None) -> int:
    try:
        log_format = format_from_env(os.environ)
    except ValueError as exc:
        print(f"metrics job: bad setting: {exc}", file=sys.stderr, flush=True)
        return 2
    setup_logging("info", log_format, "metrics-job")
    job, session = parse_args(argv)
    spark = build_session(session)
    writer = ExpositionWriter(job.output)
    query = start_query(spark, job, writer)
    try:
        query.awaitTermination()
        if job.once:
            writer.liveness.finished()
            log.info("available-now run finished: %d batches written to %s", writer.batches,
                     job.output)
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
