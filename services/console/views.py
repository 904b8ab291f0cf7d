"""What each page shows, gathered from the cluster's APIs: plain async functions returning
dicts for the templates. A failing call is kept as an error string in the result, so a page
shows what it could fetch and says what it could not."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from tidemq.protocol import dlq_topic

from services.common.dlq import PAGE, Outcome, plan_resend
from services.console.client import ApiError, Broker, ConsoleClient, segment

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHART_BARS = 40  # queues in a group's lag chart at most (those with the most lag)


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


async def cluster_view(c: ConsoleClient, checkers: list[str], schedulers: list[str]
                       ) -> dict[str, Any]:
    ns_url, answer = await c.cluster()
    brokers = (await c.brokers(primaries_only=False))
    nameservers = list(dict.fromkeys([*c.nameservers, *answer.get("nameservers", [])]))
    checks = await asyncio.gather(*(c.health(u) for u in
                                    [b.address for b in brokers] + nameservers
                                    + checkers + schedulers))
    health = dict(zip([b.address for b in brokers] + nameservers + checkers + schedulers,
                      checks, strict=True))
    groups: dict[str, list[Broker]] = {}
    for b in brokers:
        groups.setdefault(b.name, []).append(b)
    return {"asked": ns_url, "groups": groups, "health": health, "nameservers": nameservers,
            "checkers": checkers, "schedulers": schedulers, "now_ms": now_ms()}


async def topics_view(c: ConsoleClient, topic: str) -> dict[str, Any]:
    brokers = await c.brokers()
    rows: dict[str, dict[str, Any]] = {}
    for b in brokers:
        for name, info in b.topics.items():
            rows.setdefault(name, {"name": name, "groups": []})["groups"].append(
                {"broker": b.name, "queues": info.get("queues"), "perm": info.get("perm")})
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
            "detail": detail, "brokers": [b.name for b in brokers]}


async def create_topic(c: ConsoleClient, broker: str, topic: str, queues: int) -> str:
    for b in await c.brokers():
        if b.name == broker:
            await c.call("PUT", f"{b.address}/v1/topics/{segment(topic)}",
                         json={"queues": queues})
            return f"topic {topic} created on {broker} with {queues} queues"
    raise ApiError("BROKER_NOT_FOUND", f"no live broker group {broker!r}")


async def groups_view(c: ConsoleClient, group: str) -> dict[str, Any]:
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
    return {"groups": sorted(groups.values(), key=lambda g: g["group"]), "group": group,
            "offsets": offsets, "chart": chart, "peak": peak,
            "total_lag": sum(int(o.get("lag", 0)) for o in offsets)}


async def reset_plan(c: ConsoleClient, group: str, topic: str, to: str, at_ms: int | None
                     ) -> list[dict[str, Any]]:
    """The offsets a reset of ``group`` on ``topic`` would commit, per broker: to the latest
    offset, or to the first message stored at or after ``at_ms``."""
    plan: list[dict[str, Any]] = []
    for b in await c.brokers():
        params = {"at_ms": at_ms} if to == "time" and at_ms is not None else None
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


async def find_message(c: ConsoleClient, message_id: str) -> tuple[Broker, dict[str, Any]]:
    """The message with its state, from the first broker that has it."""
    for b in await c.brokers():
        try:
            return b, await c.call("GET", f"{b.address}/v1/messages/{segment(message_id)}")
        except ApiError as exc:
            if exc.code != "MESSAGE_NOT_FOUND":
                raise
    raise ApiError("MESSAGE_NOT_FOUND", f"no broker has a message with id {message_id!r}")


def trace(m: dict[str, Any]) -> list[str]:
    """The message's path as far as its copy tells it."""
    steps = [f"stored in {m.get('topic')} queue {m.get('queue_id')} offset "
             f"{m.get('queue_offset')}"]
    state = m.get("state", "")
    if state in ("half", "committed", "rolled_back", "discarded"):
        steps.insert(0, "half message stored (transaction)")
        steps.append({"half": "waiting for commit or rollback (checked back if not ended)",
                      "committed": "committed: consumable",
                      "rolled_back": "rolled back: never delivered",
                      "discarded": "discarded after too many checks"}[state])
    elif state == "scheduled":
        steps.append("delayed: waiting for its time")
    elif state == "cancelled":
        steps.append("delayed, then cancelled before delivery")
    else:
        steps.append("consumable")
    if m.get("reconsume_times"):
        steps.append(f"retried {m['reconsume_times']} time(s)"
                     + (f", from {m['origin_topic']}" if m.get("origin_topic") else ""))
    if str(m.get("topic", "")).startswith("%DLQ%"):
        steps.append(f"in the dead-letter queue {m['topic']}")
    return steps


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


