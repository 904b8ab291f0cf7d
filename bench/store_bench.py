"""Store benchmark: the commit log's append, read and recovery rates against a plain-Python floor.

Run ``python -m bench.store_bench [--quick] [--json] [--profile]``.

Every figure is measured on 1 KiB messages (topic ``BenchTopic``, 8 queues, properties
``UNIQ_KEY`` = a unique id and ``TAGS``) and compared with a baseline measured in the same run:
a plain loop that packs the very same record bytes (``record.encode_payload`` +
``record.encode_header``: struct + CRC32) and appends them with ``os.write`` in 64-record
batches, without fsync — the ceiling of a store written in this language (its baseline row).

1. baseline                 records/s of that loop
2. async append             64 writer coroutines, ``await store.put([rec])`` each, flush=async
                            (extra rows: 16 records per put; a producer's v2 batch of 16,
                            validated and appended as sent: the broker's part of a batch send)
3. sync append              the same with flush=sync (group commit), plus records per fsync
                            (extra row: 16 records per put)
4. sequential read          ``store.get(topic, qid, offset, 32..256)`` per queue, everything back
5. recovery                 a child process writes the log through the store, lets a checkpoint
                            happen, writes ~64 MiB more without one and SIGKILLs itself; the
                            parent times ``MessageStore.open`` + ``close`` and checks every
                            acknowledged record is back

CPU per record: the store runs in this process, so its one side is this process's CPU over
each phase (``time.process_time``) divided by its records.

``--profile`` wraps the store phases in cProfile and prints the hottest functions to stderr
(the figures of a profiled run are slower than real; use them only for where time goes).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import os
import pstats
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from struct import pack_into as struct_pack_into
from typing import Any

from tidemq.protocol.records._compiled import COMPILED
from tidemq.protocol.records.v2 import CLIENT_PROPERTIES, BatchBuilder
from tidemq.protocol.records.v2_read import validate

from bench._common import Row, err, loop_name, print_json, print_table, progress, run
from tidemq_server.broker.store import (
    FlushMode,
    GetStatus,
    MessageRecord,
    MessageStore,
    PutResult,
    PutStatus,
    StoreConfig,
    tag_code,
)
from tidemq_server.broker.store.checkpoint import Checkpoint
from tidemq_server.broker.store.records import v1 as rec_fmt
from tidemq_server.broker.store.records.v1 import encode_host
from tidemq_server.broker.store.records.v2_own import Batch

MiB = 1024 * 1024
GiB = 1024 * MiB

TOPIC = "BenchTopic"
QUEUES = 8
BODY_BYTES = 1024
TAGS = ("TagA", "TagB", "TagC")
TAG_CODES = tuple(tag_code(t) for t in TAGS)
BORN_HOST = "192.168.1.23:52314"
STORE_HOST = "127.0.0.1:10911"
WRITERS = 64
BASELINE_BATCH = 64
READ_COUNTS = (32, 64, 128, 256)
HEADER_WRITTEN = rec_fmt.HEADER_SIZE - 4  # body_len travels in the payload
crc32 = zlib.crc32

TARGET_ASYNC = 0.5
TARGET_SYNC = 0.3
TARGET_READ = 1.0
TARGET_RECOVERY_S_2GIB = 3.0
TARGET_RECOVERY_S_PER_GIB = TARGET_RECOVERY_S_2GIB / 2


@dataclass(frozen=True, slots=True)
class Sizes:
    baseline: int  # records
    async_single: int
    async_batched: int
    sync_single: int
    sync_batched: int
    recovery_bytes: int  # commit log bytes covered by the checkpoint
    recovery_segment: int
    recovery_lag: int  # bytes written after the last checkpoint, before the crash


QUICK = Sizes(baseline=100_000, async_single=100_000, async_batched=100_000, sync_single=50_000,
              sync_batched=80_000, recovery_bytes=256 * MiB, recovery_segment=64 * MiB,
              recovery_lag=64 * MiB)
FULL = Sizes(baseline=500_000, async_single=300_000, async_batched=400_000, sync_single=150_000,
             sync_batched=300_000, recovery_bytes=2 * GiB, recovery_segment=1 * GiB,
             recovery_lag=64 * MiB)


# --- records ---------------------------------------------------------------------------------
class Records:
    """Builds bench records: 1 KiB random-ish bodies, 8 queues, a unique id and a tag each."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.bodies = [rng.randbytes(BODY_BYTES) for _ in range(256)]
        self.prefix = rng.randbytes(8).hex().upper()  # 16 hex digits; the counter adds 16
        self.born_ms = int(time.time() * 1000)

    def make(self, i: int) -> MessageRecord:
        t = i % 3
        return MessageRecord(
            topic=TOPIC, queue_id=i % QUEUES, body=self.bodies[i & 255],
            properties={"UNIQ_KEY": f"{self.prefix}{i:016X}", "TAGS": TAGS[t]},
            tag_code=TAG_CODES[t], born_timestamp=self.born_ms + i // 1000, born_host=BORN_HOST,
        )

    def many(self, start: int, n: int) -> list[MessageRecord]:
        return [self.make(i) for i in range(start, start + n)]


