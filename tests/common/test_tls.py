"""TLS end to end: a nameserver, a broker, a checker, a scheduler and the console, all serving
HTTPS with a development CA's certificate (``tidemq_server.cli.certs``), finding each other through
the nameserver over https://.

Clients that trust the CA (``TIDEMQ_TLS_CA`` / ``use_ca_bundle``) work: the SDK produces and
consumes, the CLI lists the cluster, the checker scans its broker, the console shows the broker.
A plain-HTTP request to a TLS port gets no HTTP answer (the server closes the connection) and
the SDK and CLI say to use https://; a client without the CA refuses the server.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tidemq import (
    Message,
    Producer,
    RetryPolicy,
    SimpleConsumer,
    TransportError,
    use_ca_bundle,
)
from typer.testing import CliRunner

from tests.support.broker import TOKEN, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tidemq_server.cli import app
from tidemq_server.cli.certs import DevPki, ensure_dev_pki

pytestmark = pytest.mark.integration


class TlsCluster:
    def __init__(self, pki: DevPki, procs: dict[str, ServiceProcess]) -> None:
        self.pki = pki
        self.procs = procs
        self.http = httpx.Client(timeout=20.0, verify=ssl.create_default_context(
            cafile=str(pki.ca)))

    def url(self, name: str) -> str:
        return self.procs[name].url


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory,
        redis_server: RedisServer) -> Iterator[TlsCluster]:
    work = tmp_path_factory.mktemp("tls")
    pki = ensure_dev_pki(work / "pki")
    cluster = unique("tls")
    ports = {name: free_port() for name in ("nameserver", "broker", "checker", "scheduler",
                                           "console")}
    ns_url = f"https://127.0.0.1:{ports['nameserver']}"
    common = {"TIDEMQ_TLS_CA": str(pki.ca)}

    def env(prefix: str, name: str, **extra: str) -> dict[str, str]:
        return {**common, **{f"{prefix}{k}": v for k, v in {
            "PORT": str(ports[name]), "CLUSTER": cluster, "TOKEN": TOKEN,
            "TLS_CERT": str(pki.cert), "TLS_KEY": str(pki.key), **extra}.items()}}

    procs: dict[str, ServiceProcess] = {}
    plan = [
        ("nameserver", env("TIDEMQ_NAMESRV_", "nameserver")),
        ("broker", env("TIDEMQ_BROKER_", "broker", BROKER_NAME="broker-a", NAMESERVERS=ns_url,
                       REDIS_URL=redis_server.url, DATA_DIR=str(work / "broker"),
                       SCHEDULER_URL=f"https://127.0.0.1:{ports['scheduler']}",
                       REGISTER_INTERVAL_S="1")),
        ("checker", env("TIDEMQ_CHECKER_", "checker", BROKER_NAME="broker-a",
                        NAMESERVERS=ns_url, REDIS_URL=redis_server.url)),
        ("scheduler", env("TIDEMQ_SCHEDULER_", "scheduler", BROKER_NAME="broker-a",
                          NAMESERVERS=ns_url, REDIS_URL=redis_server.url,
                          DATA_DIR=str(work / "scheduler"))),
        ("console", env("TIDEMQ_CONSOLE_", "console", NAMESERVERS=ns_url)),
    ]
    tls_cluster: TlsCluster | None = None
    try:
        for name, service_env in plan:
            procs[name] = ServiceProcess(name, ports[name], service_env, work).start()
        tls_cluster = TlsCluster(pki, procs)
        yield tls_cluster
    finally:
        if tls_cluster is not None:
            tls_cluster.http.close()  # its kept-alive connections would hold each stop 5 s
        for proc in reversed(procs.values()):
            proc.stop()


def test_every_service_serves_https(tls: TlsCluster) -> None:
    for name, proc in tls.procs.items():
        assert proc.url.startswith("https://"), name
        for path in ("/healthz", "/metrics"):
            resp = tls.http.get(proc.url + path)
            assert resp.status_code == 200, (name, path, resp.text)
            assert resp.extensions["network_stream"].get_extra_info("ssl_object") is not None


def test_the_nameserver_hands_out_https_addresses(tls: TlsCluster) -> None:
    brokers = tls.http.get(tls.url("nameserver") + "/v1/cluster").json()["brokers"]
    assert [b["address"] for b in brokers] == [tls.url("broker")]
    topic = unique("T")
    assert tls.http.put(f"{tls.url('broker')}/v1/topics/{topic}",
                        json={"queues": 2}).status_code == 200
    # the checker found its broker through the nameserver over https and scans it
    scan = tls.http.post(tls.url("checker") + "/internal/v1/scan",
                         headers={"X-Tidemq-Token": TOKEN})
    assert scan.status_code == 200, scan.text
    page = tls.http.get(tls.url("console") + "/")  # the console asks the nameserver and broker
    assert page.status_code == 200 and "broker-a" in page.text


async def test_sdk_produces_and_consumes_over_tls(tls: TlsCluster) -> None:
    topic = unique("T")
    assert tls.http.put(f"{tls.url('broker')}/v1/topics/{topic}",
                        json={"queues": 2}).status_code == 200
    use_ca_bundle(str(tls.pki.ca))
    try:
        async with Producer(nameservers=[tls.url("nameserver")]) as producer:
            sent = [await producer.send(Message(topic=topic, body=f"secret-{i}".encode()))
                    for i in range(5)]
        async with SimpleConsumer(unique("g"), topic=topic,
                                  nameservers=[tls.url("nameserver")]) as consumer:
            got: list[bytes] = []
            for _ in range(20):
                batch = await consumer.receive(max=16, wait_ms=500)
                got += [m.body for m in batch]
                await consumer.ack(batch)
                if len(got) >= len(sent):
                    break
    finally:
        use_ca_bundle(None)
    assert sorted(got) == sorted(f"secret-{i}".encode() for i in range(5))


def test_plain_http_to_a_tls_port_gets_a_clear_error(tls: TlsCluster) -> None:
    port = tls.procs["broker"].port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert sock.recv(4096) == b""  # no HTTP answer: the handshake failed, closed
    plain = f"http://127.0.0.1:{port}"
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(plain + "/healthz", timeout=5)
    result = CliRunner().invoke(app, ["--broker", plain, "query", "--id", "x"])
    assert result.exit_code == 5  # unavailable
    said = " ".join(result.output.split())  # rich wraps the line
    assert "closed the connection without an answer" in said and "use https://" in said


async def test_plain_http_from_the_sdk_names_tls(tls: TlsCluster) -> None:
    plain = tls.url("broker").replace("https://", "http://")
    producer = Producer(broker_url=plain, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(TransportError, match="use https://"):
        async with producer:
            await producer.send(Message(topic="any", body=b"x"))


def test_a_client_without_the_ca_refuses_the_server(tls: TlsCluster,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(tls.url("nameserver") + "/healthz", timeout=5)  # the default trust store
    monkeypatch.delenv("TIDEMQ_TLS_CA", raising=False)
    use_ca_bundle(None)
    result = CliRunner().invoke(app, ["--nameserver", tls.url("nameserver"), "cluster"])
    assert result.exit_code == 5  # unavailable
    said = " ".join(result.output.split())  # rich wraps the line
    assert "cannot verify the TLS certificate" in said and "TIDEMQ_TLS_CA" in said


async def test_the_sdk_without_the_ca_refuses_the_server(tls: TlsCluster,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEMQ_TLS_CA", raising=False)
    use_ca_bundle(None)
    producer = Producer(broker_url=tls.url("broker"), retry=RetryPolicy(max_attempts=1))
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        async with producer:
            await producer.send(Message(topic="any", body=b"x"))


def test_the_cli_trusts_the_ca_from_the_environment(tls: TlsCluster) -> None:
    use_ca_bundle(None)  # as in a fresh process: the context is built from the variable
    try:
        result = CliRunner().invoke(app, ["--nameserver", tls.url("nameserver"), "cluster",
                                          "--json"], env={"TIDEMQ_TLS_CA": str(tls.pki.ca)})
    finally:
        use_ca_bundle(None)  # the context built from the variable is dropped
    assert result.exit_code == 0, result.output
    assert tls.url("broker") in result.output


def test_a_wrong_ca_is_refused_too(tls: TlsCluster, tmp_path: Path) -> None:
    other = ensure_dev_pki(tmp_path / "other")  # another CA: same names, not the signer
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(tls.url("broker") + "/healthz", timeout=5,
                  verify=ssl.create_default_context(cafile=str(other.ca)))