async def tail(c: ConsoleClient, address: str, topic: str, limit: int
               ) -> list[dict[str, Any]]:
    """The last ``limit`` messages of every queue of ``topic`` on one broker (public pull)."""
    info = await c.call("GET", f"{address}/v1/topics/{segment(topic)}")
    out: list[dict[str, Any]] = []
    for q in info.get("offsets", []):
        start = max(int(q["min"]), int(q["max"]) - limit)
        if start >= int(q["max"]):
            continue
        page = await c.call("GET", f"{address}/v1/topics/{segment(topic)}/queues/"
                            f"{q['queue_id']}/messages",
                            params={"offset": start, "max": min(limit, 1024), "wait_ms": 0})
        out += page.get("messages", [])
    return out


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
            discarded += [{**m, "broker": b.name}
                          for m in await tail(c, b.address, DISCARD_TOPIC, limit)]
        except ApiError as exc:
            if exc.code != "TOPIC_NOT_FOUND":
                errors.append(f"{b.name}: {exc}")
    by_group: dict[str, list[dict[str, Any]]] = {}
    for t in sorted(pending, key=lambda t: t.get("born_timestamp_ms", 0)):
        by_group.setdefault(str(t.get("producer_group")), []).append(t)
    return {"by_group": by_group, "discarded": discarded, "errors": errors,
            "producer_group": producer_group, "now_ms": now_ms()}


async def timers_view(c: ConsoleClient) -> list[dict[str, Any]]:
    rows = []
    for b in await c.brokers():
        try:
            rows.append({"broker": b.name,
                         **await c.call("GET", f"{b.address}/v1/scheduled")})
        except ApiError as exc:
            rows.append({"broker": b.name, "error": str(exc)})
    return rows


async def cancel_timer(c: ConsoleClient, message_id: str) -> str:
    broker, _ = await find_message(c, message_id)
    answer = await c.call("DELETE", f"{broker.address}/v1/messages/{segment(message_id)}/schedule")
    return f"timer {answer.get('message_id')} {answer.get('state')}"


async def dlq_view(c: ConsoleClient, group: str, limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in await c.brokers():
        try:
            out += [{**m, "broker": b.name} for m in await tail(c, b.address, dlq_topic(group),
                                                                   limit)]
        except ApiError as exc:
            if exc.code != "TOPIC_NOT_FOUND":
                raise
    return out


async def resend(c: ConsoleClient, group: str, message_id: str) -> list[Outcome]:
    """Resend one DLQ entry (``message_id``) or, when it is "", every entry of the group's
    DLQ, to the original topics; the DLQ copies stay."""
    dlq = dlq_topic(group)
    outcomes: list[Outcome] = []
    for b in await c.brokers():
        try:
            messages = await tail(c, b.address, dlq, PAGE)
        except ApiError as exc:
            if exc.code == "TOPIC_NOT_FOUND":
                continue
            raise
        for m in messages:
            if message_id and m.get("message_id") != message_id:
                continue
            outcome, message = plan_resend(dlq, m)
            if message is not None:
                try:
                    answer = await c.call(
                        "POST", f"{b.address}/v1/topics/{segment(outcome.topic)}/messages",
                        json={"messages": [message]})
                    outcome.result = answer.get("results", [{}])[0]
                except ApiError as exc:
                    outcome.error = str(exc)
            outcomes.append(outcome)
    if message_id and not outcomes:
        raise ApiError("MESSAGE_NOT_FOUND", f"no message {message_id!r} in {dlq}")
    return outcomes
