"""A message's full trace for the page: stored → (half → checks → committed / rolled back /
discarded, and an operator's resolution) → (delayed until → delivered) → consumed by group G /
retried n times / in the DLQ.

From the broker's ``GET /v1/messages/{id}/trace`` (every copy, the transaction, the delay) and,
for consumption, the committed offsets of every group that has offsets on the message's topic
(``GET /v1/groups``, then ``GET /v1/groups/{g}/offsets?topic=``) against the queue offset of the
copy consumers read.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from tidemq_server.console.client import ApiError, ConsoleClient, LiveBroker, segment

Step = tuple[str, str]  # (kind: a CSS class, text)


def at(ms: Any) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _transaction_steps(t: dict[str, Any], copies: list[dict[str, Any]]) -> list[Step]:
    tx = t["transaction"]
    halves = [c for c in copies if c["kind"] == "half"]
    first = halves[0]["store_timestamp_ms"] if halves else t.get("born_timestamp_ms")
    steps: list[Step] = [("half", f"half message stored {at(first)} (transaction "
                          f"{tx.get('transaction_id')}, producer group "
                          f"{tx.get('producer_group', '?')})")]
    checks = int(tx.get("check_times") or 0)
    if checks:
        last = halves[-1]["store_timestamp_ms"] if halves else None
        steps.append(("check", f"checked back {checks} time(s)"
                      + (f", the last {at(last)}" if last else "")))
    state = tx.get("state")
    when = {c["kind"]: c["store_timestamp_ms"] for c in copies}
    if state == "committed":
        steps.append(("ok", f"committed {at(when.get('committed'))}".rstrip()))
    elif state == "rolled_back":
        steps.append(("bad", "rolled back: never delivered"))
    elif state == "discarded":
        steps.append(("bad", f"discarded {at(when.get('discarded'))} after {checks} check(s): "
                      "kept in TRANS_CHECK_MAX_TIME_TOPIC"))
        resolution = tx.get("resolution")
        if resolution == "committed":
            steps.append(("ok", f"resolved by an operator: committed "
                          f"{at(when.get('committed'))}".rstrip()))
        elif resolution == "dropped":
            steps.append(("bad", "resolved by an operator: dropped, never delivered"))
    elif state == "half":
        steps.append(("wait", "waiting for commit or rollback (checked back while not ended)"))
    return steps


def base_steps(t: dict[str, Any]) -> list[Step]:
    """Everything the broker's trace tells, before consumption."""
    copies = t.get("copies", [])
    steps: list[Step] = []
    if t.get("transaction"):
        steps += _transaction_steps(t, copies)
    delay = t.get("delay")
    if delay:
        steps.append(("wait", f"delayed until {at(delay.get('deliver_at_ms'))}"))
        if delay.get("state") == "delivered":
            steps.append(("ok", f"delivered {at(delay.get('delivered_ms'))}"))
        elif delay.get("state") == "cancelled":
            steps.append(("bad", "cancelled before delivery"))
        else:
            steps.append(("wait", "waiting for its time"))
    c = t.get("consumable")
    if c:
        plain = next((x for x in copies if x["kind"] in ("stored", "committed", "delivered")),
                     None)
        steps.append(("ok", f"stored in {c['topic']} queue {c['queue_id']} offset "
                      f"{c['queue_offset']}" + (f" {at(plain['store_timestamp_ms'])}"
                                                if plain else "")))
    for r in t.get("retries", []):
        steps.append(("bad" if r.get("dead_lettered") else "check",
                      f"group {r['group']} sent it back {r['reconsume_times'] or 0} time(s)"
                      + (f"; in the dead-letter queue %DLQ%{r['group']}"
                         if r.get("dead_lettered") else "")))
    for r in t.get("resent", []):
        steps.append(("ok", f"resent from the DLQ as {r['message_id']} to {r['topic']} queue "
                      f"{r['queue_id']} offset {r['queue_offset']} {at(r['store_timestamp_ms'])}"))
    return steps


async def consumption(c: ConsoleClient, broker: LiveBroker, t: dict[str, Any]) -> list[Step]:
    """Per group with offsets on the message's topic: consumed or not yet."""
    where = t.get("consumable")
    if not where:
        return []
    topic, qid, offset = where["topic"], int(where["queue_id"]), int(where["queue_offset"])
    answer = await c.call("GET", f"{broker.address}/v1/groups")
    groups = [g["group"] for g in answer.get("groups", []) if topic in (g.get("topics") or [])]

    async def one(group: str) -> Step:
        got = await c.call("GET", f"{broker.address}/v1/groups/{segment(group)}/offsets",
                           params={"topic": topic})
        committed = next((int(o["offset"]) for o in got.get("offsets", [])
                          if int(o.get("queue_id", -1)) == qid), None)
        if committed is not None and committed > offset:
            return ("ok", f"consumed by group {group} (committed offset {committed})")
        return ("wait", f"not yet consumed by group {group} (committed offset "
                f"{'none' if committed is None else committed})")

    return list(await asyncio.gather(*(one(g) for g in groups)))


async def full_trace(c: ConsoleClient, broker: LiveBroker, message_id: str) -> dict[str, Any]:
    """``{steps, copies, error}``: the steps, the broker's copies, what could not be read."""
    try:
        t = await c.call("GET", f"{broker.address}/v1/messages/{segment(message_id)}/trace")
    except ApiError as exc:
        return {"steps": [], "copies": [], "error": str(exc)}
    steps = base_steps(t)
    error = ""
    try:
        steps += await consumption(c, broker, t)
    except ApiError as exc:
        error = f"consumer groups: {exc}"
    return {"steps": steps, "copies": t.get("copies", []), "error": error,
            "transaction": t.get("transaction")}
