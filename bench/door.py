"""Broker CPU per request, by REST door (issue 33 item 2: the lean door for the hot routes).

Run ``python -m bench.door [--quick] [--json] [--doors protocol,asgi,off]``.

One broker process per door setting (``TIDEMQ_BROKER_LEAN_DOOR``: ``protocol`` serves the hot
routes in the HTTP/1.1 protocol, ``asgi`` in a middleware inside the FastAPI app, ``off`` through
the whole app, as before), all on one redis-server, ``flush=async``. Each round sends, to each
broker in turn, N requests over ``CONNECTIONS`` keep-alive connections (one request in flight
per connection) and reads the broker process's CPU time (user + system, /proc) before and
after: µs of broker CPU per request. Requests, each its own figure:

- ``send``: ``POST /v1/topics/T/messages``, one 100-byte message (JSON);
- ``send_msgpack``: the same in msgpack, as the SDK's per-message sends;
- ``pull``: ``GET /v1/topics/T/queues/0/messages?offset=0&max=1`` (one message answered);
- ``healthz``: ``GET /healthz`` (never lean: the app's own cost, for reference).

The client is a raw asyncio HTTP/1.1 loop (request bytes prebuilt, answers read by
Content-Length) so that this process takes little of the two cores. The figure of a door is the
median over the rounds; ``broker_us_per_request`` is the default door's ``send``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import orjson

from bench._common import Row, err, loop_name, print_json, print_table, run
from bench._peers import Child, free_port, process_cpu_s, python_service, redis_server

DOORS = ("protocol", "asgi", "off")
DEFAULT_DOOR = "protocol"
CONNECTIONS = 8
TARGET_US = 100.0  # issue 33: broker CPU per one-message request
TOPIC = "BenchDoor"
BODY = "x" * 100


def _request(method: str, path: str, body: bytes = b"", content_type: str = "") -> bytes:
    head = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    if body or method == "POST":
        head += [f"content-type: {content_type}", f"content-length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


REQUESTS = {
    "send": _request("POST", f"/v1/topics/{TOPIC}/messages",
                     orjson.dumps({"messages": [{"body": BODY}]}), "application/json"),
    "send_msgpack": _request("POST", f"/v1/topics/{TOPIC}/messages",
                             msgpack.packb({"messages": [{"body": BODY.encode()}]}),
                             "application/msgpack"),
    "pull": _request("GET", f"/v1/topics/{TOPIC}/queues/0/messages?offset=0&max=1"),
    "healthz": _request("GET", "/healthz"),
}


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> None:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head[9:12]
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    if status != b"200":
        raise RuntimeError(f"answer {status.decode()}: {body[:300]!r}")


async def load(port: int, request: bytes, n: int) -> float:
    """Send ``n`` requests over ``CONNECTIONS`` connections; the seconds it took."""
    per = n // CONNECTIONS

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(per):
                await _exchange(reader, writer, request)
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    return time.perf_counter() - began


async def us_per_request(broker: Child, request: bytes, n: int) -> float:
    before = process_cpu_s([broker.pid])
    await load(broker.port, request, n)
    return (process_cpu_s([broker.pid]) - before) / (n // CONNECTIONS * CONNECTIONS) * 1e6


def start_brokers(workdir: Path, redis_port: int, doors: list[str]) -> dict[str, Child]:
    brokers = {}
    for door in doors:
        port = free_port()
        brokers[door] = python_service("broker", port, workdir, {
            "TIDEMQ_BROKER_PORT": str(port),
            "TIDEMQ_BROKER_DATA_DIR": str(workdir / f"broker-{door}"),
            "TIDEMQ_BROKER_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "TIDEMQ_BROKER_CLUSTER": f"bench-door-{door}",
            "TIDEMQ_BROKER_FLUSH": "async",
            "TIDEMQ_BROKER_GRPC_ENABLED": "false",
            "TIDEMQ_BROKER_LOG_LEVEL": "warning",
            "TIDEMQ_BROKER_LEAN_DOOR": door,
        }).start()
    return brokers


async def bench(doors: list[str], n: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    import httpx

    with tempfile.TemporaryDirectory(prefix="bench-door-") as tmp:
        workdir = Path(tmp)
        redis = redis_server(workdir, appendonly=False).start()
        brokers: dict[str, Child] = {}
        try:
            brokers = await asyncio.to_thread(start_brokers, workdir, redis.port, doors)
            async with httpx.AsyncClient(timeout=10) as http:
                for b in brokers.values():
                    url = f"http://127.0.0.1:{b.port}/v1/topics/{TOPIC}"
                    (await http.put(url, json={"queues": 8})).raise_for_status()
            for b in brokers.values():  # warm up (and a message for the pulls)
                for what in REQUESTS:
                    await load(b.port, REQUESTS[what], min(n, 800))
            figures: dict[str, dict[str, list[float]]] = {d: {w: [] for w in REQUESTS}
                                                          for d in doors}
            for r in range(rounds):
                for what, request in REQUESTS.items():
                    for door in doors:  # back to back, same conditions
                        us = await us_per_request(brokers[door], request, n)
                        figures[door][what].append(us)
                err.print(f"round {r + 1}/{rounds}: " + "; ".join(
                    f"{d} send {figures[d]['send'][-1]:.0f} µs" for d in doors))
            return figures
        finally:
            for b in brokers.values():
                b.stop()
            redis.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 requests per figure, 3 rounds")
    ap.add_argument("--json", action="store_true", help="print a JSON line at the end")
    ap.add_argument("--doors", default=",".join(DOORS), help="door settings to compare")
    args = ap.parse_args(argv)
    doors = [d for d in args.doors.split(",") if d]
    n, rounds = (2000, 3) if args.quick else (10_000, 5)
    figures = run(bench(doors, n, rounds))
    medians = {d: {w: statistics.median(v) for w, v in f.items()} for d, f in figures.items()}
    base = medians.get("off")
    rows = []
    for what in REQUESTS:
        for door in doors:
            us = medians[door][what]
            ratio = base[what] / us if base and door != "off" else None
            lean_target = what.startswith("send") and door == DEFAULT_DOOR
            rows.append(Row(f"{what}: door {door}", us, "µs broker CPU/request", ratio,
                            f"≤ {TARGET_US:.0f}" if lean_target else "",
                            us <= TARGET_US if lean_target else None))
    print_table("Broker CPU per request by REST door (median of rounds)", rows,
                f"{n:,} requests per figure over {CONNECTIONS} keep-alive connections, "
                f"{rounds} rounds, doors back to back; ratio: 'off' ÷ this door; "
                f"client loop {loop_name()}")
    if args.json:
        out: dict[str, Any] = {"doors": medians, "rounds": figures, "requests": n,
                               "connections": CONNECTIONS}
        if DEFAULT_DOOR in medians:
            out["broker_us_per_request"] = medians[DEFAULT_DOOR]["send"]
        print_json(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
