"""The data source's reads of one topic on the broker: queue ends and bulk body pulls.

Runs inside Spark (the driver's Python source process asks for queue ends, executor Python
workers pull), so it is synchronous (``tidemq_server.common.broker_client.BlockingBrokerClient``:
one keep-alive connection, msgpack so bodies arrive as raw bytes, retries while the broker is
down). Pulls use the broker's bulk internal endpoint (bodies and queue offsets only, token
header), which reads system topics; queue ends come from the public topic description.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from tidemq_server.common.broker_client import MAX_BODIES, BlockingBrokerClient
from tidemq_server.metrics.planning import QueueRange

log = logging.getLogger(__name__)

MAX_PULL = MAX_BODIES  # records per pull (the broker's limit)
ATTEMPTS = 4  # tries of one request while the broker cannot be reached or is busy
RETRY_BASE_S = 0.25  # back-off before the second attempt, doubled each time (s)


@dataclass(frozen=True, slots=True)
class PullResult:
    offsets: list[int]  # queue offset of each body
    bodies: list[bytes]
    next_offset: int
    min_offset: int
    max_offset: int


class TopicReader:
    """Reads ``topic`` on the broker at ``broker_url``; a request is tried ``attempts`` times
    (``ATTEMPTS`` by default) while the broker cannot be reached or is busy."""

    def __init__(self, broker_url: str, token: str, topic: str, timeout_s: float = 10.0, *,
                 attempts: int | None = None) -> None:
        self.topic = topic
        self.address = broker_url.rstrip("/")
        self.client = BlockingBrokerClient(broker_url, token, timeout_s,
                                           user_agent="tidemq-metrics",
                                           attempts=ATTEMPTS if attempts is None else attempts,
                                           retry_base_s=RETRY_BASE_S)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def queue_offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        """``({queue id: min offset}, {queue id: max offset})`` of the topic; both empty while
        the topic does not exist. ``max`` is the offset the next record will get."""
        answer = self.client.describe_topic(self.topic)
        if answer is None:
            return {}, {}
        queues = answer.get("offsets", [])
        return ({int(q["queue_id"]): int(q["min"]) for q in queues},
                {int(q["queue_id"]): int(q["max"]) for q in queues})

    def pull(self, queue_id: int, offset: int, max_count: int = MAX_PULL) -> PullResult:
        """Bodies and queue offsets from ``offset`` (the broker's bulk internal endpoint)."""
        answer = self.client.bodies(self.topic, queue_id, offset, max_count)
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
