"""The replica's lean fetch client against a scripted HTTP/1.1 server on loopback: one kept-alive
connection, bodies by length or chunked, ``connection: close``, an idle connection the server
closed, and a primary that never answers."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tidemq_server.broker.replication.fetchclient import LeanClient
from tidemq_server.cli.certs import ensure_dev_pki
from tidemq_server.common.auth.client import SigningAuth
from tidemq_server.common.tls import ServerTls, client_context

#: (request line and headers as received) → the raw answer, or None: close without answering
Script = Callable[[bytes], bytes | None]


@asynccontextmanager
async def server(script: Script, tls: ssl.SSLContext | None = None
                 ) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A loopback server; yields its URL, the requests it got, and its connections count."""
    requests: list[bytes] = []
    connections = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                requests.append(head)
                answer = script(head)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", requests, connections
    finally:
        srv.close()


def ok(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return (f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\ncontent-type: x/y\r\n{head}\r\n"
            ).encode() + body


async def test_requests_share_one_kept_alive_connection_with_headers_and_query() -> None:
    async with server(lambda head: ok(b"hello")) as (url, requests, connections):
        client = LeanClient({"x-tidemq-token": "t0k"}, 2.0, client_context(),
                            SigningAuth("ak", "sk"))
        try:
            for i in range(3):
                got = await client.get(url + "/internal/fetch", params={"from": i, "a": "x/y"},
                                       headers={"accept": "app/one"})
                assert (got.status_code, got.content, got.headers["content-type"]) == \
                    (200, b"hello", "x/y")
        finally:
            await client.aclose()
    assert connections == [1]
    first = requests[0].decode()
    assert first.startswith("GET /internal/fetch?from=0&a=x%2Fy HTTP/1.1\r\n")
    lines = first.lower().split("\r\n")
    assert f"host: {url.removeprefix('http://')}" in lines
    assert "x-tidemq-token: t0k" in lines and "accept: app/one" in lines
    assert any(line.startswith("authorization: ") for line in lines)  # signed (ACL on)


async def test_chunked_and_closing_answers() -> None:
    answers = [b"HTTP/1.1 503 Busy\r\ntransfer-encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\n\r\n",
               ok(b"last", "connection: close"), ok(b"again")]
    async with server(lambda head: answers.pop(0)) as (url, _, connections):
        client = LeanClient({}, 2.0, client_context(), None)
        try:
            got = await client.get(url + "/a")
            assert (got.status_code, got.text) == (503, "abcdefg")
            assert (await client.get(url + "/b")).content == b"last"
            assert (await client.get(url + "/c")).content == b"again"
        finally:
            await client.aclose()
    assert connections == [2]  # the server closed after "last": a new connection for "again"


async def test_a_connection_closed_while_idle_is_reopened_once() -> None:
    served = [0]

    def once_per_connection(head: bytes) -> bytes | None:
        served[0] += 1
        return ok(b"x") if served[0] % 2 else None  # every second request: closed unanswered

    async with server(once_per_connection) as (url, _, connections):
        client = LeanClient({}, 2.0, client_context(), None)
        try:
            for _ in range(2):
                assert (await client.get(url + "/f")).content == b"x"
        finally:
            await client.aclose()
    assert connections == [2] and served == [3]


async def test_a_silent_primary_times_out_and_the_connection_is_dropped() -> None:
    async with server(lambda head: b"") as (url, _, connections):
        client = LeanClient({}, 0.2, client_context(), None)
        try:
            with pytest.raises(TimeoutError):
                await client.get(url + "/f")
            with pytest.raises(TimeoutError):
                await client.get(url + "/f")
        finally:
            await client.aclose()
    assert connections == [2]  # the timed-out connection was not used again


async def test_tls_with_the_ca_verified_and_refused_without_it(tmp_path: Path) -> None:
    pki = ensure_dev_pki(tmp_path / "pki")
    serving = ServerTls.load(pki.cert, pki.key).server_context()
    async with server(lambda head: ok(b"secret"), serving) as (url, _, connections):
        trusting = LeanClient({}, 2.0, ssl.create_default_context(cafile=str(pki.ca)), None)
        try:
            for _ in range(2):
                assert (await trusting.get(url + "/f")).content == b"secret"
        finally:
            await trusting.aclose()
        stranger = LeanClient({}, 2.0, ssl.create_default_context(), None)
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                await stranger.get(url + "/f")
        finally:
            await stranger.aclose()
    assert connections == [1]  # both requests on one TLS connection; the refused handshake
    # never reached the server's handler
