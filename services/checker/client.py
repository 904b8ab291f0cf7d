"""The checker's view of its broker: the ``/internal/v1/transactions/*`` calls, in msgpack.

Every failure (no answer, an error answer) becomes ``BrokerUnavailable`` with one readable line;
the scan that hit it stops and the next interval starts again from the saved progress.
"""

from __future__ import annotations

from typing import Any

import httpx
from tidemq.protocol import CONTENT_MSGPACK
from tidemq.protocol.codec import decode_payload, encode_payload

from services.common.constants import CHECKER_FLOOR_OWNER, TOKEN_HEADER


class BrokerUnavailable(Exception):
    """The broker did not answer, or answered with an error."""


class BrokerClient:
    def __init__(self, base_url: str, token: str, timeout_s: float,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"accept": CONTENT_MSGPACK, "user-agent": "tidemq-checker"}
        if token:
            headers[TOKEN_HEADER] = token
        self.base_url = base_url
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s,
                                       transport=transport)

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                    body: Any = None) -> Any:
        content = None if body is None else encode_payload(body, CONTENT_MSGPACK)
        headers = {"content-type": CONTENT_MSGPACK} if content is not None else None
        try:
            resp = await self._http.request(method, path, params=params, content=content,
                                            headers=headers)
        except httpx.HTTPError as exc:
            raise BrokerUnavailable(f"{method} {self.base_url}{path}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        try:
            payload = decode_payload(resp.content, resp.headers.get("content-type"))
        except Exception as exc:  # a proxy page, a truncated answer
            raise BrokerUnavailable(f"{method} {path}: undecodable answer "
                                    f"(HTTP {resp.status_code})") from exc
        if resp.status_code >= 400:
            code = payload.get("code") if isinstance(payload, dict) else None
            message = payload.get("message") if isinstance(payload, dict) else resp.text[:200]
            raise BrokerUnavailable(f"{method} {path}: HTTP {resp.status_code} {code}: "
                                    f"{message}")
        return payload

    async def info(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("GET", "/internal/v1/transactions/info")
        return answer

    async def halves(self, offset: int, max_count: int) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(
            "GET", "/internal/v1/transactions/halves", params={"offset": offset,
                                                               "max": max_count})
        return answer

    async def ops(self, offset: int, max_count: int) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(
            "GET", "/internal/v1/transactions/ops", params={"offset": offset, "max": max_count})
        return answer

    async def act(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answer = await self._call("POST", "/internal/v1/transactions/actions",
                                  body={"actions": actions})
        results: list[dict[str, Any]] = answer.get("results", [])
        return results

    async def retention_floor(self, physical_offset: int) -> None:
        await self._call("POST", "/internal/v1/retention-floor",
                         body={"owner": CHECKER_FLOOR_OWNER, "physical_offset": physical_offset})
