from __future__ import annotations

from typing import Any

import httpx
import msgpack
import orjson
import pytest
from tidemq import (
    BadRequestError,
    BrokerBusyError,
    InvalidDelayError,
    RetryPolicy,
    TopicNotFoundError,
    TransportError,
    UnavailableError,
)
from tidemq._http import HttpClient, normalize_address, parse_retry_after, url
from tidemq.protocol import ErrorCode


def _client(handler: httpx.MockTransport, **kw: Any) -> tuple[HttpClient, list[float]]:
    client = HttpClient(transport=handler, **kw)
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client._sleep = fake_sleep
    return client, sleeps


def _error(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": message}, headers=headers)


async def test_retries_broker_busy_honouring_retry_after_then_succeeds() -> None:
    answers = [_error(503, "BROKER_BUSY", "queue full", **{"Retry-After": "2"}),
               _error(503, "BROKER_BUSY", "queue full", **{"Retry-After": "1"}),
               httpx.Response(200, json={"ok": True})]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    client, sleeps = _client(httpx.MockTransport(handler))
    assert await client.call("POST", "http://b/v1/x", body={"a": 1}) == {"ok": True}
    assert len(seen) == 3
    assert sleeps[0] >= 2.0 and sleeps[1] >= 1.0
    assert seen[0].content == seen[2].content  # the same request, resent
    await client.aclose()


async def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return _error(503, "UNAVAILABLE", "redis down")

    client, sleeps = _client(httpx.MockTransport(handler), retry=RetryPolicy(max_attempts=3))
    with pytest.raises(UnavailableError) as info:
        await client.call("GET", "http://b/v1/x")
    assert calls == 3 and len(sleeps) == 2
    assert info.value.status == 503
    await client.aclose()


async def test_deadline_bounds_the_retries() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return _error(503, "BROKER_BUSY", "busy", **{"Retry-After": "10"})

    policy = RetryPolicy(max_attempts=100, deadline_s=5.0)
    client, sleeps = _client(httpx.MockTransport(handler), retry=policy)
    with pytest.raises(BrokerBusyError) as info:
        await client.call("GET", "http://b/v1/x")
    assert sleeps == [] and info.value.retry_after == 10.0
    await client.aclose()


async def test_non_retriable_400_raises_the_matching_class_once() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return _error(400, "INVALID_DELAY", "delay_level: must be 1-18, got 99")

    client, _ = _client(httpx.MockTransport(handler))
    with pytest.raises(InvalidDelayError) as info:
        await client.call("POST", "http://b/v1/topics/t/messages", body={}, binary=True)
    exc = info.value
    assert calls == 1
    assert exc.code is ErrorCode.INVALID_DELAY
    assert exc.message == "delay_level: must be 1-18, got 99"
    assert exc.status == 400 and not exc.retriable
    await client.aclose()


async def test_msgpack_error_body_and_framework_errors_are_decoded() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/a":
            return httpx.Response(404, content=msgpack.packb({"code": "TOPIC_NOT_FOUND",
                                                             "message": "no t"}),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(422, json={"detail": [{"loc": ["body", "x"]}]})

    client, _ = _client(httpx.MockTransport(handler))
    with pytest.raises(TopicNotFoundError):
        await client.call("GET", "http://b/a")
    with pytest.raises(BadRequestError) as info:
        await client.call("GET", "http://b/b")
    assert info.value.status == 422 and "loc" in info.value.message
    await client.aclose()


async def test_transport_errors_are_translated_and_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={})

    client, sleeps = _client(httpx.MockTransport(handler))
    assert await client.call("GET", "http://b/x") == {}
    assert calls == 3 and len(sleeps) == 2

    def always(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client2, _ = _client(httpx.MockTransport(always), retry=RetryPolicy(max_attempts=2))
    with pytest.raises(TransportError) as info:
        await client2.call("GET", "http://b/x")
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    await client.aclose()
    await client2.aclose()


async def test_binary_requests_use_msgpack_and_bytes_stay_bytes() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.headers["content-type"] == "application/msgpack":
            body = msgpack.unpackb(request.content)
            return httpx.Response(200, content=msgpack.packb({"echo": body["raw"]}),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(200, json=orjson.loads(request.content))

    client, _ = _client(httpx.MockTransport(handler))
    assert await client.call("POST", "http://b/m", body={"raw": b"\x00\xff"}, binary=True) == {
        "echo": b"\x00\xff"}
    assert seen[0].headers["accept"] == "application/msgpack"
    assert await client.call("POST", "http://b/j", body={"x": 1}) == {"x": 1}
    assert seen[1].headers["content-type"] == "application/json"
    await client.aclose()


def test_url_quotes_system_topic_names_and_addresses_are_normalized() -> None:
    assert url("http://b:1", "v1", "topics", "%RETRY%g", "queues", 3) == \
        "http://b:1/v1/topics/%25RETRY%25g/queues/3"
    assert normalize_address("127.0.0.1:10911/") == "http://127.0.0.1:10911"
    assert normalize_address("https://x") == "https://x"


def test_retry_after_parsing_and_backoff_growth() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("junk") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, jitter=0.0)
    assert [policy.backoff_s(n) for n in (1, 2, 3, 5)] == [0.1, 0.2, 0.4, 1.0]
    assert policy.backoff_s(1, retry_after=3.0) == 3.0
    assert RetryPolicy(max_retry_after_s=2.0, jitter=0.0).backoff_s(1, 60.0) == 2.0
    jittered = RetryPolicy(initial_backoff_s=1.0, jitter=0.5)
    assert all(0.5 <= jittered.backoff_s(1) <= 1.0 for _ in range(50))
