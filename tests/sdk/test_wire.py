"""``tidemq._wire``: the SDK's own keep-alive HTTP/1.1 transport, against small servers on
loopback (plain and TLS with a CA bundle made for the test)."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from tidemq import RequestTimeoutError, TransportError
from tidemq._exceptions import WireConnectError, WireError, WireTimeout
from tidemq._http import HttpClient, RetryPolicy
from tidemq._wire import WireTransport, split_url

from tests.support.wait import hang

Reply = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class Server:
    """Answers each request with ``reply``; counts connections and requests."""

    def __init__(self, reply: Reply, tls: ssl.SSLContext | None = None) -> None:
        self.reply = reply
        self.tls = tls
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        for w in self.writers:
            w.close()
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                if not await self.reply(head + body, reader, writer):
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def answer(body: bytes, *, status: str = "200 OK", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{extra}\r\n").encode() + body


async def echo_ok(request: bytes, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> bool:
    writer.write(answer(b'{"ok": true}'))
    await writer.drain()
    return True


def transport(ctx: ssl.SSLContext | None = None, max_idle: int = 8) -> WireTransport:
    context = ctx or ssl.create_default_context()
    return WireTransport(max_connections=16, max_idle=max_idle, ssl_context=lambda: context)


@pytest.fixture
async def ok_server() -> AsyncIterator[Server]:
    async with Server(echo_ok) as server:
        yield server


async def test_requests_reuse_one_keep_alive_connection(ok_server: Server) -> None:
    wire = transport()
    base = f"http://127.0.0.1:{ok_server.port}"
    for i in range(5):
        r = await wire.request("POST", f"{base}/v1/x", headers={"accept": "application/json"},
                               content=b"abc", params={"i": i, "tags": "a || b"}, timeout_s=5)
        assert (r.status, r.content, r.headers["content-type"]) == (200, b'{"ok": true}',
                                                                   "application/json")
    assert ok_server.connections == 1
    first = ok_server.requests[0]
    assert first.startswith(b"POST /v1/x?i=0&tags=a+%7C%7C+b HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{ok_server.port}".encode() in first
    assert b"content-length: 3\r\n" in first and first.endswith(b"\r\n\r\nabc")
    await wire.aclose()


def test_on_uvloop_too() -> None:
    """The services and benches run uvloop, whose transports are not asyncio's classes."""
    import uvloop

    async def exchange() -> tuple[list[int], int]:
        async with Server(echo_ok) as server:
            wire = transport()
            url = f"http://127.0.0.1:{server.port}/"
            got = await asyncio.gather(*(wire.request("GET", url, headers={}, content=None,
                                                      params=None, timeout_s=5)
                                         for _ in range(3)))
            await wire.aclose()
            return [r.status for r in got], server.connections

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        statuses, connections = runner.run(exchange())
    assert statuses == [200] * 3 and connections >= 1


async def test_concurrent_requests_open_more_connections_and_keep_max_idle(
        ok_server: Server) -> None:
    wire = transport(max_idle=2)
    url = f"http://127.0.0.1:{ok_server.port}/"
    got = await asyncio.gather(*(wire.request("GET", url, headers={}, content=None,
                                              params=None, timeout_s=5) for _ in range(6)))
    assert [r.status for r in got] == [200] * 6
    assert ok_server.connections >= 2
    assert sum(len(q) for q in wire._idle.values()) == 2
    await wire.aclose()


async def test_chunked_and_close_delimited_answers() -> None:
    async def reply(request: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> bool:
        if b"/chunked" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\nx-trailer: 1\r\n\r\n")
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 404 Not Found\r\nconnection: close\r\n\r\nno such thing")
        await writer.drain()
        return False

    async with Server(reply) as server:
        wire = transport()
        base = f"http://127.0.0.1:{server.port}"
        r = await wire.request("GET", f"{base}/chunked", headers={}, content=None, params=None,
                               timeout_s=5)
        assert r.content == b"abcdefg"
        r = await wire.request("GET", f"{base}/gone", headers={}, content=None, params=None,
                               timeout_s=5)
        assert (r.status, r.reason, r.text) == (404, "Not Found", "no such thing")
        r = await wire.request("GET", f"{base}/chunked", headers={}, content=None, params=None,
                               timeout_s=5)
        assert r.content == b"abcdefg"
        assert server.connections == 2  # the close-delimited answer ended its connection
        await wire.aclose()


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
        ok_server: Server) -> None:
    wire = transport()
    url = f"http://127.0.0.1:{ok_server.port}/"
    await wire.request("GET", url, headers={}, content=None, params=None, timeout_s=5)
    for w in ok_server.writers:
        w.close()  # the server's idle timeout
    await asyncio.sleep(0.05)
    r = await wire.request("GET", url, headers={}, content=None, params=None, timeout_s=5)
    assert r.status == 200 and ok_server.connections == 2
    await wire.aclose()


