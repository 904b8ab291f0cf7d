"""``BlockingBrokerClient`` against a real TCP server that misbehaves on purpose: a keep-alive
connection closed by the server is retried quietly, idle connections are not reused past the
client's keep-alive, and real failures are logged once with a count."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import msgpack
import pytest

from tidemq_server.common.broker_client import BlockingBrokerClient, BrokerDown
from tidemq_server.common.constants import HTTP_CLIENT_KEEP_ALIVE_S, HTTP_SERVER_KEEP_ALIVE_S

LOGGER = "tidemq_server.common.broker_client"


class RawServer:
    """HTTP/1.1 on loopback, one thread per connection. ``hang_up_on_second`` closes a
    connection without an answer when a second request arrives on it (what a keep-alive timeout
    that fires as the request arrives looks like); ``status`` is the answer's status."""

    def __init__(self, hang_up_on_second: bool = False) -> None:
        self.hang_up_on_second = hang_up_on_second
        self.status = 200
        self.connections = 0
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        served = 0
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                _, _, buffer = buffer.partition(b"\r\n\r\n")  # GETs carry no body
                self.requests += 1
                if served and self.hang_up_on_second:
                    return
                body = msgpack.packb({"code": "UNAVAILABLE", "message": "busy"}
                                     if self.status == 503 else {"ok": True})
                reason = b"OK" if self.status == 200 else b"Service Unavailable"
                conn.sendall(b"HTTP/1.1 %d %s\r\ncontent-type: application/msgpack\r\n"
                             b"content-length: %d\r\n\r\n%s"
                             % (self.status, reason, len(body), body))
                served += 1

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    raw = RawServer(**getattr(request, "param", {}))
    yield raw
    raw.close()


def test_client_keep_alive_ends_before_the_servers() -> None:
    assert HTTP_CLIENT_KEEP_ALIVE_S < HTTP_SERVER_KEEP_ALIVE_S


@pytest.mark.parametrize("server", [{"hang_up_on_second": True}], indirect=True)
def test_a_connection_the_server_closed_is_retried_quietly(
        server: RawServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    client = BlockingBrokerClient(server.url, "t", 5.0, attempts=1)  # no retries for failures
    try:
        assert client.get("/a") == {"ok": True}
        assert client.get("/b") == {"ok": True}  # sent on the first connection: hung up on
    finally:
        client.close()
    assert server.connections == 2 and server.requests == 3
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.DEBUG]
    assert "closed by the server" in records[0].getMessage()


def test_an_idle_connection_is_not_reused_past_the_clients_keep_alive(
        server: RawServer) -> None:
    client = BlockingBrokerClient(server.url, "t", 5.0)
    try:
        client.get("/a")
        client.get("/b")
        assert server.connections == 1  # reused while fresh
        time.sleep(HTTP_CLIENT_KEEP_ALIVE_S + 0.3)
        client.get("/c")
        assert server.connections == 2  # expired on the client's side first
    finally:
        client.close()


def test_failures_are_logged_once_with_a_count(server: RawServer,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    server.status = 503
    client = BlockingBrokerClient(server.url, "t", 5.0, attempts=3, retry_base_s=0.01)
    try:
        with pytest.raises(BrokerDown, match=r"attempt 3 of 3; 3 failed in a row"):
            client.get("/a")
        with pytest.raises(BrokerDown, match=r"6 failed in a row"):
            client.get("/a")
        server.status = 200
        assert client.get("/a") == {"ok": True}
    finally:
        client.close()
    warnings = [r.getMessage() for r in caplog.records
                if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "retrying" in warnings[0]
    assert "answers again after 6 failed attempts" in warnings[1]