@contextmanager
def frozen_garbage() -> Iterator[None]:
    """Keep the collector off the pre-built records (a harness artefact, not store work)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# --- profiling -------------------------------------------------------------------------------
class Profiler:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.reports: dict[str, str] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        prof = cProfile.Profile()
        prof.enable()
        try:
            yield
        finally:
            prof.disable()
            self.record(name, prof)

    def record(self, name: str, prof: cProfile.Profile) -> None:
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats("tottime").print_stats(22)
        st.sort_stats("cumulative").print_stats(18)
        self.reports[name] = buf.getvalue()

    def dump(self) -> None:
        for name, text in self.reports.items():
            sys.stderr.write(f"\n===== profile: {name} =====\n{text}")
        sys.stderr.flush()


# --- 1. baseline -----------------------------------------------------------------------------
def bench_baseline(recs: list[MessageRecord], path: Path) -> dict[str, float]:
    encode_payload, encode_header = rec_fmt.encode_payload, rec_fmt.encode_header
    host = rec_fmt.encode_host(STORE_HOST)
    qoffs = [0] * QUEUES
    phys = 0
    n = len(recs)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        with progress() as prog:
            task = prog.add_task("baseline pack + os.write", total=n)
            t0, c0 = time.perf_counter(), time.process_time()
            for b in range(0, n, BASELINE_BATCH):
                now_ms = int(time.time() * 1000)
                buf = bytearray()
                for rec in recs[b:b + BASELINE_BATCH]:
                    payload = encode_payload(rec)
                    size = HEADER_WRITTEN + len(payload)
                    q = rec.queue_id
                    qoff = qoffs[q]
                    qoffs[q] = qoff + 1
                    buf += encode_header(rec, size, qoff, phys, now_ms, host, payload)
                    buf += payload
                    phys += size
                os.write(fd, buf)
                if not b & 0x3FFF:
                    prog.update(task, completed=b)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            prog.update(task, completed=n)
    finally:
        os.close(fd)
    return {"records_per_s": n / elapsed, "mb_per_s": phys / elapsed / 1e6, "seconds": elapsed,
            "cpu_util": cpu / elapsed, "bytes": float(phys)}


LEAN_HEADER = struct.Struct(">iIIiiqqiq8sq8siqq")  # the record header minus body_len


def lean_header(rec: MessageRecord, size: int, qoff: int, phys: int, now_ms: int,
                store_host: bytes, born_host: bytes, payload: bytes) -> bytearray:
    head = bytearray(LEAN_HEADER.pack(
        size, rec_fmt.MAGIC, 0, rec.queue_id, rec.flag, qoff, phys, rec.sys_flag,
        rec.born_timestamp, born_host, now_ms, store_host, rec.reconsume_times,
        rec.prepared_tx_offset, rec.tag_code))
    struct_pack_into(">I", head, 8, crc32(payload, crc32(memoryview(head)[12:])))
    return head


def bench_lean(recs: list[MessageRecord], path: Path) -> dict[str, float]:
    """The baseline with the born host encoded once per distinct host (same bytes, checked).

    Only informational: what the record format costs when nothing is re-parsed per record,
    i.e. the floor a store in this language reaches (~330k records/s on these machines).
    """
    encode_payload = rec_fmt.encode_payload
    store_host = rec_fmt.encode_host(STORE_HOST)
    hosts: dict[str, bytes] = {}
    for probe in recs[:8]:
        p0 = encode_payload(probe)
        args = (probe, HEADER_WRITTEN + len(p0), 3, 12345, 1_700_000_000_000, store_host)
        if bytes(lean_header(*args, rec_fmt.encode_host(probe.born_host), p0)) != \
                rec_fmt.encode_header(*args, p0):
            raise RuntimeError("lean packer bytes differ from record.encode_header")
    qoffs = [0] * QUEUES
    phys = 0
    n = len(recs)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        for b in range(0, n, BASELINE_BATCH):
            now_ms = int(time.time() * 1000)
            buf = bytearray()
            for rec in recs[b:b + BASELINE_BATCH]:
                payload = encode_payload(rec)
                size = HEADER_WRITTEN + len(payload)
                q = rec.queue_id
                qoff = qoffs[q]
                qoffs[q] = qoff + 1
                born = hosts.get(rec.born_host)
                if born is None:
                    born = hosts[rec.born_host] = rec_fmt.encode_host(rec.born_host)
                buf += lean_header(rec, size, qoff, phys, now_ms, store_host, born, payload)
                buf += payload
                phys += size
            os.write(fd, buf)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        os.close(fd)
    return {"records_per_s": n / elapsed, "seconds": elapsed, "cpu_util": cpu / elapsed}


# --- 2./3. append ----------------------------------------------------------------------------
async def _monitor(prog: Any, task: Any, done: Callable[[], int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        prog.update(task, completed=done())
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass
    prog.update(task, completed=done())


async def bench_append(store: MessageStore, recs: list[MessageRecord], per_put: int,
                       label: str, batches: bool = False) -> dict[str, float]:
    """``WRITERS`` coroutines, each putting ``per_put`` records per call until all are in;
    ``batches``: each call is one producer-made v2 batch of ``per_put`` records (encoded before
    the clock starts, as a producer does), validated strictly and appended as it is, which is
    the broker's part of a batch send."""
    done = 0
    busy = 0
    shares = [recs[w::WRITERS] for w in range(WRITERS)]
    born = encode_host(BORN_HOST)

    async def put_batch(raw: bytes) -> PutResult:
        summary = validate(raw, allowed=CLIENT_PROPERTIES)
        return await store.writer.append_batches([Batch(raw, summary, born)])

    async def writer(mine: list[MessageRecord]) -> None:
        nonlocal done, busy
        put = store.put
        i, n = 0, len(mine)
        encoded = [_as_batch(mine[k:k + per_put]) for k in range(0, n, per_put)] \
            if batches else []
        while i < n:
            batch = mine[i:i + per_put]
            res = await (put_batch(encoded[i // per_put]) if batches else put(batch))
            if res.status is PutStatus.OK:
                i += per_put
                done += len(batch)
            elif res.status is PutStatus.BUSY:
                busy += 1
                await asyncio.sleep(0.002)
            else:
                raise RuntimeError(f"put failed: {res.status} {res.message}")

    before = dict(store.writer.stats)
    with progress() as prog:
        task = prog.add_task(label, total=len(recs))
        stop = asyncio.Event()
        mon = asyncio.create_task(_monitor(prog, task, lambda: done, stop))
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(writer(s) for s in shares))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        stop.set()
        await mon
    stats = {k: v - before.get(k, 0) for k, v in store.writer.stats.items()}
    if done != len(recs):
        raise RuntimeError(f"{label}: {done} of {len(recs)} records acknowledged")
    return {"msgs_per_s": done / elapsed, "mb_per_s": stats["put_bytes"] / elapsed / 1e6,
            "seconds": elapsed, "cpu_util": cpu / elapsed, "busy": float(busy),
            "records_per_write": stats["put_records"] / max(1, stats["writes"]),
            "records_per_fsync": (stats["put_records"] / stats["fsyncs"]
                                  if stats["fsyncs"] else 0.0),
            "fsyncs": float(stats["fsyncs"])}


def _as_batch(recs: list[MessageRecord]) -> bytes:
    """The v2 batch a producer would send for ``recs`` (all of one queue)."""
    b = BatchBuilder(recs[0].topic, recs[0].queue_id)
    for r in recs:
        b.add(r.body, r.properties["UNIQ_KEY"], tag=r.properties.get("TAGS"),
              born_timestamp=r.born_timestamp)
    return b.finish()


def cpu_us(fig: dict[str, float]) -> float:
    """CPU µs per record of a phase: its CPU share over its rate."""
    return fig["cpu_util"] / fig["msgs_per_s"] * 1e6 if fig["msgs_per_s"] else 0.0


def store_config(root: Path, flush: FlushMode, **kw: Any) -> StoreConfig:
    return StoreConfig(root=root, flush=flush, store_host=STORE_HOST, **kw)


async def append_phase(root: Path, recs: list[MessageRecord], flush: FlushMode, per_put: int,
                       label: str, prof: Profiler, keep_open: bool = False,
                       batches: bool = False) -> tuple[dict[str, float], MessageStore | None]:
    store = await MessageStore.open(store_config(root, flush))
    try:
        with prof.phase(label):
            res = await bench_append(store, recs, per_put, label, batches)
    except BaseException:
        await store.close()
        raise
    if keep_open:
        return res, store
    await store.close()
    return res, None


# --- 4. read ---------------------------------------------------------------------------------
def bench_read(store: MessageStore, expected: int) -> dict[str, float]:
    n = 0
    nbytes = 0
    gets = 0
    with progress() as prog:
        task = prog.add_task("sequential read by queue", total=expected)
        t0, c0 = time.perf_counter(), time.process_time()
        for qid in range(QUEUES):
            offset = 0
            k = 0
            while True:
                res = store.get(TOPIC, qid, offset, READ_COUNTS[k & 3])
                k += 1
                gets += 1
                if res.status is GetStatus.NO_MESSAGE:
                    break
                if res.status is not GetStatus.FOUND:
                    raise RuntimeError(f"read queue {qid} at {offset}: {res.status}")
                n += len(res.records)
                for r in res.records:
                    nbytes += r.size
                offset = res.next_offset
                if not gets & 63:
                    prog.update(task, completed=n)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        prog.update(task, completed=n)
    if n != expected:
        raise RuntimeError(f"read back {n} records, expected {expected}")
    return {"msgs_per_s": n / elapsed, "mb_per_s": nbytes / elapsed / 1e6, "seconds": elapsed,
            "cpu_util": cpu / elapsed, "gets": float(gets)}


# --- 5. recovery -----------------------------------------------------------------------------
RECOVERY_WRITERS = 8
RECOVERY_PER_PUT = 128


async def _child_write(root: Path, segment: int, interval_ms: int, records: Records,
                       start: int, until_offset: int) -> tuple[int, int, MessageStore]:
    """Batched puts until the log reaches ``until_offset``: (records acked, next id, store)."""
    cfg = store_config(root, FlushMode.ASYNC, segment_bytes=segment,
                       flush_interval_ms=interval_ms, retention_interval_s=3600.0)
    store = await MessageStore.open(cfg)
    end = store.log.write_offset
    nxt = start
    acked = 0
    last_report = 0

    async def writer() -> None:
        nonlocal end, nxt, acked, last_report
        while end < until_offset:
            first = nxt
            nxt += RECOVERY_PER_PUT
            batch = records.many(first, RECOVERY_PER_PUT)
            res = await store.put(batch)
            if res.status is PutStatus.BUSY:
                await asyncio.sleep(0.002)
                continue  # those ids are skipped; nothing was written
            if res.status is not PutStatus.OK:
                raise RuntimeError(f"put failed: {res.status} {res.message}")
            acked += len(batch)
            last = res.appended[-1]
            end = max(end, last.physical_offset + last.size)
            if end - last_report >= 16 * MiB:
                last_report = end
                print(f"progress {end}", flush=True)

    await asyncio.gather(*(writer() for _ in range(RECOVERY_WRITERS)))
    return acked, nxt, store


async def _child_main(root: Path, total: int, segment: int, lag: int) -> None:
    records = Records(seed=5)
    # 1. the bulk of the log, then checkpoints that cover all of it
    acked1, nxt, store = await _child_write(root, segment, 500, records, 0, total)
    await asyncio.sleep(1.2)  # let the periodic checkpoint (every 500 ms) run, as in production
    await store.close()  # ... and the closing one, so the checkpoint is exactly at the end
    print("phase tail", flush=True)
    # 2. reopen with a checkpoint period that never comes; write the tail; die without warning
    acked2, _, store = await _child_write(root, segment, 3_600_000, records, nxt, total + lag)
    print(f"done {acked1 + acked2} {store.log.write_offset}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def recovery_child(root: str, total: int, segment: int, lag: int) -> None:
    """Entry point of the crashing writer process (``python -c``)."""
    run(_child_main(Path(root), total, segment, lag))


def build_crashed_log(root: Path, sizes: Sizes) -> dict[str, float]:
    code = (f"from bench.store_bench import recovery_child; "
            f"recovery_child({str(root)!r}, {sizes.recovery_bytes}, {sizes.recovery_segment}, "
            f"{sizes.recovery_lag})")
    repo = Path(__file__).resolve().parents[1]
    total = sizes.recovery_bytes + sizes.recovery_lag
    written = -1
    log_end = -1
    t0 = time.perf_counter()
    with progress() as prog:
        task = prog.add_task(f"recovery: write {total / GiB:.2f} GiB (MiB) then SIGKILL",
                             total=total // MiB)
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, stdout=subprocess.PIPE,
                                text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            word, *rest = line.split()
            if word == "progress":
                prog.update(task, completed=int(rest[0]) // MiB)
            elif word == "done":
                written, log_end = int(rest[0]), int(rest[1])
                prog.update(task, completed=log_end // MiB)
        rc = proc.wait()
    elapsed = time.perf_counter() - t0
    if rc != -signal.SIGKILL or written < 0:
        raise RuntimeError(f"recovery writer exited with {rc} (expected SIGKILL) before 'done'")
    return {"acked_records": float(written), "log_end": float(log_end),
            "write_seconds": elapsed, "write_mb_per_s": log_end / elapsed / 1e6}


async def bench_recovery(root: Path, sizes: Sizes, prof: Profiler) -> dict[str, float]:
    crashed = build_crashed_log(root, sizes)
    cp = Checkpoint.load(root / "checkpoint")
    lag = crashed["log_end"] - cp.dispatched
    cfg = store_config(root, FlushMode.ASYNC, segment_bytes=sizes.recovery_segment)
    err.print(f"recovery: log ends at {crashed['log_end'] / GiB:.3f} GiB, checkpoint at "
              f"{cp.dispatched / GiB:.3f} GiB (lag {lag / MiB:.1f} MiB); opening ...")
    if prof.enabled:  # recovery runs in a worker thread; profile it in this one instead
        p = cProfile.Profile()
        t0 = time.perf_counter()
        inline = MessageStore(cfg)
        p.runcall(inline._recover)
        inline.dispatcher.close()
        inline.index.close()
        inline.log.close()
        prof.record("recovery (_recover, run inline)", p)
        err.print(f"recovery (profiled, inline): {time.perf_counter() - t0:.2f}s")
        # the profiled open left a clean-ish state; rebuild the crash for the timed open
        shutil.rmtree(root)
        crashed = build_crashed_log(root, sizes)
        cp = Checkpoint.load(root / "checkpoint")
        lag = crashed["log_end"] - cp.dispatched
    t0 = time.perf_counter()
    store = await MessageStore.open(cfg)
    t_open = time.perf_counter() - t0
    found = sum(store.queue_offsets(TOPIC, q)[1] for q in range(QUEUES))
    log_bytes = store.log.write_offset
    redispatched = store.recovered_records
    inner = store.recovery_seconds
    t1 = time.perf_counter()
    await store.close()
    t_close = time.perf_counter() - t1
    return {"open_s": t_open, "close_s": t_close, "total_s": t_open + t_close,
            "s_per_gib": t_open / (log_bytes / GiB), "log_gib": log_bytes / GiB,
            "lag_mib": lag / MiB, "redispatched": float(redispatched),
            "store_recovery_s": inner, "found_records": float(found),
            "acked_records": crashed["acked_records"],
            "all_records": float(found == crashed["acked_records"]),
            "log_intact": float(log_bytes == crashed["log_end"]),
            "write_mb_per_s": crashed["write_mb_per_s"]}


# --- the run ---------------------------------------------------------------------------------
def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


async def run_store_phases(tmp: Path, sizes: Sizes, records: Records, prof: Profiler
                           ) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}

    recs = records.many(1_000_000_000, sizes.async_single)
    with frozen_garbage():
        out["async"], store = await append_phase(
            tmp / "async1", recs, FlushMode.ASYNC, 1, "async append, 1 rec/put", prof,
            keep_open=True)
        assert store is not None
        try:
            with prof.phase("sequential read"):
                out["read"] = bench_read(store, len(recs))
        finally:
            await store.close()
    del recs
    shutil.rmtree(tmp / "async1")

    recs = records.many(2_000_000_000, sizes.async_batched)
    with frozen_garbage():
        out["async_batched"], _ = await append_phase(
            tmp / "async16", recs, FlushMode.ASYNC, 16, "async append, 16 rec/put", prof)
    del recs
    shutil.rmtree(tmp / "async16")

    recs = records.many(2_500_000_000, sizes.async_batched)
    with frozen_garbage():
        out["async_v2"], _ = await append_phase(
            tmp / "asyncv2", recs, FlushMode.ASYNC, 16, "async append, producer batches of 16",
            prof, batches=True)
    del recs
    shutil.rmtree(tmp / "asyncv2")

    recs = records.many(3_000_000_000, sizes.sync_single)
    with frozen_garbage():
        out["sync"], _ = await append_phase(
            tmp / "sync1", recs, FlushMode.SYNC, 1, "sync append, 1 rec/put", prof)
    del recs
    shutil.rmtree(tmp / "sync1")

    recs = records.many(4_000_000_000, sizes.sync_batched)
    with frozen_garbage():
        out["sync_batched"], _ = await append_phase(
            tmp / "sync16", recs, FlushMode.SYNC, 16, "sync append, 16 rec/put", prof)
    del recs
    shutil.rmtree(tmp / "sync16")

    out["recovery"] = await bench_recovery(tmp / "recovery", sizes, prof)
    shutil.rmtree(tmp / "recovery", ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.store_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes; under a minute")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the store phases; print the hottest functions to stderr")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: /tmp)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    loop = loop_name()
    err.print(f"store bench ({'quick' if args.quick else 'full'}), event loop: {loop}")
    prof = Profiler(args.profile)
    records = Records(seed=1)
    began = time.perf_counter()

    tmp = Path(tempfile.mkdtemp(prefix="tidemq-store-bench-", dir=args.dir))
    try:
        recs = records.many(0, sizes.baseline)
        with frozen_garbage():
            runs = sorted((bench_baseline(recs, tmp / "baseline.log") for _ in range(3)),
                          key=lambda r: r["records_per_s"])
            lean = bench_lean(recs, tmp / "baseline.log")
        base = runs[1]  # the median of three: the box is shared and noisy
        del recs
        (tmp / "baseline.log").unlink()
        phases = run(run_store_phases(tmp, sizes, records, prof))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_s = time.perf_counter() - began

    b = base["records_per_s"]
    a, a16, s, s16 = (phases[k] for k in ("async", "async_batched", "sync", "sync_batched"))
    rd, rc = phases["read"], phases["recovery"]
    full_size = rc["log_gib"] >= 2.0
    us = {key: cpu_us(fig) for key, fig in (("baseline", {**base, "msgs_per_s": b}), ("async", a),
                                            ("async_batched", a16), ("sync", s),
                                            ("sync_batched", s16), ("read", rd))}
    rec_target_s = TARGET_RECOVERY_S_2GIB
    rows = [
        Row(f"baseline: pack + os.write, {BASELINE_BATCH}/batch, no fsync (median of 3)", b,
            "records/s", 1.0),
        Row("baseline, born host bytes cached (extra; the §9 floor)",
            lean["records_per_s"], "records/s", ratio(lean["records_per_s"], b)),
        Row("async append, 64 writers x 1 rec/put", a["msgs_per_s"], "msgs/s",
            ratio(a["msgs_per_s"], b), f">= {TARGET_ASYNC}x baseline",
            ratio(a["msgs_per_s"], b) >= TARGET_ASYNC),
        Row("async append, 64 writers x 1 rec/put", a["mb_per_s"], "MB/s"),
        Row("async append, 64 writers x 16 rec/put (extra)", a16["msgs_per_s"], "msgs/s",
            ratio(a16["msgs_per_s"], b)),
        Row("async append, 64 writers x producer batch of 16 (v2 as sent; extra)",
            phases["async_v2"]["msgs_per_s"], "msgs/s",
            ratio(phases["async_v2"]["msgs_per_s"], b)),
        Row("sync append (group commit), 64 x 1 rec/put", s["msgs_per_s"], "msgs/s",
            ratio(s["msgs_per_s"], b), f">= {TARGET_SYNC}x baseline",
            ratio(s["msgs_per_s"], b) >= TARGET_SYNC),
        Row("sync append: records per fsync", s["records_per_fsync"], "records/fsync",
            target="<= 64 (one put in flight per writer)"),
        Row("sync append, 64 writers x 16 rec/put (extra)", s16["msgs_per_s"], "msgs/s",
            ratio(s16["msgs_per_s"], b)),
        Row("sync append x16: records per fsync", s16["records_per_fsync"], "records/fsync"),
        Row("sequential read by queue (get 32..256), vs async append", rd["msgs_per_s"],
            "msgs/s", ratio(rd["msgs_per_s"], a["msgs_per_s"]),
            f">= {TARGET_READ}x async append",
            ratio(rd["msgs_per_s"], a["msgs_per_s"]) >= TARGET_READ),
        Row("sequential read by queue, vs baseline", rd["msgs_per_s"], "msgs/s",
            ratio(rd["msgs_per_s"], b)),
        *[Row(f"  CPU per record, {what} (this process: the store's one side)", us[key], "µs")
          for key, what in (("baseline", "baseline"), ("async", "async append"),
                            ("sync", "sync append"), ("read", "sequential read"))],
        Row(f"recovery: open + close, {rc['log_gib']:.2f} GiB log, "
            f"{rc['lag_mib']:.0f} MiB past checkpoint", rc["total_s"], "s",
            target=f"<= {rec_target_s:.0f} s (2 GiB)", met=rc["total_s"] <= rec_target_s),
        Row("recovery: open seconds per GiB of log", rc["s_per_gib"], "s/GiB",
            target=f"<= {TARGET_RECOVERY_S_PER_GIB} s/GiB"
            + ("" if full_size else " (judged on the full run)"),
            met=rc["s_per_gib"] <= TARGET_RECOVERY_S_PER_GIB if full_size else None),
        Row("recovery: acknowledged records back after SIGKILL", rc["found_records"],
            "records", target=f"= {rc['acked_records']:,.0f} acked",
            met=bool(rc["all_records"])),
    ]
    notes = [f"event loop: {loop}; {os.cpu_count()} CPUs; scratch dir on "
             f"{args.dir or tempfile.gettempdir()}; total {total_s:.0f} s",
             "baseline runs: " + ", ".join(f"{r['records_per_s']:,.0f}" for r in runs)
             + " records/s (median used)",
             f"busy refusals retried: async {a['busy']:.0f}, async x16 {a16['busy']:.0f}, "
             f"sync {s['busy']:.0f}, sync x16 {s16['busy']:.0f}; records per write: "
             f"async {a['records_per_write']:.1f}, sync {s['records_per_write']:.1f}",
             f"recovery re-dispatched {rc['redispatched']:,.0f} records in "
             f"{rc['store_recovery_s']:.2f} s (open {rc['open_s']:.2f} s, close "
             f"{rc['close_s']:.2f} s); page cache warm (log just written)"]
    if not full_size:
        notes.append("quick: the recovery log is small, so s/GiB is dominated by the fixed "
                     "64 MiB re-dispatch tail")
    if args.profile:
        notes.append("PROFILED RUN: figures include cProfile overhead")
    notes.append(f"record core: {'compiled' if COMPILED else 'pure Python'}")
    print_table(f"tidemq store bench ({'quick' if args.quick else 'full'})", rows,
                caption="\n".join(notes))
    prof.dump()

    if args.json:
        print_json({
            "bench": "store", "quick": args.quick, "event_loop": loop,
            "compiled": COMPILED,  # the compiled record core ran (else the pure-Python one)
            "baseline_records_per_s": b, "baseline_mb_per_s": base["mb_per_s"],
            "baseline_runs_records_per_s": [r["records_per_s"] for r in runs],
            "baseline_lean_records_per_s": lean["records_per_s"],
            "async_append_msgs_per_s": a["msgs_per_s"], "async_append_mb_per_s": a["mb_per_s"],
            "async_append_ratio": ratio(a["msgs_per_s"], b),
            "async_batched_msgs_per_s": a16["msgs_per_s"],
            "async_batched_ratio": ratio(a16["msgs_per_s"], b),
            "async_v2_batch_msgs_per_s": phases["async_v2"]["msgs_per_s"],
            "async_v2_batch_ratio": ratio(phases["async_v2"]["msgs_per_s"], b),
            "sync_append_msgs_per_s": s["msgs_per_s"], "sync_append_mb_per_s": s["mb_per_s"],
            "sync_append_ratio": ratio(s["msgs_per_s"], b),
            "records_per_fsync": s["records_per_fsync"],
            "sync_batched_msgs_per_s": s16["msgs_per_s"],
            "sync_batched_ratio": ratio(s16["msgs_per_s"], b),
            "sync_batched_records_per_fsync": s16["records_per_fsync"],
            "read_msgs_per_s": rd["msgs_per_s"], "read_mb_per_s": rd["mb_per_s"],
            "read_ratio": ratio(rd["msgs_per_s"], a["msgs_per_s"]),
            "read_baseline_ratio": ratio(rd["msgs_per_s"], b),
            "recovery_s": rc["total_s"], "recovery_open_s": rc["open_s"],
            "recovery_close_s": rc["close_s"], "recovery_s_per_gib": rc["s_per_gib"],
            "recovery_log_gib": rc["log_gib"], "recovery_lag_mib": rc["lag_mib"],
            "recovery_redispatched": rc["redispatched"],
            "recovery_all_records": bool(rc["all_records"]),
            "cpu_util": {"baseline": base["cpu_util"], "async": a["cpu_util"],
                         "async_batched": a16["cpu_util"], "sync": s["cpu_util"],
                         "sync_batched": s16["cpu_util"], "read": rd["cpu_util"]},
            "us_per_record": us,
            "busy": {"async": a["busy"], "async_batched": a16["busy"], "sync": s["busy"],
                     "sync_batched": s16["busy"]},
            "targets_met": {r.figure: r.met for r in rows if r.met is not None},
            "total_s": total_s,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
