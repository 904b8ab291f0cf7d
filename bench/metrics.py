"""Metrics job benchmark: events through the PySpark data source, and the aggregation on Spark
beside the same aggregation in a plain Python loop.

Run ``python -m bench.metrics [--quick] [--json]``.

1. ingest       N transaction events (quick 200k, full 1M) are written to a real broker's
                ``TIDE_SYS_TRANS_EVENTS`` (1 queue, as the broker creates it); after a warm-up
                run on another topic, ``Trigger.AvailableNow`` runs of the job read them
                through the data source (bulk msgpack pulls of 1024 bodies, vectorized JSON
                parsing into Arrow batches, 50k offsets per Spark task) into the aggregation
                and write the exposition: events / wall time of the better of two runs (one
                micro-batch each, fixed costs included). For scale: the same pulls and parsing
                in one plain loop without Spark.
2. aggregation  events already loaded — Spark: a DataFrame cached in memory; Python: a list of
                event tuples — aggregated by the job's expression (``aggregate``, collected) on
                ``local[2]`` and by ``rollup.python_rollup`` in this process, at 100k, 1M and
                (full) 10M events, after one small warm-up aggregation (code generation). Both
                results are checked equal (counts and buckets). The crossover is where the two
                fitted lines ``time = fixed + n * per_event`` meet.

Targets (2 cores): ingest >= 30,000 events/s; aggregation of 10,000,000 events <= 60 s.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import msgpack
import orjson
from tidemq.protocol import make_event

from bench._common import Row, err, print_json, print_table
from tidemq_server.common.constants import TOKEN_HEADER
from tidemq_server.metrics.rollup import Rollup, python_rollup

TOKEN = "bench-token"
TOPIC = "TIDE_SYS_TRANS_EVENTS"
GROUPS, TOPICS = 20, 5
TARGET_INGEST = 30_000.0  # events/s
TARGET_10M_S = 60.0  # seconds to aggregate 10M events


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} not healthy after {timeout_s}s")


@contextmanager
def broker(tmp: Path) -> Iterator[str]:
    """redis-server and ``python -m tidemq_server.broker`` on free ports; yields the broker URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed: run scripts/install-system-deps.sh")
    rport, bport = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    log = open(tmp / "services.log", "ab")  # closed in finally
    try:
        procs.append(subprocess.Popen([exe, "--port", str(rport), "--bind", "127.0.0.1",
                                       "--save", "", "--dir", str(tmp)], stdout=log,
                                      stderr=log))
        env = {**os.environ, "TIDEMQ_BROKER_PORT": str(bport), "TIDEMQ_BROKER_TOKEN": TOKEN,
               "TIDEMQ_BROKER_DATA_DIR": str(tmp / "broker"),
               "TIDEMQ_BROKER_REDIS_URL": f"redis://127.0.0.1:{rport}/0",
               "TIDEMQ_BROKER_LOG_LEVEL": "warning"}
        procs.append(subprocess.Popen([sys.executable, "-m", "tidemq_server.broker"], env=env,
                                      stdout=log, stderr=log))
        url = f"http://127.0.0.1:{bport}"
        _wait(url + "/healthz", procs[-1], "broker")
        yield url
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def event_bodies(n: int, base_ms: int = 1_700_000_000_000) -> list[bytes]:
    kinds = ("half", "half", "half", "half", "commit", "commit", "commit", "rollback",
             "unknown", "check")
    out = []
    for i in range(n):
        kind = kinds[i % 10] if i % 97 else "discard"
        out.append(orjson.dumps(make_event(
            kind, producer_group=f"g{i % GROUPS}", topic=f"T{i % TOPICS}",
            transaction_id=f"tx-{i}", message_id=f"m-{i}",
            source="check" if kind in ("check", "discard") else "producer",
            check_times=i % 16 if kind in ("check", "discard") else 0,
            born_ms=base_ms + i, ts_ms=base_ms + i + (i * 7919) % 600_000)))
    return out


def write_events(url: str, bodies: list[bytes], topic: str = TOPIC) -> float:
    began = time.perf_counter()
    with httpx.Client(base_url=url, timeout=60, headers={
            TOKEN_HEADER: TOKEN, "content-type": "application/msgpack",
            "accept": "application/msgpack"}) as client:
        for start in range(0, len(bodies), 4096):
            chunk = {"records": [{"body": b} for b in bodies[start:start + 4096]]}
            resp = client.post(f"/internal/v1/topics/{topic}/messages",
                               content=msgpack.packb(chunk, use_bin_type=True))
            resp.raise_for_status()
    return len(bodies) / (time.perf_counter() - began)


