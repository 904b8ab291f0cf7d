"""The producer's own CPU per message, without a broker: the SDK's send paths in isolation.

Run ``python -m bench.sdk_send [--quick] [--json] [--gc-freeze] [--app-heap N] [--profile FILE]``.

Why: bench.produce_consume measures the client next to a broker on the same two cores, so its
client figure moves with the broker's load and the machine's. Here the ``Producer`` talks to an
in-memory ``MockTransport`` that answers a send the way the broker does (one
``[queue_id, first offset, count]`` per record batch, msgpack) after ``RTT_S`` of simulated
round trip, so only the SDK's work is left to measure: validation, coalescing, record
encoding, futures, results, the event loop's share. The handler's own work (reading batch
heads, encoding the answer) is timed and subtracted.

Rows (1 KiB bodies, the workload of bench.produce_consume; best of ``ROUNDS``):

1. ``send``        64 senders, each awaiting one ``send(body, topic=...)`` at a time
2. ``send x16``    64 senders, each with 16 sends in flight (``asyncio.gather``)
3. ``send_batch``  16 callers, each sending ``send_batch`` of 64 bodies at a time

``--gc-freeze`` calls ``gc.freeze()`` once the producer has started (the guidance in
docs/sdk.md); ``--app-heap N`` keeps N small lists alive first, the long-lived heap of the
application a producer lives in (what the cyclic GC's full collections walk, unless frozen);
each row reports the GC's own time (``gc.callbacks``). ``--profile FILE`` writes a cProfile of
the rounds (pstats format).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench._common import Row, err, loop_name, print_json, print_table, run

TOPIC = "BenchSdk"
QUEUES = 8
BODY_BYTES = 1024
SENDERS = 64
WINDOW = 16
BATCH = 64
BATCH_CALLERS = 16
RTT_S = 0.0005  # simulated round trip of a send request (s)
ROUNDS = 3  # best of: the machine is shared
SIZES = {"quick": 20_000, "full": 100_000}  # messages per row and round


class FakeBroker:
    """Answers the producer's requests in memory; ``busy_s`` is its own CPU (subtracted; CPU,
    not wall time, which on a loaded machine holds other processes' turns)."""

    def __init__(self) -> None:
        self.offsets = [0] * QUEUES
        self.busy_s = 0.0
        self.requests = 0

    async def handle(self, request: Any) -> Any:
        from tidemq._transport import TransportResponse
        from tidemq.protocol import CONTENT_MSGPACK
        from tidemq.protocol.records.v2_read import read_head, split

        t0 = time.process_time()
        if request.method == "GET":  # the route (broker_url: GET /v1/topics/{topic})
            answer = TransportResponse.encoded(200, {"topic": TOPIC, "queues": QUEUES},
                                               content_type=CONTENT_MSGPACK)
            self.busy_s += time.process_time() - t0
            return answer
        placed = []
        for at, _ in split(request.content):
            head = read_head(request.content, at, whole=False)
            placed.append([head.queue_id, self.offsets[head.queue_id], head.count])
            self.offsets[head.queue_id] += head.count
        answer = TransportResponse.encoded(200, {"batches": placed}, content_type=CONTENT_MSGPACK)
        self.requests += 1
        self.busy_s += time.process_time() - t0
        await asyncio.sleep(RTT_S)
        return answer


class GcClock:
    """The cyclic GC's own CPU time, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.spent_s = 0.0
        self.collections = 0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.spent_s += time.process_time() - self._began
            self.collections += 1


GC = GcClock()


async def timed(n: int, broker: FakeBroker, work: Callable[[], Awaitable[None]]
                ) -> dict[str, float]:
    """CPU µs per message of ``work`` (``n`` messages), the fake broker's own time taken out."""
    busy0, req0, gc0, gcs0 = broker.busy_s, broker.requests, GC.collections, GC.spent_s
    cpu0, t0 = time.process_time(), time.perf_counter()
    await work()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    cpu -= broker.busy_s - busy0
    return {"us_per_msg": cpu / n * 1e6, "msgs_per_s": n / wall,
            "msgs_per_request": n / max(1, broker.requests - req0),
            "gc_collections": GC.collections - gc0,
            "gc_us_per_msg": (GC.spent_s - gcs0) / n * 1e6}


