"""The broker's client of the scheduler's internal API (cancel, pending timers).

Errors the scheduler answers (``{code, message}``) come back as the same ``ProtocolError``; a
scheduler that cannot be reached is 503 UNAVAILABLE.
"""

from __future__ import annotations

from typing import Any

import httpx
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import TOKEN_HEADER
from tidemq_server.common.tls import client_context


class SchedulerClient:
    def __init__(self, base_url: str, token: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {TOKEN_HEADER: token} if token else {}
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                      timeout=timeout_s, verify=client_context(),
                                      auth=service_auth())

    async def close(self) -> None:
        await self.http.aclose()

    async def cancel(self, message_id: str, hint: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", "/internal/v1/timers/cancel",
                                json={"message_id": message_id, **hint})

    async def scheduled(self, topic: str | None) -> dict[str, Any]:
        params = {"topic": topic} if topic else {}
        return await self._call("GET", "/internal/v1/scheduled", params=params)

    async def histogram(self, by: str) -> dict[str, Any]:
        return await self._call("GET", "/internal/v1/scheduled/histogram", params={"by": by})

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            resp = await self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ProtocolError(ErrorCode.UNAVAILABLE,
                                f"the scheduler at {self.base_url} cannot be reached "
                                f"({type(exc).__name__}); retry later") from exc
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code >= 400:
            code = str(body.get("code", "")) if isinstance(body, dict) else ""
            message = body.get("message") if isinstance(body, dict) else None
            try:
                error = ErrorCode(code)
            except ValueError:  # not one of ours (e.g. a proxy's error page)
                error = ErrorCode.UNAVAILABLE
            raise ProtocolError(error, str(message or f"scheduler answered {resp.status_code}"))
        if not isinstance(body, dict):
            raise ProtocolError(ErrorCode.UNAVAILABLE, "the scheduler answered no JSON object")
        return body
