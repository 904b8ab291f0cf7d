"""What each page shows, gathered from the cluster's APIs: plain async functions returning
dicts for the templates. A failing call is kept as an error string in the result, so a page
shows what it could fetch and says what it could not."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from tidemq_server.console.charts import line_chart, sparkline, timer_bars
from tidemq_server.console.client import ApiError, ConsoleClient, LiveBroker, segment
from tidemq_server.console.deadletters import tail
from tidemq_server.console.sampler import Sampler

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHART_BARS = 40  # queues in a group's lag chart at most (those with the most lag)
LOOKUPS = 8  # trace lookups in flight at once (discarded halves)
RESET_TARGETS = ("latest", "time")  # where the reset form can move a group's offsets


def now_ms() -> int:
    return int(time.time() * 1000)


def body_views(m: dict[str, Any]) -> dict[str, str]:
    """The body as text, pretty JSON ("" when it is not JSON) and hex."""
    raw = m.get("body") or ""
    data = base64.b64decode(raw) if m.get("body_encoding") == "base64" else str(raw).encode()
    text = data.decode("utf-8", errors="replace")
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = ""
    return {"text": text, "json": pretty, "hex": data.hex(" ")}


async def cluster_view(c: ConsoleClient, checkers: list[str], schedulers: list[str],
                       sampler: Sampler) -> dict[str, Any]:
    ns_url, answer = await c.cluster()
    brokers = (await c.brokers(primaries_only=False))
    nameservers = list(dict.fromkeys([*c.nameservers, *answer.get("nameservers", [])]))
    checks = await asyncio.gather(*(c.health(u) for u in
                                    [b.address for b in brokers] + nameservers
                                    + checkers + schedulers))
    health = dict(zip([b.address for b in brokers] + nameservers + checkers + schedulers,
                      checks, strict=True))
    groups: dict[str, list[LiveBroker]] = {}
    for b in brokers:
        groups.setdefault(b.name, []).append(b)
    return {"asked": ns_url, "groups": groups, "health": health, "nameservers": nameservers,
            "checkers": checkers, "schedulers": schedulers, "now_ms": now_ms(),
            "rates": {b.address: sampler.rates(b.address) for b in brokers},
            "sampler": sampler}


async def topics_view(c: ConsoleClient, topic: str, sampler: Sampler) -> dict[str, Any]:
    brokers = await c.brokers()
    rows: dict[str, dict[str, Any]] = {}
    measured = False
    for b in brokers:
        r = sampler.rates(b.address)
        by_topic = r.by_topic if r is not None and r.send is not None else {}
        measured |= bool(r is not None and r.send is not None)
        for name, info in b.topics.items():
            row = rows.setdefault(name, {"name": name, "groups": [], "send": 0.0,
                                         "receive": 0.0})
            row["groups"].append(
                {"broker": b.name, "queues": info.get("queues"), "perm": info.get("perm")})
            send, receive = by_topic.get(name, (0.0, 0.0))
            row["send"] += send
            row["receive"] += receive
    detail: list[dict[str, Any]] = []
    if topic:
        for b in brokers:
            try:
                info = await c.call("GET", f"{b.address}/v1/topics/{segment(topic)}")
                detail.append({"broker": b.name, "offsets": info.get("offsets", [])})
            except ApiError as exc:
                if exc.code != "TOPIC_NOT_FOUND":
                    detail.append({"broker": b.name, "error": str(exc), "offsets": []})
    return {"topics": sorted(rows.values(), key=lambda r: r["name"]), "topic": topic,
            "detail": detail, "brokers": [b.name for b in brokers], "measured": measured,
            "sampler": sampler}


async def create_topic(c: ConsoleClient, broker: str, topic: str, queues: int) -> str:
    for b in await c.brokers():
        if b.name == broker:
            await c.call("PUT", f"{b.address}/v1/topics/{segment(topic)}",
                         json={"queues": queues})
            return f"topic {topic} created on {broker} with {queues} queues"
    raise ApiError("BROKER_NOT_FOUND", f"no live broker group {broker!r}")


async def groups_view(c: ConsoleClient, group: str, sampler: Sampler) -> dict[str, Any]:
    brokers = await c.brokers()
    groups: dict[str, dict[str, Any]] = {}
    for b in brokers:
        answer = await c.call("GET", f"{b.address}/v1/groups")
        for g in answer.get("groups", []):
            row = groups.setdefault(g["group"], {**g, "brokers": []})
            row["brokers"].append(b.name)
    offsets: list[dict[str, Any]] = []
    if group:
        for b in brokers:
            answer = await c.call("GET", f"{b.address}/v1/groups/{segment(group)}/offsets")
            offsets += [{**o, "broker": b.name} for o in answer.get("offsets", [])]
    peak = max([int(o.get("lag", 0)) for o in offsets] or [0])
    # the chart shows the queues with the most lag (a bar per queue of a group on 1,000 topics
    # made a 56,000 px wide chart, most of the page's bytes and of its render time)
    chart = (offsets if len(offsets) <= CHART_BARS else
             sorted(offsets, key=lambda o: -int(o.get("lag", 0)))[:CHART_BARS])
    for row in groups.values():
        history = sampler.history(row["group"])
        row["lag_now"] = history[-1][1] if history else None
        row["spark"] = sparkline(history)
    return {"groups": sorted(groups.values(), key=lambda g: g["group"]), "group": group,
            "offsets": offsets, "chart": chart, "peak": peak, "sampler": sampler,
            "history": line_chart(sampler.history(group)) if group else None,
            "total_lag": sum(int(o.get("lag", 0)) for o in offsets)}


async def reset_plan(c: ConsoleClient, group: str, topic: str, to: str, at_ms: int | None
                     ) -> list[dict[str, Any]]:
    """The offsets a reset of ``group`` on ``topic`` would commit, per broker: to the latest
    offset, or to the first message stored at or after ``at_ms``. BAD_REQUEST for any other
    ``to``, or ``to="time"`` without a time: never a plan at the latest offsets instead."""
    if to not in RESET_TARGETS:
        raise ApiError("BAD_REQUEST", f"to: must be {' or '.join(map(repr, RESET_TARGETS))}, "
                       f"got {to!r}")
    if to == "time" and at_ms is None:
        raise ApiError("BAD_REQUEST", "at: give the time to reset to (a reset 'to time' needs "
                       "one)")
    plan: list[dict[str, Any]] = []
    for b in await c.brokers():
        params = {"at_ms": at_ms} if to == "time" else None
        try:
            info = await c.call("GET", f"{b.address}/v1/topics/{segment(topic)}", params=params)
        except ApiError as exc:
            if exc.code == "TOPIC_NOT_FOUND":
                continue
            raise
        for q in info.get("offsets", []):
            offset = q["max"] if to == "latest" else q.get("at", q["max"])
            plan.append({"broker": b.name, "address": b.address, "topic": topic,
                         "queue_id": q["queue_id"], "offset": offset})
    if not plan:
        raise ApiError("TOPIC_NOT_FOUND", f"no live broker serves topic {topic!r}")
    return plan


async def reset_offsets(c: ConsoleClient, group: str, plan: list[dict[str, Any]]) -> str:
    by_address: dict[str, list[dict[str, Any]]] = {}
    for p in plan:
        by_address.setdefault(p["address"], []).append(
            {"topic": p["topic"], "queue_id": p["queue_id"], "offset": p["offset"]})
    for address, offsets in by_address.items():
        await c.call("PUT", f"{address}/v1/groups/{segment(group)}/offsets",
                     json={"offsets": offsets})
    return f"offsets of {group} reset on {len(plan)} queue(s)"


async def find_message(c: ConsoleClient, message_id: str) -> tuple[LiveBroker, dict[str, Any]]:
    """The message with its state, from the first broker that has it."""
    for b in await c.brokers():
        try:
            return b, await c.call("GET", f"{b.address}/v1/messages/{segment(message_id)}")
        except ApiError as exc:
            if exc.code != "MESSAGE_NOT_FOUND":
                raise
    raise ApiError("MESSAGE_NOT_FOUND", f"no broker has a message with id {message_id!r}")


async def search_messages(c: ConsoleClient, topic: str, key: str, begin_ms: int | None,
                          end_ms: int | None, limit: int) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"topic": topic, "max": limit}
    if key:
        params["key"] = key
    if begin_ms is not None:
        params["begin_ms"] = begin_ms
    if end_ms is not None:
        params["end_ms"] = end_ms
    found: list[dict[str, Any]] = []
    for b in await c.brokers():
        if topic in b.topics:
            answer = await c.call("GET", f"{b.address}/v1/messages", params=params)
            found += answer.get("messages", [])
    return found


async def transactions_view(c: ConsoleClient, producer_group: str, limit: int
                            ) -> dict[str, Any]:
    pending: list[dict[str, Any]] = []
    discarded: list[dict[str, Any]] = []
    errors: list[str] = []
    for b in await c.brokers():
        params: dict[str, Any] = {"state": "pending", "max": 1000}
        if producer_group:
            params["producer_group"] = producer_group
        answer = await c.call("GET", f"{b.address}/v1/transactions", params=params)
        pending += [{**t, "broker": b.name} for t in answer.get("transactions", [])]
        try:
            found = await tail(c, b.address, DISCARD_TOPIC, limit)
        except ApiError as exc:
            if exc.code != "TOPIC_NOT_FOUND":
                errors.append(f"{b.name}: {exc}")
            continue
        gate = asyncio.Semaphore(LOOKUPS)
        txs = await asyncio.gather(*(_discarded_tx(c, b, m, gate) for m in found))
        discarded += [{**m, "broker": b.name, "tx": tx} for m, tx in zip(found, txs,
                                                                          strict=True)]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for t in sorted(pending, key=lambda t: t.get("born_timestamp_ms", 0)):
        by_group.setdefault(str(t.get("producer_group")), []).append(t)
    return {"by_group": by_group, "discarded": discarded[::-1], "errors": errors,
            "producer_group": producer_group, "now_ms": now_ms()}


async def _discarded_tx(c: ConsoleClient, b: LiveBroker, m: dict[str, Any],
                        gate: asyncio.Semaphore) -> dict[str, Any]:
    """The transaction of a discarded message (with its resolution), from its trace."""
    async with gate:
        try:
            t = await c.call("GET", f"{b.address}/v1/messages/"
                             f"{segment(str(m.get('message_id')))}/trace")
        except ApiError as exc:
            return {"error": str(exc)}
    tx: dict[str, Any] = t.get("transaction") or {"error": "no transaction found"}
    return tx


async def resolve_discarded(c: ConsoleClient, broker: str, txid: str, action: str) -> str:
    for b in await c.brokers():
        if b.name == broker:
            answer = await c.call("POST", f"{b.address}/v1/transactions/{segment(txid)}/"
                                  "resolve", json={"action": action})
            return (f"transaction {txid} (message {answer.get('message_id')}): "
                    f"{answer.get('resolution')}")
    raise ApiError("BROKER_NOT_FOUND", f"no live broker group {broker!r}")


async def discarded_tx(c: ConsoleClient, broker: str, txid: str) -> dict[str, Any]:
    """One transaction for the resolve confirmation page."""
    for b in await c.brokers():
        if b.name == broker:
            tx: dict[str, Any] = await c.call("GET",
                                              f"{b.address}/v1/transactions/{segment(txid)}")
            return tx
    raise ApiError("BROKER_NOT_FOUND", f"no live broker group {broker!r}")


async def timers_view(c: ConsoleClient) -> dict[str, Any]:
    rows = []
    hists: dict[str, dict[int, int]] = {"hour": {}, "day": {}}
    errors: list[str] = []

    async def ask(address: str, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            return await c.call("GET", f"{address}{path}", params=params)
        except ApiError as exc:
            return exc

    for b in await c.brokers():
        counts, *by = await asyncio.gather(
            ask(b.address, "/v1/scheduled"),
            *(ask(b.address, "/v1/scheduled/histogram", {"by": h}) for h in hists))
        if isinstance(counts, ApiError):
            rows.append({"broker": b.name, "error": str(counts)})
            continue
        rows.append({"broker": b.name, **counts})
        for h, answer in zip(hists, by, strict=True):
            if isinstance(answer, ApiError):
                errors.append(f"{b.name}: histogram by {h}: {answer}")
                continue
            for bucket in answer.get("buckets", []):
                start = int(bucket["start_ms"])
                hists[h][start] = hists[h].get(start, 0) + int(bucket["count"])
    charts = {h: timer_bars([{"start_ms": k, "count": v} for k, v in counts.items()], h)
              for h, counts in hists.items()}
    return {"rows": rows, "charts": charts, "hist_errors": errors,
            "hist_total": sum(hists["day"].values())}


async def cancel_timer(c: ConsoleClient, message_id: str, topic: str = "") -> str:
    """Cancel the delayed message ``message_id`` of ``topic`` (ids are unique per topic only)
    on the broker serving that topic which holds it; without a topic, on the first broker
    that has the id (which refuses an id delayed in several of its topics)."""
    if not topic:
        broker, _ = await find_message(c, message_id)
        answer = await c.call(
            "DELETE", f"{broker.address}/v1/messages/{segment(message_id)}/schedule")
        return f"timer {answer.get('message_id')} {answer.get('state')}"
    for b in await c.brokers():
        if topic not in b.topics:
            continue
        try:
            answer = await c.call(
                "DELETE", f"{b.address}/v1/messages/{segment(message_id)}/schedule",
                params={"topic": topic})
        except ApiError as exc:
            if exc.code != "MESSAGE_NOT_FOUND":
                raise
            continue
        return f"timer {answer.get('message_id')} of {topic} {answer.get('state')}"
    raise ApiError("MESSAGE_NOT_FOUND",
                   f"no broker serving {topic!r} has a delayed message {message_id!r}")