async def measure(n: int, freeze: bool, heap: int, profile: cProfile.Profile | None,
                  only: str | None = None) -> dict[str, Any]:
    from tidemq import Producer
    from tidemq._transport import MockTransport

    app = [[i] for i in range(heap)]  # the application's long-lived objects (lists: tracked)
    gc.callbacks.append(GC)

    broker = FakeBroker()
    bodies = [bytes([65 + i]) * BODY_BYTES for i in range(7)]
    pick = itertools.cycle(bodies)
    async with Producer(broker_url="http://fake:1", transport=MockTransport(broker.handle)) \
            as producer:
        await producer.send(b"warm-up", topic=TOPIC)
        if freeze:
            gc.freeze()
        send, send_batch = producer.send, producer.send_batch

        async def senders(window: int) -> None:
            per = n // SENDERS // window

            async def one() -> None:
                for _ in range(per):
                    if window == 1:
                        await send(next(pick), topic=TOPIC)
                    else:
                        await asyncio.gather(*(send(next(pick), topic=TOPIC)
                                               for _ in range(window)))
            await asyncio.gather(*(one() for _ in range(SENDERS)))

        async def batches() -> None:
            per = n // BATCH_CALLERS // BATCH

            async def one() -> None:
                for _ in range(per):
                    await send_batch(TOPIC, [next(pick) for _ in range(BATCH)])
            await asyncio.gather(*(one() for _ in range(BATCH_CALLERS)))

        rows: dict[str, list[dict[str, float]]] = {"send": [], "send_x16": [], "send_batch": []}
        for _ in range(ROUNDS):
            for key, work in (("send", lambda: senders(1)), ("send_x16", lambda: senders(WINDOW)),
                              ("send_batch", batches)):
                if only is not None and key != only:
                    continue
                if profile is not None:
                    profile.enable()
                rows[key].append(await timed(n, broker, work))
                if profile is not None:
                    profile.disable()
    if freeze:
        gc.unfreeze()
    gc.callbacks.remove(GC)
    del app
    return {k: min(v, key=lambda r: r["us_per_msg"]) for k, v in rows.items() if v}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sdk_send", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{SIZES['quick']:,} messages a row")
    ap.add_argument("--json", action="store_true", help="one JSON line at the end of stdout")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() once the producer has started")
    ap.add_argument("--app-heap", type=int, default=0, metavar="N",
                    help="keep N long-lived lists alive (an application's heap)")
    ap.add_argument("--profile", metavar="FILE", help="write a cProfile of the rounds here")
    ap.add_argument("--only", choices=("send", "send_x16", "send_batch"),
                    help="run this row alone (profiling)")
    args = ap.parse_args(argv)
    n = SIZES["quick" if args.quick else "full"]
    profile = cProfile.Profile() if args.profile else None
    load0 = _load()
    res = run(measure(n, args.gc_freeze, args.app_heap, profile, args.only))
    if profile is not None:
        profile.dump_stats(args.profile)
        err.print(f"cProfile written to {args.profile}")
    label = {"send": f"{SENDERS} senders x await send",
             "send_x16": f"{SENDERS} senders x {WINDOW} sends in flight",
             "send_batch": f"{BATCH_CALLERS} callers x send_batch of {BATCH}"}
    rows = []
    for key, r in res.items():
        rows.append(Row(f"SDK CPU per message: {label[key]}", r["us_per_msg"], "µs"))
        rows.append(Row(f"  of which the cyclic GC ({r['gc_collections']:.0f} collections)",
                        r["gc_us_per_msg"], "µs"))
        rows.append(Row(f"  messages per request ({key})", r["msgs_per_request"], "msgs"))
    print_table(f"tidemq SDK send path, in memory ({'quick' if args.quick else 'full'})", rows,
                caption=f"{n:,} messages of {BODY_BYTES} B per row, best of {ROUNDS}; simulated "
                        f"round trip {RTT_S * 1e3:g} ms; gc.freeze: {args.gc_freeze}; "
                        f"application heap: {args.app_heap:,} objects; "
                        f"{loop_name()}; load average (1 min) {load0:.1f} before, "
                        f"{_load():.1f} after")
    if args.json:
        print_json({"bench": "sdk_send", "messages": n, "gc_freeze": args.gc_freeze,
                    "app_heap": args.app_heap,
                    **{f"client_us_per_msg_{k}": r["us_per_msg"] for k, r in res.items()},
                    "detail": res, "loadavg": [load0, _load()]})
    return 0


def _load() -> float:
    import os

    return os.getloadavg()[0]


if __name__ == "__main__":
    raise SystemExit(main())
