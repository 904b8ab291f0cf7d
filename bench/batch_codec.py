"""Record format v2 codec: µs per record of every step, pure Python beside a compiled build.

Run ``python -m bench.batch_codec [--quick] [--json] [--no-compiled]``.

Each step runs over batches of 256 records of 1 KiB (32-hex message ids, as the SDK sends
them; a "rich" row adds a tag, two keys and two properties) and is reported in CPU µs per
record (``time.process_time``), the best of 3 x 5 rounds (the box is shared: the best round is
the one least disturbed):

- v2 steps: the producer's ``BatchBuilder`` (encode + CRC), the broker's strict ``validate`` of
  a client batch, its ``fill`` of the broker part, the integrity ``validate`` recovery and
  replication run, building a stored-form pull answer (``append_group``), and the consumer's
  ``decode_stored`` (eager part; then with every body read);
- today's (v1) steps, for scale: the SDK's ``to_wire`` + ``msgpack.packb``, the broker's
  ``parse_messages`` + ``to_record`` + record pack (``encode_head``, ``encode_payload``,
  ``append_encoded``), its pull read (``record.decode`` + ``to_wire`` + ``packb``) and the
  SDK's ``unpackb`` + ``ReceivedMessage.from_wire``.

The compiled column is the Cython record core (``tidemq/protocol/records/_crecords.pyx``,
built by ``pip install`` or ``python setup.py build_ext --inplace``); the pure column is the
same code with ``TIDEMQ_PURE_PYTHON=1`` (the pure-Python reference). Each is measured in a
child process, the two alternating in one run so that both see the same load;
``--no-compiled`` measures the pure column only. A second table lists the compiled steps in
the order they were compiled (payoff first). The JSON says ``compiled``: whether the compiled
core was built and ran.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import Row, err, print_json, print_table

REPO = Path(__file__).resolve().parents[1]
BATCH = 256
BODY = 1024
PURE_ENV = "TIDEMQ_PURE_PYTHON"  # tidemq/protocol/records/_compiled.py


def best_us(fn: Callable[[], Any], records: int, rounds: int) -> float:
    """CPU µs per record of ``fn`` (which handles ``records`` records), best of ``rounds``.
    CPU time, not wall time: on a shared box a waiting process's clock runs on."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best / records * 1e6


