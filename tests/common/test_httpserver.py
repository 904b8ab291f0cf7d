"""The HTTP/1.1 protocol every service runs (tidemq_server.common.httpserver), on a real
nameserver: unparsable requests in the error shape, and an upgrade request uvicorn does not
support (``Upgrade: h2c``, as curl --http2 sends over plain HTTP) served as plain HTTP/1.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.support.procs import ServiceProcess, free_port
from tidemq_server.common.constants import MAX_URL_BYTES

pytestmark = pytest.mark.integration

H2C = (b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\n"
       b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")


def exchange(url: str, request: bytes, *, close: bool = True) -> bytes:
    """Send ``request`` raw; the whole answer (until the server closes, or the first answer's
    end when ``close`` is False and it says its length)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = [line.split(b":")[1] for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]
            if not close and length and len(body) >= int(length[0]):
                break
    return data


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    ns = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port)},
                        tmp_path_factory.mktemp("httpserver-ns")).start()
    yield ns
    ns.stop()


def test_an_h2c_upgrade_request_is_answered_as_http_1_1(nameserver: ServiceProcess) -> None:
    answer = exchange(nameserver.url, H2C + b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
                      close=False)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert httpx.get(nameserver.url + "/healthz").status_code == 200  # the server lives on


def test_unparsable_requests_are_refused_in_the_error_shape(nameserver: ServiceProcess) -> None:
    long_target = b"/healthz?x=" + b"y" * (MAX_URL_BYTES + 1)
    for request, status, code in (
            (b"GET " + long_target + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414, "URI_TOO_LONG"),
            (b"NOT HTTP AT ALL\r\n\r\n", 400, "BAD_REQUEST")):
        answer = exchange(nameserver.url, request)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status), head
        assert b"content-type: application/json" in head.lower()
        assert orjson.loads(body)["code"] == code
