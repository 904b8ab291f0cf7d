"""The CLI sees the whole cluster (a real nameserver and two broker groups): `topic list` and
`topic show` list every group, `bench --topic` loads every group of the route, and `cluster`
shows each broker's health, so a SIGKILLed broker the nameserver still lists is not "normal"."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tidemq_server.cli import app

pytestmark = pytest.mark.integration

WIDE = {"COLUMNS": "250"}


@dataclass
class Two:
    nameserver: ServiceProcess
    a: BrokerHandle
    b: BrokerHandle

    def cli(self, *args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, ["--nameserver", self.nameserver.url,
                                          "--broker", self.a.url, *args], env=WIDE)
        assert result.exit_code == code, (result.exit_code, result.output)
        return result.output


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Two]:
    work = tmp_path_factory.mktemp("cluster-wide")
    with ExitStack() as stack:
        port = free_port()
        ns = ServiceProcess("nameserver", port, {"TIDEMQ_NAMESRV_PORT": str(port),
                                                 "TIDEMQ_NAMESRV_TOKEN": TOKEN}, work)
        stack.callback(ns.start().stop)
        groups = [stack.enter_context(run_broker(work, redis_server.url, nameservers=ns.url,
                                                 broker_name=name, register_interval_s=1))
                  for name in ("broker-a", "broker-b")]
        yield Two(ns, *groups)


def test_topic_list_and_show_cover_every_group(two: Two) -> None:
    both, only_b = unique("Both"), unique("OnlyB")
    two.cli("topic", "create", both, "--queues", "2")
    two.cli("topic", "create", only_b, "--queues", "3", "--group", "broker-b")
    two.b.send(only_b, {"body": "x", "queue_id": 1})
    listed = {t["name"]: t["groups"] for t in json.loads(two.cli("topic", "list", "--json"))
              ["topics"]}
    assert [(g["broker_name"], g["queues"]) for g in listed[both]] == [("broker-a", 2),
                                                                      ("broker-b", 2)]
    assert [g["broker_name"] for g in listed[only_b]] == ["broker-b"]
    table = two.cli("topic", "list")
    assert only_b in table and "broker-b (3q rw)" in table
    shown = json.loads(two.cli("topic", "show", only_b, "--json"))
    assert [g["broker_name"] for g in shown["groups"]] == ["broker-b"]
    assert shown["groups"][0]["offsets"][1]["max"] == 1
    table = two.cli("topic", "show", both)
    assert table.count("broker-a (2q rw)") == 2 and table.count("broker-b (2q rw)") == 2
    two.cli("topic", "show", unique("None"), code=3)


def test_bench_topic_loads_every_group_of_the_route(two: Two) -> None:
    topic = unique("Load")
    two.cli("topic", "create", topic, "--queues", "2")
    report = json.loads(two.cli("bench", "--topic", topic, "--messages", "200", "--batch", "10",
                                "--json").splitlines()[-1])
    assert report["sent"] == 200 and report["failures"] == []
    sent = {g["broker_name"]: g["sent"] for g in report["groups"]}
    assert set(sent) == {"broker-a", "broker-b"} and all(n > 0 for n in sent.values())
    for handle, name in ((two.a, "broker-a"), (two.b, "broker-b")):
        stored = sum(q["max"] for q in handle.http.get(f"/v1/topics/{topic}").json()["offsets"])
        assert stored == sent[name]


def test_cluster_shows_a_killed_broker_as_unhealthy(two: Two) -> None:
    listed = json.loads(two.cli("cluster", "--json"))["brokers"]
    assert {b["broker_name"]: b["health"] for b in listed} == {"broker-a": "ok",
                                                               "broker-b": "ok"}
    two.b.proc.stop(signal.SIGKILL)
    listed = json.loads(two.cli("cluster", "--json"))["brokers"]
    health = {b["broker_name"]: b["health"] for b in listed}
    assert health["broker-a"] == "ok" and health["broker-b"].startswith("unreachable"), health
    table = two.cli("cluster")
    row = next(line for line in table.splitlines() if "broker-b" in line)
    assert "unreachable" in row
    assert "1 of 2 broker(s) do not answer as healthy" in table
