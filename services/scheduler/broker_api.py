"""The scheduler's client of the broker's internal API (msgpack both ways, token in a header).

``BrokerDown`` is the retriable failure (no connection, timeout, 503): the caller waits and
tries again. Any other error answer is ``BrokerRefused`` — a bug or a misconfiguration,
logged loudly.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgpack

from services.common.constants import TOKEN_HEADER

MSGPACK = "application/msgpack"


class BrokerDown(Exception):
    """The broker cannot take the request now; retry later. ``maybe_done``: the request may
    have taken effect (no answer came back), unlike a 503 answer, which did nothing."""

    def __init__(self, message: str, maybe_done: bool = True) -> None:
        super().__init__(message)
        self.maybe_done = maybe_done


class BrokerRefused(Exception):
    """The broker answered an error other than "busy" or "unavailable"."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


class BrokerApi:
    def __init__(self, base_url: str, token: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"accept": MSGPACK, **({TOKEN_HEADER: token} if token else {})}
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                      timeout=timeout_s,
                                      limits=httpx.Limits(max_connections=32))

    async def close(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, *, body: bytes | None = None,
                    obj: Any = None, params: dict[str, Any] | None = None,
                    timeout_s: float | None = None) -> Any:
        content = body if body is not None else (
            msgpack.packb(obj, use_bin_type=True) if obj is not None else None)
        headers = {"content-type": MSGPACK} if content is not None else None
        try:
            resp = await self.http.request(method, path, content=content, params=params,
                                           headers=headers,
                                           timeout=timeout_s if timeout_s is not None
                                           else httpx.USE_CLIENT_DEFAULT)
        except httpx.HTTPError as exc:
            raise BrokerDown(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        data: Any = {}
        if resp.content and "msgpack" in resp.headers.get("content-type", ""):
            data = msgpack.unpackb(resp.content, raw=False, strict_map_key=False)
        elif resp.content:
            try:
                data = resp.json()
            except ValueError:
                data = {"message": resp.text[:500]}
        if resp.status_code >= 400:
            code = data.get("code", "") if isinstance(data, dict) else ""
            message = data.get("message", "") if isinstance(data, dict) else ""
            if resp.status_code == 503:
                raise BrokerDown(f"{method} {path}: {code}: {message}", maybe_done=False)
            raise BrokerRefused(resp.status_code, code, message)
        return data

    async def info(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/internal/v1/schedule/info")
        return result

    async def intake(self, offset: int, max_count: int, wait_ms: int) -> dict[str, Any]:
        """Timers of the intake topic from ``offset``: ``[offset, due, id, topic, record]``."""
        result: dict[str, Any] = await self._call(
            "GET", "/internal/v1/schedule/intake",
            params={"offset": offset, "max": max_count, "wait_ms": wait_ms},
            timeout_s=wait_ms / 1000 + 30)
        return result

    async def levels_due(self, offsets: dict[int, int], now_ms: int,
                         max_count: int) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", "/internal/v1/schedule/levels/due",
            obj={"offsets": _keys(offsets), "now_ms": now_ms, "max": max_count})
        return result

    async def deliver(self, body: bytes) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", "/internal/v1/schedule/deliver",
                                                  body=body)
        return result

    async def progress(self, owner: str, positions: list[tuple[str, int, int]]) -> int:
        result = await self._call("POST", "/internal/v1/schedule/progress",
                                  obj={"owner": owner, "positions": positions})
        return int(result.get("floor", 0))

    async def pending(self, offsets: dict[int, int], intake_offset: int, topic: str | None,
                      skip: list[tuple[int, int]]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", "/internal/v1/schedule/pending",
            obj={"offsets": _keys(offsets), "intake_offset": intake_offset, "topic": topic,
                 "skip": skip})
        return result


def _keys(offsets: dict[int, int]) -> dict[str, int]:
    """msgpack maps keyed by strings (the broker decodes maps with string keys only)."""
    return {str(k): v for k, v in offsets.items()}


def deliver_body(payloads: list[bytes], strict: list[int]) -> bytes:
    """``{records: [...], strict: [...]}`` in msgpack, splicing the pre-encoded records."""
    n = len(payloads)
    if n < 16:
        head = bytes([0x90 | n])
    elif n < 0x10000:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    return b"".join([b"\x82", msgpack.packb("records"), head, *payloads,
                     msgpack.packb("strict"), msgpack.packb(strict)])