def run_job(spark: Any, url: str, tmp: Path, name: str, topic: str = TOPIC) -> float:
    """One available-now run of the job on a fresh checkpoint; its wall time (s)."""
    from tidemq_server.metrics.job import JobConfig, start_query

    cfg = JobConfig(broker_url=url, token=TOKEN, topic=topic, once=True,
                    max_events_per_batch=0, output=tmp / f"{name}.prom",
                    checkpoint=tmp / f"{name}-checkpoint")
    began = time.perf_counter()
    query = start_query(spark, cfg)
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    if query.exception() is not None:
        raise RuntimeError(f"the {name} run failed: {query.exception()}")
    return elapsed


def bench_ingest(spark: Any, url: str, n: int, tmp: Path) -> dict[str, float]:
    from tidemq_server.metrics.planning import QueueRange
    from tidemq_server.metrics.reader import TopicReader
    from tidemq_server.metrics.source import to_arrow

    err.print(f"ingest: writing {n:,} events to the broker …")
    bodies = event_bodies(n)
    put_rate = write_events(url, bodies)
    warm = "BenchWarmup"  # a first run warms the JVM and Spark's Python workers
    httpx.put(f"{url}/v1/topics/{warm}", json={"queues": 1}).raise_for_status()
    write_events(url, bodies[:20_000], warm)
    del bodies
    began = time.perf_counter()
    read = 0
    with TopicReader(url, TOKEN, TOPIC) as client:
        for offsets, chunk in client.read_range(QueueRange(0, 0, n)):
            read += to_arrow(0, offsets, chunk).num_rows
    loop_rate = read / (time.perf_counter() - began)
    err.print("ingest: a warm-up run, then two measured runs (available-now) …")
    run_job(spark, url, tmp, "warmup", warm)
    runs = []
    for i in range(2):  # the box is shared and noisy: the better of two fresh runs
        runs.append(run_job(spark, url, tmp, f"ingest{i}"))
        text = (tmp / f"ingest{i}.prom").read_text()
        assert f"tidemq_metrics_events_read_total {n}\n" in text, "the job missed events"
    elapsed = min(runs)
    return {"events": n, "seconds": elapsed, "events_per_s": n / elapsed,
            "worst_events_per_s": n / max(runs), "loop_events_per_s": loop_rate,
            "put_events_per_s": put_rate}


def synthetic(spark: Any, n: int) -> Any:
    """``n`` events as the data source's rows, generated in Spark (deterministic)."""
    from pyspark.sql import functions as F

    i = F.col("id")
    m10 = i % 10
    kind = (F.when(i % 97 == 0, "discard").when(m10 < 4, "half").when(m10 < 7, "commit")
            .when(m10 == 7, "rollback").when(m10 == 8, "unknown").otherwise("check"))
    checkish = kind.isin("check", "discard")
    return spark.range(n).select(
        F.lit(0).cast("int").alias("queue_id"), i.alias("queue_offset"), kind.alias("event"),
        F.when(checkish, "check").otherwise("producer").alias("source"),
        F.concat(F.lit("g"), (i % GROUPS).cast("string")).alias("producer_group"),
        F.concat(F.lit("T"), (i % TOPICS).cast("string")).alias("topic"),
        F.lit("").alias("transaction_id"), F.lit("").alias("message_id"),
        F.when(checkish, i % 16).otherwise(0).cast("int").alias("check_times"),
        (F.lit(1_700_000_000_000) + i).alias("born_ms"),
        (F.lit(1_700_000_000_000) + i + (i * 7919) % 600_000).alias("ts_ms"),
        F.when(i % 1000 == 999, "not_json").alias("malformed"),
    )


def python_rows(df: Any) -> list[tuple[Any, ...]]:
    """The same events as the tuples ``events.parse_event`` yields (via Arrow)."""
    table = df.select("event", "source", "producer_group", "topic", "check_times", "born_ms",
                      "ts_ms", "malformed").toArrow()
    cols = [table[name].to_pylist() for name in table.column_names]
    del table
    rows = []
    for ev, src, grp, top, chk, born, ts, bad in zip(*cols, strict=True):
        rows.append(("", "", "", "", "", "", 0, 0, 0, bad) if bad
                    else (ev, src, grp, top, "", "", chk, born, ts, None))
    return rows


def same(spark_rows: list[Rollup], python: list[Rollup]) -> bool:
    def strip(r: Rollup) -> tuple[Any, ...]:
        return (r.key, r.events, r.from_producer, r.from_check, r.latency_buckets,
                r.check_buckets, r.checks_sum, round(r.latency_sum_s, 3))
    return sorted(map(strip, spark_rows)) == sorted(map(strip, python))


