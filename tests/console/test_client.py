"""The console's client reads brokers from the nameservers' cluster view."""

from __future__ import annotations

import httpx

from tidemq_server.console.client import ConsoleClient

NS = "https://nameserver-1:9876"


async def test_brokers_are_reached_at_their_internal_address_when_they_have_one() -> None:
    # compose: clients on the host get the published port, the console the container's name
    cluster = {"brokers": [
        {"broker_name": "broker-a", "address": "https://127.0.0.1:10911",
         "internal_address": "https://broker-a:10911", "role": "primary"},
        {"broker_name": "broker-b", "address": "https://127.0.0.1:11911",
         "internal_address": None, "role": "primary"},
        {"broker_name": "broker-b", "address": "https://127.0.0.1:11912", "broker_id": 1,
         "role": "replica"},
    ], "nameservers": [NS]}

    def answer(request: httpx.Request) -> httpx.Response:
        assert str(request.url) == f"{NS}/v1/cluster"
        return httpx.Response(200, json=cluster)

    client = ConsoleClient([NS], "token", 5.0, transport=httpx.MockTransport(answer))
    try:
        brokers = await client.brokers()
    finally:
        await client.close()
    assert [(b.name, b.address) for b in brokers] == [("broker-a", "https://broker-a:10911"),
                                                      ("broker-b", "https://127.0.0.1:11911")]