async def test_a_close_racing_the_request_is_retried_once_on_a_new_connection() -> None:
    async def reply(request: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> bool:
        if b"/second" in request and server.connections == 1:
            return False  # the kept connection ends without an answer: the idle-close race
        writer.write(answer(b"{}"))
        await writer.drain()
        return True

    async with Server(reply) as server:
        wire = transport()
        base = f"http://127.0.0.1:{server.port}"
        await wire.request("GET", f"{base}/first", headers={}, content=None, params=None,
                           timeout_s=5)
        r = await wire.request("GET", f"{base}/second", headers={}, content=None, params=None,
                               timeout_s=5)
        assert r.status == 200 and server.connections == 2
        assert [q.split(b" ")[1] for q in server.requests] == [b"/first", b"/second",
                                                                b"/second"]
        await wire.aclose()


async def test_errors_say_whether_the_request_was_sent() -> None:
    wire = transport()
    async with Server(echo_ok) as server:
        port = server.port
    with pytest.raises(WireConnectError) as refused:  # nothing listens any more
        await wire.request("GET", f"http://127.0.0.1:{port}/", headers={}, content=None,
                           params=None, timeout_s=5)
    assert refused.value.sent is False

    async def silent(request: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        await hang()
        return False

    async def hang_up(request: bytes, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await writer.drain()
        return False

    async with Server(silent) as server:
        with pytest.raises(WireTimeout) as late:
            await wire.request("GET", f"http://127.0.0.1:{server.port}/", headers={},
                               content=None, params=None, timeout_s=0.2)
        assert late.value.sent is True
    async with Server(hang_up) as server:
        with pytest.raises(WireError) as cut:
            await wire.request("GET", f"http://127.0.0.1:{server.port}/", headers={},
                               content=None, params=None, timeout_s=5)
        assert cut.value.sent is True
    await wire.aclose()


async def test_http_client_maps_wire_errors_and_decodes_answers(ok_server: Server) -> None:
    http = HttpClient(retry=RetryPolicy(max_attempts=1), headers={"x-extra": "1"})
    got = await http.call("POST", f"http://127.0.0.1:{ok_server.port}/v1/a", body={"b": 1},
                          binary=True)
    assert got == {"ok": True}
    request = ok_server.requests[-1]
    assert b"content-type: application/msgpack\r\n" in request
    assert b"accept: application/msgpack\r\n" in request and b"x-extra: 1\r\n" in request
    await http.aclose()
    with pytest.raises(TransportError) as info:
        await HttpClient(retry=RetryPolicy(max_attempts=1)).call("GET", "http://127.0.0.1:1/x")
    assert info.value.sent is False

    async def silent(request: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        await hang()
        return False

    async with Server(silent) as server:
        slow = HttpClient(retry=RetryPolicy(max_attempts=1), timeout_s=0.2)
        with pytest.raises(RequestTimeoutError) as late:
            await slow.call("GET", f"http://127.0.0.1:{server.port}/x")
        assert late.value.sent is True
        await slow.aclose()


def make_ca(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA bundle) and its key."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


async def test_https_with_a_ca_bundle_and_refused_without(tmp_path: Path) -> None:
    cert, key = make_ca(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with Server(echo_ok, tls=server_ctx) as server:
        url = f"https://127.0.0.1:{server.port}/v1/x"
        trusted = transport(ssl.create_default_context(cafile=str(cert)))
        r = await trusted.request("GET", url, headers={}, content=None, params=None,
                                  timeout_s=5)
        r2 = await trusted.request("GET", url, headers={}, content=None, params=None,
                                   timeout_s=5)
        assert (r.status, r2.status, server.connections) == (200, 200, 1)
        await trusted.aclose()
        untrusted = transport(ssl.create_default_context())  # no CA for this certificate
        with pytest.raises(WireConnectError) as info:
            await untrusted.request("GET", url, headers={}, content=None, params=None,
                                    timeout_s=5)
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
        await untrusted.aclose()


def test_split_url() -> None:
    assert split_url("http://b:10911/v1/t?x=1") == (("http", "b", 10911), "b:10911",
                                                    "/v1/t?x=1")
    assert split_url("https://host") == (("https", "host", 443), "host", "/")
    assert split_url("http://[::1]:80/a") == (("http", "::1", 80), "[::1]:80", "/a")
    with pytest.raises(ValueError):
        split_url("ftp://x/")


async def test_a_kept_connection_closed_by_a_server_that_then_refuses_may_have_been_sent() -> None:
    """A server killed after reading a request closes the kept connection without an answer and
    refuses the next one: the request may have been processed (a send may be stored), so the
    error says sent, never "nothing was sent" (the SDK would store it again elsewhere)."""
    async def die_on_second(request: bytes, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> bool:
        if b"/second" in request:
            await server.__aexit__()  # stop listening, then end this connection unanswered
            return False
        writer.write(answer(b"{}"))
        await writer.drain()
        return True

    server = Server(die_on_second)
    await server.__aenter__()
    wire = transport()
    base = f"http://127.0.0.1:{server.port}"
    await wire.request("GET", f"{base}/first", headers={}, content=None, params=None,
                       timeout_s=5)
    with pytest.raises(WireError) as cut:
        await wire.request("POST", f"{base}/second", headers={}, content=b"x", params=None,
                           timeout_s=5)
    assert not isinstance(cut.value, WireConnectError) and cut.value.sent is True
    await wire.aclose()
