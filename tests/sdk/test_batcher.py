"""The coalescer's adaptive linger (one module, with a send function that answers on cue)."""

from __future__ import annotations

import asyncio

from tidemq._batcher import Coalescer
from tidemq._message import SendResult
from tidemq.protocol import OutgoingMessage


class HeldSends:
    """A send function whose requests answer only when released, recording their queue ids."""

    def __init__(self) -> None:
        self.requests: list[list[int | None]] = []
        self.gates: list[asyncio.Event] = []

    async def __call__(self, broker: str, topic: str,
                       messages: list[OutgoingMessage]) -> list[SendResult]:
        self.requests.append([m.queue_id for m in messages])
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return [SendResult(f"id-{i}", topic, m.queue_id or 0, i) for i, m in enumerate(messages)]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_message_waits_only_behind_a_request_that_holds_its_queue() -> None:
    sends = HeldSends()
    coalescer = Coalescer(sends, linger_s=10.0, max_messages=100, max_bytes=1 << 20,
                          max_in_flight=8)

    def submit(queue_id: int) -> asyncio.Future[SendResult]:
        return coalescer.submit("b", "t", OutgoingMessage(b"x", queue_id=queue_id))

    first = submit(0)
    await settle()
    assert sends.requests == [[0]]
    other = submit(1)  # queue 1 has nothing out: it goes at once, not after 10 s
    await settle()
    assert sends.requests == [[0], [1]]
    same_a, same_b = submit(0), submit(0)  # queue 0 has a request out: they gather behind it
    await settle()
    assert sends.requests == [[0], [1]]
    sends.gates[0].set()  # the first answers: what gathered goes, as one request
    await first
    await settle()
    assert sends.requests == [[0], [1], [0, 0]]
    for gate in sends.gates[1:]:
        gate.set()
    await asyncio.gather(other, same_a, same_b)
    assert not coalescer._outstanding  # every queue's count went back to zero
