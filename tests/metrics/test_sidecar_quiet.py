"""The sidecar as a real process (``python -m tidemq_server.metrics``, Spark in local mode) on a
quiet system: a real broker whose transaction event topic gets one transaction, then nothing. The
job keeps polling the broker every trigger, so its liveness age stays small while the age of the
newest event grows.

The polls come one every ``HTTP_SERVER_KEEP_ALIVE_S``: a client that reuses a connection idle
that long races the server closing it, and now and then gets no answer. ``KeepAliveCutter``, a
TCP proxy in front of the broker, makes that race lose every time (it hangs up on any request
sent on a connection idle for a second or more), so the log must show no disconnect at all.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tidemq.protocol import SystemTopic

from tests.support.broker import TOKEN, BrokerHandle, run_broker
from tests.support.metrics import Script, parse_exposition, promtool, put_events, sample
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tests.support.wait import quiet_for, wait_until
from tidemq_server.common.constants import HTTP_SERVER_KEEP_ALIVE_S

pytestmark = pytest.mark.integration

TRIGGER_S = float(HTTP_SERVER_KEEP_ALIVE_S)
QUIET_POLLS = 5  # empty triggers watched
LIVENESS = "tidemq_metrics_last_batch_completed_age_seconds"
NEWEST = "tidemq_metrics_newest_event_age_seconds"
NOISE = re.compile(r"RemoteProtocolError|Server disconnected|retrying", re.IGNORECASE)


class KeepAliveCutter:
    """A TCP proxy to ``port`` playing a server whose keep-alive timeout fires just as the next
    request arrives: bytes from the client on a connection idle for ``idle_s`` or more (after a
    first exchange) are not forwarded; both sides are closed instead, with no answer."""

    def __init__(self, port: int, idle_s: float) -> None:
        self.port = port
        self.idle_s = idle_s
        self.cuts = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.port))
            last = [0.0]  # when bytes last went either way (0: no exchange yet)
            threading.Thread(target=self._requests, args=(client, upstream, last),
                             daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client, last),
                             daemon=True).start()

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _requests(self, client: socket.socket, upstream: socket.socket, last: list[float]) -> None:
        try:
            while data := client.recv(65536):
                if last[0] and time.monotonic() - last[0] >= self.idle_s:
                    self.cuts += 1
                    break
                upstream.sendall(data)
                last[0] = time.monotonic()
        except OSError:
            pass
        self._close(client, upstream)

    def _answers(self, upstream: socket.socket, client: socket.socket, last: list[float]) -> None:
        try:
            while data := upstream.recv(65536):
                client.sendall(data)
                last[0] = time.monotonic()
        except OSError:
            pass
        self._close(client, upstream)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def quiet_broker(tmp_path_factory: pytest.TempPathFactory,
                 redis_server: RedisServer) -> Iterator[BrokerHandle]:
    """A broker of its own: no other test writes transaction events to it."""
    with run_broker(tmp_path_factory.mktemp("quiet-broker"), redis_server.url) as handle:
        yield handle


@pytest.fixture
def cutter(quiet_broker: BrokerHandle) -> Iterator[KeepAliveCutter]:
    proxy = KeepAliveCutter(quiet_broker.proc.port, idle_s=1.0)
    yield proxy
    proxy.close()


@pytest.fixture
def sidecar(quiet_broker: BrokerHandle, cutter: KeepAliveCutter,
            tmp_path: Path) -> Iterator[ServiceProcess]:
    """The sidecar (reading through the cutter), started after one transaction's two events
    were written."""
    script = Script("quiet", "Orders")
    script.ended("commit", 20)
    put_events(quiet_broker.url, TOKEN, SystemTopic.TRANS_EVENTS.value, script.bodies)
    port = free_port()
    env = {"TIDEMQ_METRICS_PORT": str(port), "TIDEMQ_METRICS_BROKER_URL": cutter.url,
           "TIDEMQ_METRICS_TOKEN": TOKEN, "TIDEMQ_METRICS_DATA_DIR": str(tmp_path / "metrics"),
           "TIDEMQ_METRICS_MASTER": "local[1]",
           "TIDEMQ_METRICS_TRIGGER_INTERVAL_S": str(TRIGGER_S)}
    proc = ServiceProcess("metrics", port, env, tmp_path).start()
    try:
        yield proc
    finally:
        proc.stop()


def scrape(sidecar: ServiceProcess) -> tuple[str, dict[str, float]]:
    text = httpx.get(f"{sidecar.url}/metrics", timeout=5).text
    samples = parse_exposition(text)
    return text, {name: sample(samples, name) for name in (LIVENESS, NEWEST)}


def test_a_quiet_system_stays_live_and_logs_no_disconnects(sidecar: ServiceProcess) -> None:
    # Spark starts, then the first batch reads both events
    wait_until(lambda: scrape(sidecar)[1][NEWEST] >= 0, timeout=120, every=0.5,
               what="the first batch")
    log_mark = len(sidecar.logs())
    batches = httpx.get(f"{sidecar.url}/v1/status", timeout=5).json()["batches_written"]

    seen: list[dict[str, float]] = []
    scraped = [""]

    def live() -> bool:
        scraped[0], ages = scrape(sidecar)
        seen.append(ages)
        # one trigger interval, plus the batch's own time and the listener's delivery
        return 0 <= ages[LIVENESS] < 2 * TRIGGER_S

    # live at every scrape through QUIET_POLLS empty triggers (a scrape every 0.5 s)
    assert quiet_for(live, QUIET_POLLS * TRIGGER_S, "live", every=0.5), (
        seen, sidecar.logs()[-4000:])
    text = scraped[0]
    promtool("check", "metrics", stdin=text)
    newest = [ages[NEWEST] for ages in seen]
    assert newest == sorted(newest) and newest[-1] >= QUIET_POLLS * TRIGGER_S - 1, seen
    samples = parse_exposition(text)
    assert sample(samples, "tidemq_metrics_events_read_total") == 2
    assert sample(samples, "tidemq_metrics_job_up") == 1
    status = httpx.get(f"{sidecar.url}/v1/status", timeout=5).json()
    assert status["state"] == "running"
    assert status["batches_written"] == batches  # empty polls ran no micro-batch

    quiet_log = sidecar.logs()[log_mark:]
    assert not NOISE.findall(quiet_log), quiet_log[-4000:]
    assert not NOISE.findall(sidecar.logs()), sidecar.logs()[-4000:]
