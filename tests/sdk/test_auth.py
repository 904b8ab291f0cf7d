"""The SDK's request signing: what it sends verifies with the services' own check (the same
``tidemq.protocol.signing``), for awkward paths, queries and bodies; no keys, no signature."""

from __future__ import annotations

import httpx
import pytest
from tidemq import ConfigurationError, Credentials
from tidemq._http import HttpClient, url
from tidemq.protocol.signing import (
    body_digest,
    parse_authorization,
    rest_signature,
    string_to_sign,
)

AK, SK = "AK_TEST", "secret-test"


def verify(request: httpx.Request) -> bool:
    """The server's check, on the request as it arrives."""
    ak, signature = parse_authorization(request.headers["authorization"], "TIDEMQ-HMAC-SHA256")
    raw = request.url.raw_path.decode()
    path, _, query = raw.partition("?")
    text = string_to_sign(request.headers["x-tidemq-date"], request.method, path, query,
                          body_digest(request.content))
    return ak == AK and rest_signature(SK, text) == signature


@pytest.mark.parametrize(("method", "segments", "params", "body"), [
    ("GET", ("v1", "topics", "orders", "queues", 0, "messages"),
     {"offset": 0, "max": 32, "tags": "a || b", "group": "%RETRY%g"}, None),
    ("POST", ("v1", "topics", "%DLQ%billing", "messages"), None,
     {"messages": [{"body": "héllo wörld &=?", "keys": ["k 1"]}]}),
    ("PUT", ("v1", "groups", "g|1", "offsets"), None, {"offsets": []}),
    ("DELETE", ("v1", "messages", "id/with slash", "schedule"), None, None),
])
async def test_signed_requests_verify(method: str, segments: tuple[str | int, ...],
                                      params: dict[str, str | int] | None,
                                      body: object) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    client = HttpClient(transport=httpx.MockTransport(handler), credentials=Credentials(AK, SK))
    try:
        await client.call(method, url("http://b:1", *segments), params=params, body=body,
                          binary=method == "POST")
    finally:
        await client.aclose()
    [request] = seen
    assert verify(request)


async def test_environment_keys_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    monkeypatch.delenv("TIDEMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TIDEMQ_SECRET_KEY", raising=False)
    plain = HttpClient(transport=httpx.MockTransport(handler))
    await plain.call("GET", "http://b:1/v1/topics")
    await plain.aclose()
    assert "authorization" not in seen[-1].headers
    monkeypatch.setenv("TIDEMQ_ACCESS_KEY", AK)
    monkeypatch.setenv("TIDEMQ_SECRET_KEY", SK)
    signed = HttpClient(transport=httpx.MockTransport(handler))
    await signed.call("GET", "http://b:1/v1/topics")
    await signed.aclose()
    assert verify(seen[-1])
    assert SK not in repr(Credentials(AK, SK))
    monkeypatch.delenv("TIDEMQ_SECRET_KEY")
    with pytest.raises(ConfigurationError, match="both"):
        HttpClient(transport=httpx.MockTransport(handler))
