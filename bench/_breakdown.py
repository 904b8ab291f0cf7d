"""Where the milliseconds of one message go, producer → broker → push consumer (latency bench).

The SDK clients of the latency phase get a ``TimingTransport``: it asks the broker for its
timing stamps (``X-Tidemq-Timing``, answered on send and pull) and notes, per message id, when
the request left and when the answer came back. Every stamp is CLOCK_MONOTONIC in ns (Python's
``perf_counter_ns`` and ``monotonic_ns`` on Linux), so the client's and the broker's stamps of
one machine line up. One message's timeline, and the segments printed:

    sent      body stamp: ``producer.send`` called
    queue     → its batch's request handed to the HTTP transport   (SDK coalescing)
    http_send → the broker's send route starts                     (client + HTTP + ASGI)
    store     → stored, dispatched and the held pull woken          (group commit, dispatch)
    wake      → the held pull's task resumes                        (broker event loop)
    answer    → the pull's answer is built                          (read + encode)
    pull_ret  → the answer is read by the consumer's HTTP client    (ASGI + HTTP + client)
    handler   → the handler is called                               (SDK dispatch)

A pull that was not held (the message was there when it arrived) has no wake stamp: its
``store`` runs to the send route's end and ``wake`` is 0. Decoding the bodies in the transport
costs the client some CPU: a measured run is a little slower than an unmeasured one would be.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
from tidemq._transport import TransportResponse
from tidemq._wire import WireTransport
from tidemq.protocol.records.stored import decode_stored
from tidemq.protocol.records.v2 import CONTENT_BATCH
from tidemq.protocol.records.v2_read import split, validate

from tidemq_server.common.constants import TIMING_HEADER

SEGMENTS = ("queue", "http_send", "store", "wake", "answer", "pull_ret", "handler")


def _stamps(value: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in (value or "").split(","):
        name, _, num = part.partition("=")
        if num.isdigit():
            out[name] = int(num)
    return out


@dataclass(slots=True)
class Timings:
    """Per message id: the send request's stamps and the pull's."""

    sends: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # left, recv, stored
    pulls: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # woke, answered, back
    handled: dict[str, tuple[int, int]] = field(default_factory=dict)  # sent, handler called


def _sent_ids(content: bytes, content_type: str | None) -> list[str]:
    """The message ids of a send's body: record batches (the SDK's) or msgpack."""
    if content_type == CONTENT_BATCH:
        return [mid for at, size in split(content)
                for mid in validate(content, at, strict=False, end=at + size).message_ids]
    return [m["message_id"] for m in msgpack.unpackb(content, raw=False)["messages"]]


class TimingTransport(WireTransport):
    """The SDK's own transport (``tidemq._wire``), plus the broker's timing stamps of every send
    and pull."""

    def __init__(self, timings: Timings) -> None:
        from tidemq._constants import HTTP_MAX_CONNECTIONS, HTTP_MAX_KEEPALIVE_CONNECTIONS
        from tidemq._http import shared_ssl_context

        super().__init__(max_connections=HTTP_MAX_CONNECTIONS,
                         max_idle=HTTP_MAX_KEEPALIVE_CONNECTIONS, ssl_context=shared_ssl_context)
        self.timings = timings

    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      content: bytes | None, params: Mapping[str, str | int | float] | None,
                      timeout_s: float) -> TransportResponse:
        path = url.split("://", 1)[-1].partition("/")[2]
        is_send = method == "POST" and path.endswith("/messages")
        is_pull = (method == "GET" and "/queues/" in path) or (
            method == "POST" and path == "v1/pull")  # one queue, or many
        if not (is_send or is_pull):
            return await super().request(method, url, headers=headers, content=content,
                                         params=params, timeout_s=timeout_s)
        headers = {**headers, TIMING_HEADER: "1"}
        left = time.perf_counter_ns()
        response = await super().request(method, url, headers=headers, content=content,
                                         params=params, timeout_s=timeout_s)
        back = time.perf_counter_ns()
        stamps = _stamps(response.headers.get(TIMING_HEADER.lower()))
        if response.status == 200 and stamps:
            if is_send:
                for mid in _sent_ids(content or b"", headers.get("content-type")):
                    self.timings.sends[mid] = (left, stamps["recv"], stamps["stored"])
            else:
                answer = msgpack.unpackb(response.content, raw=False)
                pages = answer["queues"] if "queues" in answer else [answer]
                for page in pages:
                    ids = ([m.message_id for m in decode_stored(page["stored"], verify=False)]
                           if page.get("stored") else
                           [m["message_id"] for m in page.get("messages") or ()])
                    for mid in ids:
                        self.timings.pulls[mid] = (stamps["woke"], stamps["answered"], back)
        return response


def segments(t: Timings, keep: int) -> dict[str, list[float]]:
    """Each segment's durations (ms) over the last ``keep`` messages handled (by send time)."""
    out: dict[str, list[float]] = {s: [] for s in (*SEGMENTS, "total")}
    rows = sorted(t.handled.items(), key=lambda kv: kv[1][0])[-keep:] if keep > 0 else []
    for mid, (sent, called) in rows:
        if mid not in t.sends or mid not in t.pulls:
            continue
        left, recv, stored = t.sends[mid]
        woke, answered, back = t.pulls[mid]
        stored_by = min(stored, woke or answered)  # the pull saw it: it was stored by then
        woke = max(woke, stored_by)
        points = (sent, left, recv, stored_by, woke, answered, back, called)
        for name, a, b in zip(SEGMENTS, points, points[1:], strict=False):
            out[name].append((b - a) / 1e6)
        out["total"].append((called - sent) / 1e6)
    return out


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def summary(t: Timings, keep: int) -> dict[str, Any]:
    """``{segment: {p50_ms, p99_ms, mean_ms}}`` plus ``samples``."""
    segs = segments(t, keep)
    out: dict[str, Any] = {"samples": len(segs["total"])}
    for name, values in segs.items():
        out[name] = {"p50_ms": pct(values, 50), "p99_ms": pct(values, 99),
                     "mean_ms": sum(values) / len(values) if values else None}
    return out
