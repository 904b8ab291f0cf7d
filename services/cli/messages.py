"""Client commands: send, consume (pulling every queue) and query messages on the broker."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tidemq_server.cli.rest import (
    CliError,
    Endpoints,
    answer,
    call,
    console,
    endpoints,
    err_console,
    print_json,
    reports_errors,
    segment,
    unreachable,
)
from tidemq_server.common.tls import client_context

MAX_BATCH = 1024  # messages per request (API limit)
MAX_PULL = 1024  # messages per pull (API limit)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (one document per line).")]


# --- send -------------------------------------------------------------------------------------

def build_message(body: str, tag: str | None = None, keys: list[str] | None = None,
                  properties: dict[str, str] | None = None, queue_id: int | None = None,
                  sharding_key: str | None = None, delay_level: int | None = None,
                  delay_ms: int | None = None, deliver_at_ms: int | None = None
                  ) -> dict[str, Any]:
    """A message in wire form with only the fields that were given."""
    fields: dict[str, Any] = {"tag": tag, "keys": keys or None, "properties": properties or None,
                              "queue_id": queue_id, "sharding_key": sharding_key,
                              "delay_level": delay_level, "delay_ms": delay_ms,
                              "deliver_at_ms": deliver_at_ms}
    return {"body": body, **{k: v for k, v in fields.items() if v is not None}}


def parse_properties(pairs: list[str]) -> dict[str, str]:
    props: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"BAD_REQUEST: property {pair!r} must look like name=value", 2)
        props[name] = value
    return props


@reports_errors
def send(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to send to.")],
    body: Annotated[str, typer.Argument(help="Message body (text); `{i}` becomes the message "
                                             "number when --count > 1.")],
    tag: Annotated[str | None, typer.Option(help="Message tag.")] = None,
    key: Annotated[list[str] | None, typer.Option("--key", "-k", help="A key (repeatable).")
                   ] = None,
    prop: Annotated[list[str] | None, typer.Option("--property", "-p",
                                                   help="name=value (repeatable).")] = None,
    queue: Annotated[int | None, typer.Option(min=0, help="Fixed queue id.")] = None,
    sharding_key: Annotated[str | None, typer.Option(help="Ordered: queue by key hash.")] = None,
    delay_level: Annotated[int | None, typer.Option(min=1, max=18, help="Delay level.")] = None,
    delay_ms: Annotated[int | None, typer.Option(min=0, help="Deliver after this many ms.")
                        ] = None,
    deliver_at_ms: Annotated[int | None, typer.Option(
        min=0, help="Deliver at this time (epoch ms; one in the past delivers at once).")
                             ] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="Send N messages.")] = 1,
    batch: Annotated[int, typer.Option(min=1, max=MAX_BATCH, help="Messages per request.")
                     ] = 64,
    json_out: JsonOption = False,
) -> None:
    """Send one message, or --count N of them in batches with a progress bar."""
    ep = endpoints(ctx)
    props = parse_properties(prop or [])
    delays = [d for d in (delay_level, delay_ms, deliver_at_ms) if d is not None]
    if len(delays) > 1:
        raise CliError("BAD_REQUEST: give at most one of --delay-level, --delay-ms, "
                       "--deliver-at-ms", 2)
    template = build_message(body, tag, key, props, queue, sharding_key, delay_level, delay_ms,
                             deliver_at_ms)
    url = f"{ep.broker}/v1/topics/{segment(topic)}/messages"
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with ep.client() as client, Progress(
        TextColumn("sending to {task.fields[topic]}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
        console=err_console, disable=count == 1 or json_out, transient=False,
    ) as progress:
        task = progress.add_task("send", total=count, topic=topic, rate="")
        for first in range(0, count, batch):
            numbers = range(first, min(count, first + batch))
            messages = [{**template, "body": body.replace("{i}", str(i))} if count > 1
                        else template for i in numbers]
            answer_ = call(client, "POST", url, json={"messages": messages})
            results.extend(answer_.get("results", []))
            rate = len(results) / max(time.perf_counter() - started, 1e-9)
            progress.update(task, advance=len(messages), rate=f"{rate:,.0f} msg/s")
    elapsed = time.perf_counter() - started
    if json_out:
        for result in results:
            print_json(result)
    elif count == 1 and results:
        r = results[0]
        console.print(f"sent [bold]{escape(str(r.get('message_id')))}[/] to {escape(topic)} "
                      + _placement(r))
    else:
        console.print(f"sent {len(results)} message(s) to {escape(topic)} in {elapsed:.2f} s "
                      f"({len(results) / max(elapsed, 1e-9):,.0f} msg/s)")


def _placement(result: dict[str, Any]) -> str:
    """Where a sent message is: its queue and offset, or (delayed) its queue and due time."""
    queue, state = result.get("queue_id"), result.get("state")
    when = _when(result.get("deliver_at_ms")) or "an unknown time"
    if state == "scheduled":
        return f"queue {queue}: scheduled for {when} (no queue offset until it is delivered)"
    if state == "cancelled":
        return f"queue {queue}: cancelled before its delivery at {when}; nothing is scheduled"
    return f"queue {queue} offset {result.get('queue_offset')}"


# --- consume ----------------------------------------------------------------------------------

class Puller:
    """Pulls queues of one topic concurrently until caught up (or forever with ``follow``)."""

    def __init__(self, ep: Endpoints, topic: str, offsets: dict[int, int], *, tags: str,
                 group: str | None, limit: int | None, follow: bool, wait_ms: int,
                 json_out: bool) -> None:
        self.ep, self.topic, self.tags, self.group = ep, topic, tags, group
        self.offsets = dict(offsets)  # queue id → next offset to show
        self.limit, self.follow, self.wait_ms, self.json_out = limit, follow, wait_ms, json_out
        self.shown = 0
        self._enough = asyncio.Event()

    async def run(self) -> None:
        timeout = httpx.Timeout(self.ep.timeout_s + self.wait_ms / 1000)
        async with httpx.AsyncClient(timeout=timeout, verify=client_context(),
                                     auth=self.ep.auth(), headers=self.ep.headers()) as client:
            pullers: set[asyncio.Task[Any]] = {
                asyncio.create_task(self._pull(client, q)) for q in sorted(self.offsets)}
            enough: asyncio.Task[Any] = asyncio.create_task(self._enough.wait())
            try:
                pending: set[asyncio.Task[Any]] = set(pullers)
                while pending and not self._enough.is_set():
                    done, pending = await asyncio.wait(pending | {enough},
                                                       return_when=asyncio.FIRST_COMPLETED)
                    pending.discard(enough)
                    for task in done & pullers:
                        if task.exception() is not None:
                            raise task.exception()  # type: ignore[misc]
            finally:
                for task in (*pullers, enough):
                    task.cancel()
                await asyncio.gather(*pullers, enough, return_exceptions=True)

    async def _pull(self, client: httpx.AsyncClient, queue_id: int) -> None:
        url = f"{self.ep.broker}/v1/topics/{segment(self.topic)}/queues/{queue_id}/messages"
        while not self._enough.is_set():
            params: dict[str, Any] = {"offset": self.offsets[queue_id], "max": 32,
                                      "wait_ms": self.wait_ms if self.follow else 0,
                                      "tags": self.tags}
            if self.group:
                params["group"] = self.group
            try:
                page = answer(await client.get(url, params=params))
            except httpx.HTTPError as exc:
                raise unreachable(url, exc) from exc
            for message in page.get("messages", []):
                if self._enough.is_set():
                    return
                self._show(message)
                self.offsets[queue_id] = int(message.get("queue_offset", -1)) + 1
            self.offsets[queue_id] = max(self.offsets[queue_id], int(page["next_offset"]))
            caught_up = self.offsets[queue_id] >= int(page.get("max_offset", 0))
            if not page.get("messages") and caught_up and not self.follow:
                return

    def _show(self, message: dict[str, Any]) -> None:
        self.shown += 1
        if self.limit is not None and self.shown >= self.limit:
            self._enough.set()
        if self.json_out:
            print_json(message)
            return
        body = str(message.get("body", ""))
        if message.get("body_encoding") == "base64":
            body = f"<base64> {body}"
        head = (f"[{message.get('queue_id')}:{message.get('queue_offset')}] "
                f"{message.get('message_id')}")
        extras = [f"tag={message['tag']}" if message.get("tag") else "",
                  f"keys={','.join(message['keys'])}" if message.get("keys") else ""]
        console.print(" ".join(p for p in (head, *extras) if p), style="cyan", markup=False,
                      highlight=False, end=" ")
        console.print(body, markup=False, highlight=False, soft_wrap=True)


def start_offsets(client: httpx.Client, ep: Endpoints, topic: str, queue: int | None,
                  group: str | None, from_offset: int | None) -> dict[int, int]:
    """Where to start on each queue: --from-offset, else the group's offset, else the minimum."""
    info = call(client, "GET", f"{ep.broker}/v1/topics/{segment(topic)}")
    minimums = {int(o["queue_id"]): int(o.get("min", 0)) for o in info.get("offsets", [])}
    if not minimums:
        minimums = dict.fromkeys(range(int(info.get("queues", 0))), 0)
    if queue is not None:
        if queue not in minimums:
            raise CliError(f"BAD_REQUEST: topic {topic} has queues 0..{len(minimums) - 1}, "
                           f"not {queue}", 2)
        minimums = {queue: minimums[queue]}
    if from_offset is not None:
        return dict.fromkeys(minimums, from_offset)
    if group:
        committed = call(client, "GET", f"{ep.broker}/v1/groups/{segment(group)}/offsets",
                         params={"topic": topic})
        for o in committed.get("offsets", []):
            if o.get("topic", topic) == topic and int(o["queue_id"]) in minimums:
                minimums[int(o["queue_id"])] = int(o["offset"])
    return minimums


