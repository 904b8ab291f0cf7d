"""`tidemq up --groups 2 --nameservers 2` as a real process group, and topics across it with the
CLI: every nameserver lists both brokers, a topic is created on both groups (the route merges
them), creating again is idempotent, another queue count needs `topic update`, `--group` picks
groups and names the existing ones when wrong, delete removes it everywhere."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.support.procs import free_port
from tests.support.up import WIDE, UpRun, free_base
from tidemq_server.cli import app

pytestmark = pytest.mark.integration

GROUPS = ("broker-a", "broker-b")


@dataclass
class TwoByTwo:
    up: UpRun
    nameservers: list[str]
    brokers: dict[str, str]  # broker name → REST URL
    grpc: dict[str, str]  # broker name → host:port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoByTwo]:
    ns, grpc = free_base(2, 1), free_base(2, 1)
    broker, checker, scheduler = (free_base(2, 1000) for _ in range(3))
    up = UpRun(tmp_path_factory.mktemp("up-2x2"), "--groups", "2", "--nameservers", "2",
               "--nameserver-port", str(ns), "--broker-port", str(broker),
               "--checker-port", str(checker), "--scheduler-port", str(scheduler),
               "--grpc-port", str(grpc), "--no-metrics", "--stop-timeout", "20")
    try:
        up.wait_ready(120)
        yield TwoByTwo(up, [f"http://127.0.0.1:{ns + j}" for j in range(2)],
                       {g: f"http://127.0.0.1:{broker + 1000 * i}" for i, g in enumerate(GROUPS)},
                       {g: f"127.0.0.1:{grpc + i}" for i, g in enumerate(GROUPS)})
        assert up.stop() == 0, up.output()
    finally:
        up.kill()


def cli(cluster: TwoByTwo, *args: str, code: int = 0,
        nameservers: str | None = None) -> Any:
    result = CliRunner().invoke(
        app, ["--nameserver", nameservers or ",".join(cluster.nameservers), *args], env=WIDE)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result


def route(url: str, topic: str) -> dict[str, int]:
    resp = httpx.get(f"{url}/v1/routes/{topic}", timeout=5)
    if resp.status_code == 404:
        return {}
    assert resp.status_code == 200, resp.text
    return {q["broker_name"]: q["queues"] for q in resp.json()["queues"]}


def test_every_nameserver_lists_both_groups(cluster: TwoByTwo) -> None:
    for url in cluster.nameservers:
        view = httpx.get(f"{url}/v1/cluster", timeout=5).json()
        assert view["nameservers"] == cluster.nameservers
        brokers = {b["broker_name"]: b for b in view["brokers"]}
        assert set(brokers) == set(GROUPS)
        for name in GROUPS:
            assert brokers[name]["address"] == cluster.brokers[name]
            assert brokers[name]["grpc_address"] == cluster.grpc[name]
            assert (brokers[name]["role"], brokers[name]["broker_id"]) == ("primary", 0)
    output = cluster.up.output()
    for name in ("nameserver-1", "nameserver-2", "broker-a", "broker-b", "checker-a",
                 "checker-b", "scheduler-a", "scheduler-b", *cluster.nameservers,
                 *cluster.brokers.values()):
        assert name in output, name
    for address in cluster.grpc.values():
        assert f"grpc:{address.rsplit(':', 1)[1]}" in output
    for name in ("broker-a", "broker-b", "scheduler-b"):
        assert (cluster.up.data_dir / "logs" / f"{name}.log").is_file()
    assert (cluster.up.data_dir / "broker-b" / "store").is_dir()  # group b's own data
    assert (cluster.up.data_dir / "broker" / "store").is_dir()  # group a: the one-group path


def test_topic_create_update_delete_across_groups(cluster: TwoByTwo) -> None:
    topic = "orders-2x2"
    created = json.loads(cli(cluster, "topic", "create", topic, "--queues", "4",
                             "--json").stdout)
    assert [(g["broker_name"], g["result"], g["queues"]) for g in created["groups"]] == [
        ("broker-a", "created", 4), ("broker-b", "created", 4)]
    for url in cluster.nameservers:  # registered at creation: the route merges both groups
        assert route(url, topic) == {"broker-a": 4, "broker-b": 4}

    again = cli(cluster, "topic", "create", topic, "--queues", "4").stdout
    assert again.count("unchanged") == 2

    refused = " ".join(cli(cluster, "topic", "create", topic, "--queues", "2",
                           code=4).stderr.split())  # one line, however the console wraps
    assert "TOPIC_EXISTS" in refused and f"tidemq topic update {topic} --queues 2" in refused
    assert route(cluster.nameservers[0], topic) == {"broker-a": 4, "broker-b": 4}

    unknown = " ".join(cli(cluster, "topic", "create", topic, "--group", "broker-x",
                           code=2).stderr.split())
    assert "broker-x" in unknown and "broker-a, broker-b" in unknown

    cli(cluster, "topic", "update", topic, "--queues", "6", "--group", "broker-b")
    for url in cluster.nameservers:
        assert route(url, topic) == {"broker-a": 4, "broker-b": 6}
    assert "give --queues and/or --perm" in cli(cluster, "topic", "update", topic,
                                                 code=2).stderr

    deleted = json.loads(cli(cluster, "topic", "delete", topic, "--yes", "--json").stdout)
    assert [(g["broker_name"], g["result"]) for g in deleted["groups"]] == [
        ("broker-a", "deleted"), ("broker-b", "deleted")]
    for url in cluster.nameservers:
        assert route(url, topic) == {}
    assert "TOPIC_NOT_FOUND" in cli(cluster, "topic", "delete", topic, "--yes",
                                    code=3).stderr


def test_group_option_and_a_dead_first_nameserver(cluster: TwoByTwo) -> None:
    topic = "only-b-2x2"
    dead = f"http://127.0.0.1:{free_port()}"
    listed = f"{dead},{cluster.nameservers[1]}"  # the first does not answer: the next does
    cli(cluster, "topic", "create", topic, "--queues", "2", "--group", "broker-b",
        nameservers=listed)
    assert route(cluster.nameservers[0], topic) == {"broker-b": 2}
    # adding the topic to the other group later: create fills in, the existing one stays
    out = cli(cluster, "topic", "create", topic, "--queues", "2").stdout
    assert "broker-a: created" in out and "broker-b: unchanged" in out
    assert route(cluster.nameservers[1], topic) == {"broker-a": 2, "broker-b": 2}
    table = cli(cluster, "cluster", nameservers=listed).stdout
    assert "broker-a" in table and "broker-b" in table and cluster.nameservers[0] in table