def bench_aggregation(spark: Any, n: int) -> dict[str, float]:
    from tidemq_server.metrics.aggregate import aggregate, to_rollup

    err.print(f"aggregation: preparing {n:,} events …")
    df = synthetic(spark, n).cache()
    df.count()
    rows = python_rows(df)
    gc.collect()
    began = time.perf_counter()
    spark_result = [to_rollup(r) for r in aggregate(df).collect()]
    spark_s = time.perf_counter() - began
    gc.disable()
    try:
        began = time.perf_counter()
        py_result = python_rollup(rows)
        python_s = time.perf_counter() - began
    finally:
        gc.enable()
    df.unpersist()
    del rows
    gc.collect()
    if not same(spark_result, py_result):
        raise RuntimeError(f"Spark and Python disagree at {n:,} events")
    err.print(f"aggregation of {n:,}: Spark {spark_s:.2f}s, Python {python_s:.2f}s")
    return {"events": n, "spark_s": spark_s, "python_s": python_s}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``time = a + b * n``."""
    k = len(points)
    sx = sum(x for x, _ in points)
    sy = sum(y for _, y in points)
    sxx = sum(x * x for x, _ in points)
    sxy = sum(x * y for x, y in points)
    b = (k * sxy - sx * sy) / (k * sxx - sx * sx)
    return (sy - b * sx) / k, b


def crossover(results: list[dict[str, float]]) -> float | None:
    sa, sb = fit([(r["events"], r["spark_s"]) for r in results])
    pa, pb = fit([(r["events"], r["python_s"]) for r in results])
    if pb <= sb:
        return None  # Python is as fast per event: no crossover
    return max(0.0, (sa - pa) / (pb - sb))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes; under two minutes")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    args = ap.parse_args(argv)
    from tidemq_server.metrics.job import SessionConfig, build_session

    ingest_n = 200_000 if args.quick else 1_000_000
    sizes = [100_000, 1_000_000] if args.quick else [100_000, 1_000_000, 10_000_000]
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-metrics-bench-"))
    spark = build_session(SessionConfig(master="local[2]", app_name="tidemq-metrics-bench",
                                        extra={"spark.driver.memory": "4g"}))
    try:
        with broker(tmp) as url:
            ingest = bench_ingest(spark, url, ingest_n, tmp)
        from tidemq_server.metrics.aggregate import aggregate

        aggregate(synthetic(spark, 10_000)).collect()  # compiles the plan's generated code
        aggs = [bench_aggregation(spark, n) for n in sizes]
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    cross = crossover(aggs)
    largest = aggs[-1]
    rows = [
        Row("ingest: events through the data source", ingest["events_per_s"], "events/s",
            target=f">= {TARGET_INGEST:,.0f}", met=ingest["events_per_s"] >= TARGET_INGEST),
        Row(f"ingest: {ingest['events']:,} events, one available-now run (best of 2)",
            ingest["seconds"], "s"),
        Row("ingest: the other run", ingest["worst_events_per_s"], "events/s"),
        Row("ingest: same pulls + parsing, one plain loop", ingest["loop_events_per_s"],
            "events/s", ratio=ingest["events_per_s"] / ingest["loop_events_per_s"]),
    ]
    for r in aggs:
        n = int(r["events"])
        target, met = ("", None)
        if n == 10_000_000:
            target, met = f"<= {TARGET_10M_S:.0f} s", r["spark_s"] <= TARGET_10M_S
        rows.append(Row(f"aggregate {n:,}: Spark local[2]", r["spark_s"], "s",
                        ratio=r["python_s"] / r["spark_s"], target=target, met=met))
        rows.append(Row(f"aggregate {n:,}: Python loop", r["python_s"], "s"))
    rows.append(Row("crossover (Spark faster above)", cross, "events"))
    print_table(f"tidemq metrics bench ({'quick' if args.quick else 'full'})", rows,
                caption="ratio on Spark rows: Python time / Spark time (> 1: Spark faster); "
                        "ingest ratio: job / plain loop")
    err.print(f"total {time.perf_counter() - began:.0f}s")
    if args.json:
        print_json({
            "ingest_events_per_s": round(ingest["events_per_s"]),
            "ingest_loop_events_per_s": round(ingest["loop_events_per_s"]),
            "ingest_worst_events_per_s": round(ingest["worst_events_per_s"]),
            "ingest_events": ingest["events"],
            "spark_events_per_s": round(largest["events"] / largest["spark_s"]),
            "python_events_per_s": round(largest["events"] / largest["python_s"]),
            "events": int(largest["events"]),
            "aggregation": {str(int(r["events"])): {"spark_s": round(r["spark_s"], 3),
                                                    "python_s": round(r["python_s"], 3)}
                            for r in aggs},
            "crossover_events": None if cross is None else round(cross),
        })
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
