"""A small blocking client of the broker for the data source: queue ends and bulk pulls.

Runs inside Spark (the driver's Python source process asks for queue ends, executor Python
workers pull), so it is synchronous, holds one keep-alive connection and asks for msgpack so
record bodies arrive as raw bytes. Pulls use the broker's bulk internal endpoint (bodies and
queue offsets only, token header), which reads system topics; queue ends come from the public
topic description, which may read them too.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import msgpack

from services.common.constants import TOKEN_HEADER
from services.metrics.planning import QueueOffsets, QueueRange

log = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
MAX_PULL = 1024  # records per pull (the broker's limit)
RETRIES = 4  # attempts of one request when the broker cannot be reached or is busy
RETRY_BASE_S = 0.25  # back-off before the second attempt, doubled each time


class BrokerUnavailable(RuntimeError):
    """The broker could not be reached or kept failing: the batch fails, Spark retries it."""


@dataclass(frozen=True, slots=True)
class PullResult:
    offsets: list[int]  # queue offset of each body
    bodies: list[bytes]
    next_offset: int
    min_offset: int
    max_offset: int


class BrokerClient:
    def __init__(self, broker_url: str, token: str, topic: str, timeout_s: float = 10.0) -> None:
        self.broker_url = broker_url.rstrip("/")
        self.token = token
        self.topic = topic
        self.timeout_s = timeout_s
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            headers = {"accept": MSGPACK}
            if self.token:
                headers[TOKEN_HEADER] = self.token
            self._http = httpx.Client(base_url=self.broker_url, headers=headers,
                                      timeout=self.timeout_s)
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
        delay = RETRY_BASE_S
        for attempt in range(1, RETRIES + 1):
            try:
                response = self.http.get(path, params=params)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code != 503:
                    return response
                problem = "503 " + response.text[:200]
            if attempt == RETRIES:
                raise BrokerUnavailable(f"GET {self.broker_url}{path} failed {RETRIES} times; "
                                        f"last: {problem}")
            log.warning("GET %s%s: %s; retrying in %.2fs", self.broker_url, path, problem, delay)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    @staticmethod
    def _decode(response: httpx.Response, what: str) -> Any:
        if response.status_code != 200:
            raise BrokerUnavailable(f"{what}: HTTP {response.status_code} "
                                    f"{response.text[:300]}")
        if "msgpack" in response.headers.get("content-type", ""):
            return msgpack.unpackb(response.content, raw=False)
        return response.json()

    def queue_offsets(self) -> tuple[QueueOffsets, QueueOffsets]:
        """``({queue id: min offset}, {queue id: max offset})`` of the topic; both empty while
        the topic does not exist. ``max`` is the offset the next record will get."""
        response = self._get(f"/v1/topics/{quote(self.topic, safe='')}")
        if response.status_code == 404:
            return {}, {}
        answer = self._decode(response, f"describe topic {self.topic}")
        queues = answer.get("offsets", [])
        return ({int(q["queue_id"]): int(q["min"]) for q in queues},
                {int(q["queue_id"]): int(q["max"]) for q in queues})

    def pull(self, queue_id: int, offset: int, max_count: int = MAX_PULL) -> PullResult:
        """Bodies and queue offsets from ``offset`` (the broker's bulk internal endpoint)."""
        path = f"/internal/v1/topics/{quote(self.topic, safe='')}/queues/{queue_id}/bodies"
        response = self._get(path, {"offset": offset, "max": max(1, min(max_count, MAX_PULL))})
        answer = self._decode(response, f"pull {self.topic}/{queue_id}@{offset}")
        bodies = answer["bodies"]
        if answer.get("body_encoding") == "base64":
            bodies = [base64.b64decode(b) for b in bodies]
        return PullResult(answer["offsets"], bodies, int(answer["next_offset"]),
                          int(answer["min_offset"]), int(answer["max_offset"]))

    def read_range(self, rng: QueueRange, pull_max: int = MAX_PULL,
                   ) -> Iterator[tuple[list[int], list[bytes]]]:
        """Every stored record of ``rng`` as ``(queue offsets, bodies)``, one pair per pull.
        Offsets below the queue's minimum (deleted by retention) are skipped with a warning; a
        range that ends beyond what the broker has (its tail was lost) ends early, also with a
        warning."""
        offset = rng.begin
        while offset < rng.end:
            answer = self.pull(rng.queue_id, offset, min(pull_max, rng.end - offset))
            offsets, bodies = answer.offsets, answer.bodies
            if offsets and not (rng.begin <= offsets[0] and offsets[-1] < rng.end):
                keep = [i for i, o in enumerate(offsets) if rng.begin <= o < rng.end]
                offsets, bodies = [offsets[i] for i in keep], [bodies[i] for i in keep]
            if answer.min_offset > offset:
                log.warning("%s/%d: offsets %d-%d were deleted before they were read",
                            self.topic, rng.queue_id, offset, min(answer.min_offset, rng.end))
            if offsets:
                yield offsets, bodies
            if answer.next_offset <= offset:
                log.warning("%s/%d: the broker has nothing at offset %d (its max is %d); "
                            "range %d-%d ends early", self.topic, rng.queue_id, offset,
                            answer.max_offset, rng.begin, rng.end)
                return
            offset = answer.next_offset
