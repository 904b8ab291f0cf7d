"""Cluster benchmark: one broker group against two, and a broker SIGKILLed mid-run.

Run ``python -m bench.cluster [--quick] [--json]``.

The bench starts real processes on free ports (data in a temp dir): one redis-server
(append-only), two nameservers, and one broker process per group (``broker-a``, ``broker-b``,
``flush=async``), every broker registered with both nameservers and sharing the one Redis.
The client is this one process (the SDK, uvloop when importable).

1. one group    only broker-a runs. A topic with 8 queues; 64 senders x 16 ``send`` in flight
                share N messages of 1 KiB (quick 30k, full 200k); a ``PushConsumer``
                (pull_batch 256, max_concurrency 64) reads them all back.
2. two groups   broker-b is started; a new topic with 8 queues on each group; the same produce
                and consume. Both groups' brokers share this machine's cores with the client
                and Redis, so the ratio shows what a second group buys *here*, not on two hosts.
3. broker loss  on the two groups, a producer sends at a steady R msgs/s (quick 1,000, full
                2,000), each message awaited by its own task, while a push consumer consumes.
                broker-b is SIGKILLed after B s (quick 4, full 10) and started again D s (3, 5)
                later on the same port and data dir. The SDK's retries and group fail-over
                are all the application has; a send that still fails is counted and sent
                again with the same message id.
                Sending goes on until a send is stored on broker-b again (the producer probes
                a failed group when its back-off ends), at least A s (6, 15) after its restart.
                Figures: send errors the application saw (goal 0); recovery: seconds from the
                kill until a 0.5 s bucket's acknowledged sends are back at >= 90% of R, and
                (settled) until the end of the last bucket under that, up to the first send
                stored on broker-b again (the lowest bucket before the kill shows what the
                machine's load alone does); acknowledged messages never consumed once broker-b
                is back (must be 0); messages consumed more than once, and message ids stored
                twice (read back from both groups).

Targets: lost = 0 (hard: the bench fails otherwise), app_errors = 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._cluster import (
    Cluster,
    KillPlan,
    KillRun,
    episode_rates,
    group_name,
    kill_run,
    lowest_rates,
    recovery_s,
    settled_s,
)
from bench._common import Row, err, loop_name, print_json, print_table, run
from bench._peers import BODY_BYTES, Counter, Throughput, make_bodies, run_senders, timed

SENDERS = 64
WINDOW = 16  # sends in flight per sender
PULL_BATCH = 256
CONCURRENCY = 64
NAMESERVERS = 2


@dataclass(frozen=True, slots=True)
class Sizes:
    messages: int
    kill: KillPlan


QUICK = Sizes(30_000, KillPlan(rate=1000.0, before_s=4.0, down_s=3.0, after_s=6.0))
FULL = Sizes(200_000, KillPlan(rate=2000.0, before_s=10.0, down_s=5.0, after_s=15.0))


# --- throughput --------------------------------------------------------------------------------
async def produce(cluster: Cluster, topic: str, n: int, bodies: list[bytes],
                  label: str) -> Throughput:
    from tidemq import Producer

    async with Producer(nameservers=cluster.ns_urls) as producer:
        send = producer.send

        async def send_window(batch: list[bytes]) -> None:
            await asyncio.gather(*(send(b, topic=topic) for b in batch))

        cpu0 = cluster.broker_cpu_s()
        res = await run_senders(n, SENDERS, WINDOW, bodies, send_window, label)
        res.extra["broker_cpu_util"] = (cluster.broker_cpu_s() - cpu0) / res.seconds
    per_group = {name: sum(cluster.queue_ends(name, topic).values()) for name in cluster.brokers}
    if sum(per_group.values()) != n:
        raise RuntimeError(f"{topic}: the groups hold {per_group}, expected {n} in all")
    res.extra["per_group"] = per_group
    return res


async def consume(cluster: Cluster, topic: str, n: int, label: str) -> Throughput:
    from tidemq import PushConsumer

    counter = Counter(n)
    size = 0

    async def handler(message: Any) -> None:
        nonlocal size
        size += len(message.body)
        counter.add()

    consumer = PushConsumer(f"bench-{uuid.uuid4().hex[:6]}", nameservers=cluster.ns_urls,
                            handler=handler, pull_batch=PULL_BATCH,
                            max_concurrency=CONCURRENCY, consume_from="first")
    consumer.subscribe(topic)

    async def work() -> None:
        await consumer.start()
        await counter.done.wait()

    cpu0 = cluster.broker_cpu_s()
    try:
        elapsed, cpu = await timed(label, n, lambda: counter.n, work())
        broker_cpu = cluster.broker_cpu_s() - cpu0
    finally:
        await consumer.close()
    if size != n * BODY_BYTES:
        raise RuntimeError(f"{topic}: consumed {size} bytes, expected {n * BODY_BYTES}")
    return Throughput(counter.n, elapsed, cpu, {"broker_cpu_util": broker_cpu / elapsed})


async def run_all(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    bodies = make_bodies(11)
    n = sizes.messages
    res: dict[str, Any] = {"loadavg": {"before": os.getloadavg()[0]}}
    cluster = Cluster(tmp, NAMESERVERS)
    try:
        await asyncio.to_thread(cluster.start)
        await asyncio.to_thread(cluster.add_broker, group_name(0))
        for groups in (1, 2):
            if groups == 2:
                await asyncio.to_thread(cluster.add_broker, group_name(1))
            topic = f"BenchCluster{groups}g"
            await asyncio.to_thread(cluster.create_topic, topic, list(cluster.brokers))
            what = f"{groups} group{'s' if groups > 1 else ''}"
            res[f"produce_{groups}g"] = (await produce(
                cluster, topic, n, bodies, f"produce, {what}")).as_dict()
            res[f"consume_{groups}g"] = (await consume(
                cluster, topic, n, f"consume, {what}")).as_dict()
        err.print(f"broker loss: {sizes.kill.rate:,.0f} msgs/s, SIGKILL broker-b after "
                  f"{sizes.kill.before_s:.0f} s, down {sizes.kill.down_s:.0f} s")
        kill, facts = await kill_run(cluster, group_name(1), sizes.kill)
        res["kill"] = kill_figures(kill, facts, sizes.kill)
    finally:
        await asyncio.to_thread(cluster.stop)
    res["loadavg"]["after"] = os.getloadavg()[0]
    return res


def kill_figures(kill: KillRun, facts: dict[str, Any], plan: KillPlan) -> dict[str, Any]:
    acked = kill.acked.keys()
    lost = len(acked - kill.consumed.keys())
    send_ms = sorted(s * 1000 for s in kill.send_s)
    before, after = lowest_rates(kill, plan)
    p99 = send_ms[min(len(send_ms) - 1, round(0.99 * (len(send_ms) - 1)))] if send_ms else None
    return {
        "acked": len(acked), "lost": lost, "app_errors": len(kill.errors),
        "app_error_samples": kill.errors[:5],
        "recovery_s": recovery_s(kill, plan), "settled_s": settled_s(kill, plan),
        "episode_rates": episode_rates(kill, plan),
        "lowest_rate_before": before, "lowest_rate_after": after,
        "sent_s": kill.stopped - kill.killed,
        "duplicates": sum(c - 1 for c in kill.consumed.values() if c > 1),
        "restart_s": kill.restarted - kill.killed, "rejoin_s": kill.rejoin_s,
        "send_p50_ms": statistics.median(send_ms) if send_ms else None,
        "send_p99_ms": p99, "send_max_ms": send_ms[-1] if send_ms else None,
        **facts,
    }


# --- output ------------------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def build_rows(res: dict[str, Any], plan: KillPlan) -> list[Row]:
    rows: list[Row] = []
    for phase in ("produce", "consume"):
        one, two = res[f"{phase}_1g"], res[f"{phase}_2g"]
        how = (f"SDK send, {SENDERS} senders x {WINDOW} in flight" if phase == "produce" else
               f"PushConsumer, pull_batch {PULL_BATCH}")
        rows.append(Row(f"{phase}: 1 group ({how})", one["msgs_per_s"], "msgs/s"))
        rows.append(Row(f"{phase}: 2 groups ({how})", two["msgs_per_s"], "msgs/s"))
        rows.append(Row(f"{phase}: 2 groups / 1 group", None, "",
                        ratio(two["msgs_per_s"], one["msgs_per_s"])))
        rows.append(Row(f"  {phase} CPU, 1 group / 2 groups: brokers (sum)",
                        one["broker_cpu_util"] * 100, "% of a core",
                        target=f"2 groups {two['broker_cpu_util']:.0%}"))
        rows.append(Row(f"  {phase} CPU, 1 group / 2 groups: client",
                        one["client_cpu_util"] * 100, "% of a core",
                        target=f"2 groups {two['client_cpu_util']:.0%}"))
    k = res["kill"]
    rows += [
        Row(f"broker loss: acknowledged sends at {plan.rate:,.0f} msgs/s", k["acked"], "msgs"),
        Row("broker loss: send errors seen by the application", k["app_errors"], "errors",
            target="0", met=k["app_errors"] == 0),
        Row("broker loss: acknowledged messages never consumed", k["lost"], "msgs",
            target="0", met=k["lost"] == 0),
        Row("broker loss: seconds from the kill to full send rate (>= 90%)", k["recovery_s"],
            "s"),
        Row("broker loss: seconds from the kill to the last under-rate bucket's end",
            k["settled_s"], "s", target="until rejoined"),
        Row(f"broker loss: lowest ack rate of a {plan.bucket_s} s bucket, from the kill on",
            k["lowest_rate_after"], "msgs/s", ratio(k["lowest_rate_after"], plan.rate)),
        Row(f"broker loss: lowest ack rate of a {plan.bucket_s} s bucket, before the kill",
            k["lowest_rate_before"], "msgs/s", ratio(k["lowest_rate_before"], plan.rate)),
        Row("broker loss: messages consumed more than once (extra copies)", k["duplicates"],
            "msgs"),
        Row("broker loss: message ids stored twice (both groups read back)",
            k["stored_duplicates"], "msgs"),
        Row("broker loss: sends moved to the other group (SDK failovers)", k["sdk_failovers"],
            "msgs"),
        Row("broker loss: send p99 / max (call to ack)", k["send_p99_ms"], "ms",
            target=f"max {k['send_max_ms'] or 0:,.0f} ms"),
        Row("broker loss: kill to broker-b healthy again", k["restart_s"], "s"),
        Row("broker loss: restart to first send stored on broker-b", k["rejoin_s"], "s"),
    ]
    return rows


def caption(res: dict[str, Any], sizes: Sizes, loop: str, total_s: float) -> str:
    load = res["loadavg"]
    k, plan = res["kill"], sizes.kill
    per_group = res["produce_2g"]["per_group"]
    return "\n".join([
        f"{sizes.messages:,} messages of {BODY_BYTES} B per throughput phase; two nameservers, "
        "one redis-server, brokers flush=async; client: one process, event loop "
        f"{loop}; {os.cpu_count()} CPUs shared by every process; total {total_s:.0f} s; "
        f"load average (1 min) {load['before']:.1f} before, {load['after']:.1f} after "
        "(anything else running skews the figures)",
        f"2-group produce split: {', '.join(f'{g} {c:,}' for g, c in per_group.items())}",
        f"broker loss: {plan.rate:,.0f} msgs/s offered for {plan.before_s:.0f} s, broker-b "
        f"SIGKILLed, started again after {plan.down_s:.0f} s (same port and data dir), "
        f"sending on for {plan.after_s:.0f} s or until sends reach it again ({k['sent_s']:.0f} "
        "s after the kill in all); the SDK producer and consumer use their "
        "defaults; a send error the application sees is sent again with the same id; "
        f"stored {k['stored_total']:,} copies of {k['acked']:,} acknowledged messages "
        f"(SDK counted {k['sdk_possible_duplicates']} possible duplicates)",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30k messages, a 13 s broker-loss run")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object with every figure as the last line of stdout")
    ap.add_argument("--messages", type=int, default=None, help="override the message count")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: /tmp)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.messages:
        sizes = Sizes(args.messages, sizes.kill)
    loop = loop_name()
    mode = "quick" if args.quick else "full"
    err.print(f"cluster bench ({mode}), event loop: {loop}")
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-cluster-bench-", dir=args.dir))
    try:
        res = run(run_all(tmp, sizes))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_s = time.perf_counter() - began
    rows = build_rows(res, sizes.kill)
    print_table(f"tidemq cluster bench ({mode})", rows,
                caption=caption(res, sizes, loop, total_s))
    k = res["kill"]
    if args.json:
        p1, p2 = res["produce_1g"]["msgs_per_s"], res["produce_2g"]["msgs_per_s"]
        c1, c2 = res["consume_1g"]["msgs_per_s"], res["consume_2g"]["msgs_per_s"]
        print_json({
            "bench": "cluster", "quick": args.quick, "event_loop": loop,
            "messages": sizes.messages, "body_bytes": BODY_BYTES, "nameservers": NAMESERVERS,
            "produce_1g_msgs": p1, "produce_2g_msgs": p2, "produce_2g_vs_1g": ratio(p2, p1),
            "consume_1g_msgs": c1, "consume_2g_msgs": c2, "consume_2g_vs_1g": ratio(c2, c1),
            "lost": k["lost"], "app_errors": k["app_errors"], "recovery_s": k["recovery_s"],
            "duplicates": k["duplicates"], "stored_duplicates": k["stored_duplicates"],
            "kill_rate_msgs_per_s": sizes.kill.rate, "kill": k,
            "detail": {key: res[key] for key in ("produce_1g", "produce_2g", "consume_1g",
                                                 "consume_2g")},
            "loadavg": res["loadavg"], "total_s": total_s,
        })
    if k["lost"]:
        err.print(f"[red]{k['lost']} acknowledged messages were never consumed[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
