"""The SDK's HTTP transport side by side: httpx (httpcore pool) against tidemq's own
keep-alive HTTP/1.1 client (``tidemq._wire``), on the SDK's hot calls to a real broker.

Run ``python -m bench.http_client [--quick] [--json]``.

Both go through the same ``HttpClient`` (same headers, msgpack, error handling); only the
transport differs. Calls, each timed for wall clock and for this process's CPU per request:

1. send     ``POST /v1/topics/T/messages``, one 1 KiB message, one call at a time
2. pull     ``GET /v1/topics/T/queues/0/messages`` at the end of the queue (``wait_ms=0``)
3. send x64 64 callers each sending one message at a time (64 requests in flight)

The transports take turns (httpx, ours, httpx, ...; quick: 3 rounds) and the best round of
each counts, so both see the machine in the same state as far as that goes. The broker runs with
``flush=async``; redis-server and a nameserver as in bench/produce_consume.py.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench._common import Row, err, loop_name, print_json, print_table, run
from bench.produce_consume import Tidemq

CONCURRENCY = 64
BODY = b"x" * 1024


def make_client(kind: str) -> Any:
    from tidemq._constants import HTTP_MAX_CONNECTIONS, HTTP_MAX_KEEPALIVE_CONNECTIONS
    from tidemq._http import HttpClient, shared_ssl_context

    if kind == "httpx":  # what the SDK used before: an httpx.AsyncClient with these limits
        return HttpClient(transport=httpx.AsyncHTTPTransport(
            verify=shared_ssl_context(),
            limits=httpx.Limits(max_connections=HTTP_MAX_CONNECTIONS,
                                max_keepalive_connections=HTTP_MAX_KEEPALIVE_CONNECTIONS)))
    return HttpClient()  # the default: tidemq._wire


async def measure(n: int, callers: int, call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    per = n // callers

    async def caller() -> None:
        for _ in range(per):
            await call()

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    done = per * callers
    return {"per_s": done / wall, "cpu_us": cpu / done * 1e6}


async def round_of(kind: str, base: str, topic: str, n: int) -> dict[str, dict[str, float]]:
    from tidemq._http import url

    http = make_client(kind)
    send_url = url(base, "v1", "topics", topic, "messages")
    pull_url = url(base, "v1", "topics", topic, "queues", 0, "messages")
    body = {"messages": [{"body": BODY, "queue_id": 1}]}
    try:
        await http.call("POST", send_url, body=body, binary=True)  # connect first
        end = (await http.call("GET", url(base, "v1", "topics", topic)))["offsets"][0]["max"]
        params = {"offset": end, "max": 32, "wait_ms": 0}
        return {
            "send": await measure(n, 1, lambda: http.call("POST", send_url, body=body,
                                                          binary=True)),
            "pull": await measure(n, 1, lambda: http.call("GET", pull_url, params=params,
                                                          binary=True)),
            "send_x64": await measure(n * 2, CONCURRENCY, lambda: http.call(
                "POST", send_url, body=body, binary=True)),
        }
    finally:
        await http.aclose()


async def run_all(n: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tidemq-http-bench-") as tmp:
        t = Tidemq(Path(tmp))
        await t.start()
        try:
            topic = "BenchHttp"
            await t.create_topic(topic)
            best: dict[str, dict[str, dict[str, float]]] = {"httpx": {}, "wire": {}}
            for r in range(rounds):
                for kind in ("httpx", "wire"):
                    got = await round_of(kind, t.broker_url, topic, n)
                    err.print(f"round {r + 1} {kind}: " + ", ".join(
                        f"{k} {v['per_s']:,.0f}/s {v['cpu_us']:.0f} us" for k, v in got.items()))
                    for k, v in got.items():
                        if k not in best[kind] or v["per_s"] > best[kind][k]["per_s"]:
                            best[kind][k] = v
            return best
        finally:
            await t.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 calls per figure, 3 rounds")
    ap.add_argument("--json", action="store_true", help="print a JSON line at the end")
    args = ap.parse_args(argv)
    n, rounds = (2000, 3) if args.quick else (10_000, 5)
    import os

    load0 = os.getloadavg()[0]
    best = run(run_all(n, rounds))
    rows: list[Row] = []
    labels = {"send": "send, 1 message, 1 call at a time", "pull": "pull at the end (wait 0)",
              "send_x64": f"send, 1 message, {CONCURRENCY} calls in flight"}
    out: dict[str, Any] = {}
    for key, label in labels.items():
        h, w = best["httpx"][key], best["wire"][key]
        rows += [Row(f"httpx: {label}", h["per_s"], "req/s"),
                 Row(f"tidemq wire: {label}", w["per_s"], "req/s", ratio=w["per_s"] / h["per_s"]),
                 Row(f"httpx: {label}, client CPU per request", h["cpu_us"], "us"),
                 Row(f"tidemq wire: {label}, client CPU per request", w["cpu_us"], "us",
                     ratio=w["cpu_us"] / h["cpu_us"])]
        out[f"{key}_req_per_s"] = {"httpx": h["per_s"], "wire": w["per_s"]}
        out[f"{key}_client_cpu_us"] = {"httpx": h["cpu_us"], "wire": w["cpu_us"]}
    caption = (f"{n:,} calls per figure (send x64: {2 * n:,}), best of {rounds} alternating "
               f"rounds; event loop {loop_name()}; 2 CPUs shared with the broker; load average "
               f"(1 min) {load0:.1f} before, {os.getloadavg()[0]:.1f} after")
    print_table("SDK HTTP transport: httpx vs tidemq wire", rows, caption)
    if args.json:
        print_json(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