def measure(batches: int, rounds: int) -> dict[str, Any]:
    """Every step's µs per record with the ``tidemq`` this process imports."""
    import msgpack
    from tidemq.protocol import ReceivedMessage, parse_messages
    from tidemq.protocol.message import OutgoingMessage
    from tidemq.protocol.records import v2 as v2
    from tidemq.protocol.records._compiled import COMPILED
    from tidemq.protocol.records.stored import append_group, decode_stored
    from tidemq.protocol.records.v2_read import validate

    from tidemq_server.broker.messaging.convert import to_record, to_wire
    from tidemq_server.broker.store.records import v1 as v1

    rng = random.Random(1)
    bodies = [rng.randbytes(BODY) for _ in range(64)]
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(BATCH * batches)]
    n = BATCH * batches
    out: dict[str, Any] = {"compiled": COMPILED}

    def encode(rich: bool = False) -> list[bytes]:
        made = []
        for b in range(batches):
            builder = v2.BatchBuilder("BenchTP", 3)
            for i in range(b * BATCH, (b + 1) * BATCH):
                if rich:
                    builder.add(bodies[i & 63], ids[i], tag="Paid", keys=["order-42", "u-7"],
                                properties={"region": "eu", "tier": "gold"},
                                born_timestamp=1_767_225_600_000)
                else:
                    builder.add(bodies[i & 63], ids[i], born_timestamp=1_767_225_600_000)
            made.append(builder.finish())
        return made

    raw = encode()
    rich = encode(True)
    stored = [bytearray(b) for b in raw]
    host = v1.encode_host("127.0.0.1:10911")
    out["v2_encode"] = best_us(encode, n, rounds)
    out["v2_encode_rich"] = best_us(lambda: encode(True), n, rounds)
    out["v2_validate_strict"] = best_us(lambda: [validate(b) for b in raw], n, rounds)
    out["v2_validate_strict_rich"] = best_us(lambda: [validate(b) for b in rich], n, rounds)

    def fill_all() -> None:
        for i, b in enumerate(stored):
            v2.fill(b, 0, 4096 * i, 100 * i, 1, host)

    out["v2_fill"] = best_us(fill_all, n, rounds)
    out["v2_validate_stored"] = best_us(lambda: [validate(b, strict=False, offset=4096 * i)
                                              for i, b in enumerate(stored)], n, rounds)
    sums = [validate(b, strict=False) for b in stored]

    def serve() -> bytes:
        blob = bytearray()
        for b, s in zip(stored, sums, strict=True):
            view = memoryview(b)
            append_group(blob, view[:s.head.records_at],
                         [view[p:p + z] for p, z in zip(s.positions, s.sizes, strict=True)])
        return bytes(blob)

    blob = serve()
    out["v2_serve"] = best_us(serve, n, rounds)
    out["v2_decode_lazy"] = best_us(lambda: decode_stored(blob), n, rounds)
    out["v2_decode_bodies"] = best_us(lambda: [m.body for m in decode_stored(blob)], n, rounds)

    # today's path (format v1, msgpack), for scale
    msgs = [OutgoingMessage(bodies[i & 63], ids[i]) for i in range(n)]
    wire = [[m.to_wire(binary=True) for m in msgs[b * BATCH:(b + 1) * BATCH]]
            for b in range(batches)]
    packed = [msgpack.packb({"messages": w}, use_bin_type=True) for w in wire]
    out["v1_sdk_send"] = best_us(lambda: [msgpack.packb({"messages": [
        m.to_wire(binary=True) for m in msgs[b * BATCH:(b + 1) * BATCH]]}, use_bin_type=True)
        for b in range(batches)], n, rounds)

    def broker_send() -> bytearray:
        buf = bytearray()
        for p in packed:
            for m in parse_messages(msgpack.unpackb(p, raw=False)):
                rec = to_record(m, "BenchTP", 3, m.message_id or "", 1, "127.0.0.1:1")
                v1.append_encoded(buf, v1.encode_head(rec, host), v1.encode_payload(rec), 0,
                                  len(buf), 1)
        return buf

    log = bytes(broker_send())
    out["v1_broker_send"] = best_us(broker_send, n, rounds)
    spots: list[int] = []
    p = 0
    while p < len(log):
        spots.append(p)
        p += int.from_bytes(log[p:p + 4], "big")

    def broker_pull() -> list[bytes]:
        return [msgpack.packb({"messages": [to_wire(v1.decode(log, q, q), True)
                                            for q in spots[b * BATCH:(b + 1) * BATCH]]},
                              use_bin_type=True) for b in range(batches)]

    answers = broker_pull()
    out["v1_broker_pull"] = best_us(broker_pull, n, rounds)
    out["v1_sdk_pull"] = best_us(lambda: [[ReceivedMessage.from_wire(m) for m in msgpack.unpackb(
        a, raw=False)["messages"]] for a in answers], n, rounds)
    # the broker's index: the unique key of every record put, then looked up (dedup, query)
    from tidemq_server.broker.store.index import IndexFile, unique_key
    with tempfile.TemporaryDirectory(prefix="tidemq-bench-index-") as scratch:
        files = iter(range(1, 1_000_000))
        keys = [unique_key(m) for m in ids]

        def put() -> IndexFile:
            f = IndexFile(Path(scratch) / f"{next(files):020d}", 2 * n, 2 * n, 1)
            for i, k in enumerate(keys):
                f.put(k, i * 1100, 5)
            return f

        out["index_put"] = best_us(put, n, rounds)
        f = put()
        out["index_lookup"] = best_us(lambda: [f.lookup(k, 0, 10) for k in keys], n, rounds)
        f.close()

        # a batch's dispatch: its consume-queue units and the index entries of its unique keys
        from tidemq_server.broker.store.dispatcher import Dispatcher
        from tidemq_server.broker.store.index import Index
        placed = []
        for i, b in enumerate(raw):
            filled = bytearray(b)
            v2.fill(filled, 0, len(b) * i, BATCH * i, 5, host)
            placed.append(validate(filled, strict=False))

        def dispatch() -> None:
            where = Path(scratch) / f"d{next(files)}"
            index = Index(where / "index", 2 * n, 2 * n)
            index.open()
            d = Dispatcher(where / "cq", 300_000, index)
            for summary in placed:
                d.dispatch_batch(summary)
            d.write_pending()
            d.close()
            index.close()

        out["dispatch_batch"] = best_us(dispatch, n, rounds)
    body = bodies[0]
    out["crc32_1kib"] = best_us(lambda: [zlib.crc32(body) for _ in range(n)], n, rounds)
    try:  # the same CRC32 from ISA-L (PyPI isal), when installed: a drop-in candidate
        from isal.isal_zlib import crc32 as isal_crc32
    except ImportError:
        return out
    out["isal_crc32_1kib"] = best_us(lambda: [isal_crc32(body) for _ in range(n)], n, rounds)
    return out


