"""Reading request bodies (services/common/bodies.py)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request
from tidemq.protocol import ErrorCode, ProtocolError

from tidemq_server.common.bodies import read_raw


def _request(messages: list[dict[str, Any]]) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return Request(scope, receive)


async def test_a_client_gone_mid_body_is_a_client_error_not_a_crash() -> None:
    request = _request([{"type": "http.request", "body": b"abc", "more_body": True},
                        {"type": "http.disconnect"}])
    with pytest.raises(ProtocolError) as caught:
        await read_raw(request, 1024)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "went away after 3 bytes" in str(caught.value)


async def test_a_whole_body_is_read() -> None:
    request = _request([{"type": "http.request", "body": b"ab", "more_body": True},
                        {"type": "http.request", "body": b"cd", "more_body": False}])
    assert await read_raw(request, 1024) == b"abcd"
