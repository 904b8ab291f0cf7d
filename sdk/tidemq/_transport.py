"""The SDK's I/O seam: what carries one HTTP request, and a test double that carries none.

Every request of every client goes through one ``HttpTransport``: the SDK's own keep-alive
HTTP/1.1 transport (``_wire.WireTransport``, the default) or any object with the same two
methods. (An ``httpx.AsyncBaseTransport`` is accepted too; it is driven through an
``httpx.AsyncClient``.)

``MockTransport`` answers in memory with a function of yours, as ``httpx.MockTransport`` does:
hand it to any client to test code that uses tidemq without a broker::

    def handle(request: TransportRequest) -> TransportResponse:
        if request.url.endswith("/v1/routes/Orders"):
            return TransportResponse.encoded(200, {"topic": "Orders", "queues": [...]})
        ...

    producer = Producer(nameservers="http://ns", transport=MockTransport(handle))

A handler may be a coroutine function. To play a network failure it raises ``WireConnectError``
(nothing was sent), ``WireError`` (sent, the answer lost) or ``WireTimeout`` (``_exceptions``):
the client turns them into ``TransportError`` / ``RequestTimeoutError`` as it does for the real
transport.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidemq.protocol import CONTENT_JSON
from tidemq.protocol.codec import decode_payload, encode_payload, is_batch
from tidemq.protocol.records.v2_read import as_messages

Params = Mapping[str, str | int | float]


@dataclass(slots=True)
class TransportResponse:
    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @classmethod
    def encoded(cls, status: int, payload: Any = None, *, content_type: str = CONTENT_JSON,
                headers: Mapping[str, str] | None = None) -> TransportResponse:
        """An answer carrying ``payload`` encoded as ``content_type`` (an error answer of
        docs/api.md: ``encoded(404, {"code": "TOPIC_NOT_FOUND", "message": "..."})``)."""
        content = encode_payload(payload, content_type) if payload is not None else b""
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        return cls(status, "", {"content-type": content_type, **lowered}, content)


@dataclass(frozen=True, slots=True)
class TransportRequest:
    """One request as a ``MockTransport`` handler sees it."""

    method: str
    url: str  # absolute, without the query (that is ``params``)
    headers: Mapping[str, str]
    content: bytes | None
    params: Params | None = None

    def payload(self) -> Any:
        """The body decoded by its content type (JSON or msgpack; None without a body). A
        producer's send of record batches (``application/x-tidemq-batch``) reads as the
        msgpack send of its messages would: ``{"messages": [...]}``, in record order (one
        batch per queue), the order the per-message ``results`` of an answer follow."""
        if self.content is None:
            return None
        content_type = self.headers.get("content-type")
        if is_batch(content_type):
            return {"messages": [m.to_wire(binary=True) for m in as_messages(self.content)]}
        return decode_payload(self.content, content_type)


class HttpTransport(Protocol):
    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      content: bytes | None, params: Params | None,
                      timeout_s: float) -> TransportResponse:
        """Send one request and read its answer within ``timeout_s``."""
        ...

    async def aclose(self) -> None: ...


Handler = Callable[[TransportRequest], TransportResponse | Awaitable[TransportResponse]]


@dataclass
class MockTransport:
    """An ``HttpTransport`` answering every request with ``handler`` (see the module doc)."""

    handler: Handler
    requests: list[TransportRequest] = field(default_factory=list)  # every request, in order
    closed: bool = False

    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      content: bytes | None, params: Params | None,
                      timeout_s: float) -> TransportResponse:
        seen = TransportRequest(method, url, dict(headers), content,
                                dict(params) if params else None)
        self.requests.append(seen)
        result = self.handler(seen)
        if inspect.isawaitable(result):
            return await result
        return result

    async def aclose(self) -> None:
        self.closed = True