def child(pure: bool, batches: int, rounds: int) -> dict[str, Any]:
    """One measuring child: the pure-Python reference (``pure``) or the compiled core."""
    env = dict(os.environ)
    env[PURE_ENV] = "1" if pure else ""
    proc = subprocess.run([sys.executable, "-m", "bench.batch_codec", "--child", str(batches),
                           str(rounds)], cwd=REPO, env=env, capture_output=True, text=True,
                          check=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def keep_best(best: dict[str, Any], new: dict[str, Any]) -> None:
    """Fold ``new`` figures into ``best``, keeping each step's smallest."""
    for key, value in new.items():
        best[key] = min(best[key], value) if isinstance(value, float) and key in best else value


STEPS = [
    ("v2_encode", "v2 producer: BatchBuilder.add + finish (encode, CRC)"),
    ("v2_encode_rich", "v2 producer, with tag, 2 keys, 2 properties"),
    ("v2_validate_strict", "v2 broker: strict validate of a client batch (CRCs, ids, limits)"),
    ("v2_validate_strict_rich", "v2 broker: strict validate, with tag, keys, properties"),
    ("v2_fill", "v2 broker: fill the broker part + head CRC (per batch)"),
    ("v2_validate_stored", "v2 recovery / replica: integrity validate + summary"),
    ("v2_serve", "v2 broker pull: stored-form answer (append_group)"),
    ("v2_decode_lazy", "v2 consumer: decode_stored (CRC, ids, tags, offsets)"),
    ("v2_decode_bodies", "v2 consumer: decode_stored + every body read"),
    ("v1_sdk_send", "today: SDK to_wire + msgpack.packb"),
    ("v1_broker_send", "today: broker unpackb + parse + to_record + pack record"),
    ("v1_broker_pull", "today: broker record.decode + to_wire + packb"),
    ("v1_sdk_pull", "today: SDK unpackb + ReceivedMessage.from_wire"),
    ("index_put", "broker index: put a record's unique key"),
    ("index_lookup", "broker index: look a unique key up (dedup, query)"),
    ("dispatch_batch", "broker dispatch: consume-queue units + index entries of a batch"),
    ("crc32_1kib", "zlib.crc32 of 1 KiB (part of every CRC'd step)"),
    ("isal_crc32_1kib", "isal crc32 of 1 KiB (PyPI isal, when installed)"),
]


# the compiled steps, in the order they were compiled (the largest payoff first), and the
# figure of STEPS that measures each
COMPILED_STEPS = [
    ("batch validation + CRC (broker, strict)", "v2_validate_strict"),
    ("batch validation + CRC (broker, strict, rich)", "v2_validate_strict_rich"),
    ("batch validation + CRC (recovery / replica)", "v2_validate_stored"),
    ("SDK batch encoder (BatchBuilder)", "v2_encode"),
    ("SDK batch encoder, rich", "v2_encode_rich"),
    ("stored-form decoder (consumer, lazy)", "v2_decode_lazy"),
    ("stored-form decoder + bodies", "v2_decode_bodies"),
    ("index put (unique key)", "index_put"),
    ("index lookup (unique key)", "index_lookup"),
    ("dispatch of a batch (units + index)", "dispatch_batch"),
]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        print(json.dumps(measure(int(args[1]), int(args[2]))))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.batch_codec", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer batches and rounds")
    ap.add_argument("--json", action="store_true", help="one JSON object as the last line")
    ap.add_argument("--no-compiled", action="store_true",
                    help="the pure-Python reference only")
    opts = ap.parse_args(args)
    batches, rounds, repeats = (8, 3, 2) if opts.quick else (32, 5, 3)
    began = time.perf_counter()
    pure: dict[str, Any] = {}
    compiled: dict[str, Any] = {}
    for i in range(repeats):  # alternated, so both columns see the same load
        err.print(f"measuring, round {i + 1} of {repeats} ...")
        keep_best(pure, child(True, batches, rounds))
        if not opts.no_compiled:
            keep_best(compiled, child(False, batches, rounds))
    why = "--no-compiled" if opts.no_compiled else "Cython"
    if compiled and not compiled.get("compiled"):
        compiled, why = {}, "not built: pip install -e . (Cython, gcc)"
    load = os.getloadavg()[0]
    rows = []
    for key, label in STEPS:
        ours, theirs = pure.get(key), compiled.get(key)
        rows.append(Row(label, ours, "µs/record", None if theirs is None or not ours
                        else ours / theirs, "" if theirs is None else f"compiled {theirs:.3g} µs"))
    print_table(f"record format v2 codec, µs per record ({BATCH}-record batches of {BODY} B)",
                rows, caption=f"value: pure Python (TIDEMQ_PURE_PYTHON=1); ratio: pure / compiled "
                f"({why}); best of {repeats} x {rounds} rounds over {batches * BATCH:,} records, "
                f"the two builds alternating; load average {load:.1f}; "
                f"{time.perf_counter() - began:.0f} s")
    steps = []
    for n, (label, key) in enumerate(COMPILED_STEPS, 1):
        ours, theirs = pure.get(key), compiled.get(key)
        steps.append(Row(f"{n}. {label}", theirs, "µs/record",
                         None if theirs is None or not ours else ours / theirs,
                         "" if ours is None else f"pure {ours:.3g} µs"))
    print_table("compiled record core, step by step (payoff order): µs per record", steps,
                caption="value: compiled; ratio: pure / compiled (the speed-up); same run as "
                "above")
    if opts.json:
        print_json({"bench": "batch_codec", "quick": opts.quick, "records": batches * BATCH,
                    "compiled": bool(compiled), "pure_us_per_record": pure,
                    "compiled_us_per_record": compiled or None, "compiled_with": why,
                    "loadavg": load})
    return 0


if __name__ == "__main__":
    sys.exit(main())