@reports_errors
def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    group: Annotated[str | None, typer.Option(help="Start at this group's committed offsets.")
                     ] = None,
    queue: Annotated[int | None, typer.Option(min=0, help="Only this queue.")] = None,
    from_offset: Annotated[int | None, typer.Option(min=0, help="Start every queue here.")
                           ] = None,
    max_messages: Annotated[int | None, typer.Option("--max", min=1, help="Stop after N.")
                            ] = None,
    tags: Annotated[str, typer.Option(help="Tag filter, e.g. 'TagA || TagB'.")] = "*",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new ones.")
                      ] = False,
    wait_ms: Annotated[int, typer.Option(min=0, max=30_000, help="Long-poll time (--follow).")
                       ] = 20_000,
    commit: Annotated[bool, typer.Option(help="Commit the group's offsets afterwards.")
                      ] = False,
    json_out: JsonOption = False,
) -> None:
    """Print a topic's messages by pulling every queue (pulls never commit; see --commit)."""
    ep = endpoints(ctx)
    if commit and not group:
        raise CliError("BAD_REQUEST: --commit needs --group", 2)
    with ep.client() as client:
        offsets = start_offsets(client, ep, topic, queue, group, from_offset)
    puller = Puller(ep, topic, offsets, tags=tags, group=group, limit=max_messages,
                    follow=follow, wait_ms=wait_ms, json_out=json_out)
    try:
        asyncio.run(puller.run())
    except KeyboardInterrupt:
        err_console.print("interrupted")
    if commit and group:
        body = {"offsets": [{"topic": topic, "queue_id": q, "offset": o}
                            for q, o in sorted(puller.offsets.items())]}
        with ep.client() as client:
            call(client, "PUT", f"{ep.broker}/v1/groups/{segment(group)}/offsets", json=body)
    err_console.print(f"{puller.shown} message(s) from {topic}"
                      + (f"; offsets of group {group} committed" if commit else ""))


# --- query ------------------------------------------------------------------------------------

def _when(ms: Any) -> str:
    try:
        return datetime.fromtimestamp(int(ms) / 1000).isoformat(sep=" ", timespec="milliseconds")
    except (TypeError, ValueError, OSError):
        return ""


@reports_errors
def query(
    ctx: typer.Context,
    message_id: Annotated[str | None, typer.Option("--id", help="Message id.")] = None,
    topic: Annotated[str | None, typer.Option(help="Topic (with --key or a time range).")
                     ] = None,
    key: Annotated[str | None, typer.Option(help="Message key.")] = None,
    begin_ms: Annotated[int | None, typer.Option(help="Stored at or after (epoch ms).")] = None,
    end_ms: Annotated[int | None, typer.Option(help="Stored before (epoch ms).")] = None,
    json_out: JsonOption = False,
) -> None:
    """Find messages by id, by topic and key, or by topic and store-time range."""
    ep = endpoints(ctx)
    usage = "use --id ID, or --topic T --key K, or --topic T --begin-ms B --end-ms E"
    with ep.client() as client:
        if message_id and not (topic or key or begin_ms is not None or end_ms is not None):
            found = [call(client, "GET", f"{ep.broker}/v1/messages/{segment(message_id)}")]
        elif topic and key and begin_ms is None and end_ms is None and not message_id:
            found = call(client, "GET", f"{ep.broker}/v1/messages",
                         params={"topic": topic, "key": key}).get("messages", [])
        elif topic and begin_ms is not None and end_ms is not None and not (key or message_id):
            found = call(client, "GET", f"{ep.broker}/v1/messages",
                         params={"topic": topic, "begin_ms": begin_ms, "end_ms": end_ms}
                         ).get("messages", [])
        else:
            raise CliError(f"BAD_REQUEST: {usage}", 2)
    if json_out:
        for message in found:
            print_json(message)
        return
    table = Table("message id", "topic", "queue:offset", "tag", "keys", "stored", "state", "body",
                  title=f"{len(found)} message(s)")
    for m in found:
        body = str(m.get("body", ""))
        offset = m.get("queue_offset")
        state = str(m.get("state", ""))
        if m.get("deliver_at_ms") is not None:  # waiting: no offset yet, a due time instead
            state += f" (due {_when(m['deliver_at_ms'])})"
        table.add_row(str(m.get("message_id")), str(m.get("topic", "")),
                      f"{m.get('queue_id', '')}:{'-' if offset is None else offset}",
                      m.get("tag") or "", ",".join(m.get("keys") or []),
                      _when(m.get("store_timestamp_ms")), state,
                      escape(body[:80] + ("…" if len(body) > 80 else "")))
    console.print(table)
