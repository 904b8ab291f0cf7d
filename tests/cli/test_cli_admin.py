"""The `tidemq` entry point as a subprocess against a real nameserver and broker: topic delete,
group list/offsets/reset, tx end, dlq resend, send --deliver-at-ms, query states, hints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import REPO, RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.integration

WIDE = {"COLUMNS": "200"}
ENTRY = Path(sys.executable).parent / "tidemq"  # the console script `pip install -e` made


@pytest.fixture(scope="module")
def nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    env = {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_TOKEN": TOKEN}
    proc = ServiceProcess("nameserver", port, env, tmp_path_factory.mktemp("ns-cli")).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
           nameserver: ServiceProcess) -> Iterator[BrokerHandle]:
    # max_reconsume_times=0: the first retry of a message dead-letters it
    with run_broker(tmp_path_factory.mktemp("cli-admin"), redis_server.url,
                    nameservers=nameserver.url, max_reconsume_times=0) as handle:
        yield handle


class Cli:
    def __init__(self, broker: BrokerHandle, nameserver: ServiceProcess) -> None:
        self.urls = ["--broker", broker.url, "--nameserver", nameserver.url]

    def run(self, *args: str, code: int = 0, stdin: str = "") -> subprocess.CompletedProcess[str]:
        argv = [str(ENTRY)] if ENTRY.exists() else [sys.executable, "-m", "tidemq_server.cli"]
        done = subprocess.run([*argv, *self.urls, *args], cwd=REPO, input=stdin,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, **WIDE})
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    def json_lines(self, *args: str, code: int = 0) -> list[Any]:
        return [json.loads(line) for line in
                self.run(*args, "--json", code=code).stdout.splitlines()]


@pytest.fixture
def cli(broker: BrokerHandle, nameserver: ServiceProcess) -> Cli:
    return Cli(broker, nameserver)


def test_help_lists_the_new_commands(cli: Cli) -> None:
    assert "delete" in cli.run("topic", "--help").stdout
    group_help = cli.run("group", "--help").stdout
    assert all(word in group_help for word in ("list", "offsets", "reset"))
    assert "--message-id" in cli.run("dlq", "resend", "--help").stdout
    assert "--producer-group" in cli.run("tx", "end", "--help").stdout
    assert "--deliver-at-ms" in cli.run("send", "--help").stdout
    assert "--grpc-port" in cli.run("up", "--help").stdout


def test_unknown_topic_hint_names_the_command(cli: Cli) -> None:
    missing = unique("missing")
    err = cli.run("send", missing, "hello", code=3).stderr
    assert "TOPIC_NOT_FOUND" in err and f"tidemq topic create {missing}" in err
    assert "PUT /v1/topics" not in err


def test_topic_delete(cli: Cli, broker: BrokerHandle, nameserver: ServiceProcess) -> None:
    topic = unique("cli-del")
    cli.run("topic", "create", topic, "--queues", "2")
    refused = cli.run("topic", "delete", topic, code=1, stdin="n\n")
    assert "not deleted" in refused.stderr
    assert topic in cli.run("topic", "list").stdout

    assert cli.json("topic", "delete", topic, "--yes") == {"deleted": topic, "groups": [
        {"broker_name": "broker-a", "address": broker.url, "result": "deleted", "queues": 2}]}
    assert topic not in cli.run("topic", "list").stdout
    assert topic not in cli.run("cluster").stdout  # left the nameserver's routes at once
    err = cli.run("topic", "delete", topic, "--yes", code=3).stderr
    assert "TOPIC_NOT_FOUND" in err
    err = cli.run("topic", "delete", "%DLQ%g", "--yes", code=4).stderr
    assert "FORBIDDEN_SYSTEM_TOPIC" in err


def lag(cli: Cli, group: str, topic: str) -> dict[int, tuple[int, int]]:
    rows = cli.json("group", "offsets", group, "--topic", topic)["offsets"]
    return {r["queue_id"]: (r["offset"], r["lag"]) for r in rows}


def test_group_list_offsets_and_reset(cli: Cli, broker: BrokerHandle) -> None:
    topic, group = broker.create_topic(queues=2), unique("G")
    broker.send(topic, {"body": "a", "queue_id": 0}, {"body": "b", "queue_id": 0},
                {"body": "c", "queue_id": 1})
    assert lag(cli, group, topic) == {0: (0, 2), 1: (0, 1)}  # nothing committed: from min
    cli.run("consume", topic, "--group", group, "--commit")
    assert lag(cli, group, topic) == {0: (2, 0), 1: (1, 0)}
    listed = {g["group"]: g for g in cli.json("group", "list")["groups"]}
    assert listed[group]["topics"] == [topic]
    assert group in cli.run("group", "list").stdout

    time.sleep(0.05)
    middle = now_ms()
    time.sleep(0.05)
    broker.send(topic, {"body": "d", "queue_id": 0})
    table = cli.run("group", "offsets", group, "--topic", topic).stdout
    assert "lag 1" in table

    cli.run("group", "reset", group, "--topic", topic, "--to", "earliest")
    assert lag(cli, group, topic) == {0: (0, 3), 1: (0, 1)}
    cli.run("group", "reset", group, "--topic", topic, "--to", "latest")
    assert lag(cli, group, topic) == {0: (3, 0), 1: (1, 0)}
    reset = cli.json("group", "reset", group, "--topic", topic, "--to", str(middle))
    assert reset["offsets"] == [{"topic": topic, "queue_id": 0, "offset": 2},
                                {"topic": topic, "queue_id": 1, "offset": 1}]
    assert lag(cli, group, topic) == {0: (2, 1), 1: (1, 0)}
    err = cli.run("group", "reset", group, "--topic", topic, "--to", "yesterday", code=2).stderr
    assert "--to must be" in err


def half(broker: BrokerHandle, group: str, topic: str, body: str) -> dict[str, str]:
    resp = broker.http.post("/v1/transactions", json={
        "producer_group": group, "topic": topic, "message": {"body": body},
        "check_immunity_s": 3600})
    assert resp.status_code == 200, resp.text
    answer: dict[str, str] = resp.json()
    return answer


def test_tx_end_commits_or_rolls_back(cli: Cli, broker: BrokerHandle) -> None:
    topic, group = broker.create_topic(queues=1), unique("PG")
    to_commit, to_drop = half(broker, group, topic, "yes"), half(broker, group, topic, "no")

    out = cli.run("tx", "end", to_commit["transaction_id"], "--action", "commit",
                  "--producer-group", group).stdout
    assert "committed" in out
    assert cli.json("tx", "end", to_drop["transaction_id"], "--action", "rollback",
                    "-g", group) == {"state": "rolled_back"}
    states = {m: cli.json("query", "--id", m)["state"]
              for m in (to_commit["message_id"], to_drop["message_id"])}
    assert states == {to_commit["message_id"]: "committed", to_drop["message_id"]: "rolled_back"}
    assert [m["body"] for m in broker.pull(topic, 0)["messages"]] == ["yes"]
    err = cli.run("tx", "end", to_drop["transaction_id"], "--action", "commit", "-g", group,
                  code=4).stderr
    assert "TRANSACTION_ALREADY_ENDED" in err


def test_dlq_resend(cli: Cli, broker: BrokerHandle) -> None:
    topic, group = broker.create_topic(queues=1), unique("G")
    first = broker.send(topic, {"body": "poison", "tag": "T1", "keys": ["k-9"],
                                "properties": {"color": "red"}})[0]["message_id"]
    second = broker.send(topic, {"body": "also"})[0]["message_id"]
    for mid in (first, second):
        # with a reason: the DLQ copy carries the broker's TIDE_CONSUME_FAILURE, not resent
        resp = broker.http.post(f"/v1/groups/{group}/retry",
                                json={"message_id": mid, "reason": "boom"})
        assert resp.json()["destination"] == f"%DLQ%{group}"

    results = cli.json_lines("dlq", "resend", group, "--all")
    assert [(r["message_id"], r["topic"], r["dlq_queue_offset"]) for r in results] == [
        (first, topic, 0), (second, topic, 1)]
    copies = broker.pull(topic, 0, offset=2)["messages"]
    assert [m["body"] for m in copies] == ["poison", "also"]
    assert copies[0]["tag"] == "T1" and copies[0]["keys"] == ["k-9"]
    assert copies[0]["properties"] == {"color": "red", "dlq_message_id": first}
    assert copies[0]["message_id"] == results[0]["resent"]["message_id"] != first

    assert cli.json_lines("dlq", "resend", group, "--all") == []  # the offset moved on
    again = cli.json_lines("dlq", "resend", group, "--message-id", first)
    assert again[0]["resent"] == results[0]["resent"]  # same id: the broker stores it once
    assert broker.pull(topic, 0)["max_offset"] == 4

    table = cli.run("dlq", "resend", group, "--message-id", second).stdout
    assert f"%DLQ%{group}: 0 resent, 0 failed, 1 resent before (not again)" in table
    err = cli.run("dlq", "resend", group, "--message-id", "nope", code=3).stderr
    assert "MESSAGE_NOT_FOUND" in err
    assert "--message-id ID or --all" in cli.run("dlq", "resend", group, code=2).stderr
    assert "TOPIC_NOT_FOUND" in cli.run("dlq", "resend", unique("G"), "--all", code=3).stderr


def test_dlq_resend_reports_a_failure_and_keeps_the_offset(cli: Cli,
                                                          broker: BrokerHandle) -> None:
    topic, group = broker.create_topic(queues=1), unique("G")
    mid = broker.send(topic, {"body": "orphan"})[0]["message_id"]
    broker.http.post(f"/v1/groups/{group}/retry", json={"message_id": mid})
    assert broker.http.delete(f"/v1/topics/{topic}").status_code == 200

    [failed] = cli.json_lines("dlq", "resend", group, "--all", code=1)
    assert failed["message_id"] == mid and "TOPIC_NOT_FOUND" in failed["error"]
    broker.create_topic(topic, queues=1)
    [resent] = cli.json_lines("dlq", "resend", group, "--all")  # not skipped by the failure
    assert resent["resent"]["queue_offset"] == 1


def test_send_deliver_at_ms_and_query_states(cli: Cli, broker: BrokerHandle) -> None:
    topic = broker.create_topic(queues=1)
    future = now_ms() + 3_600_000
    later = cli.json("send", topic, "later", "--deliver-at-ms", str(future))
    assert cli.json("query", "--id", later["message_id"])["state"] == "scheduled"
    now = cli.json("send", topic, "now", "--deliver-at-ms", "1", "--key", "k-now")
    assert [m["body"] for m in broker.pull(topic, 0)["messages"]] == ["now"]
    assert cli.json("query", "--id", now["message_id"])["state"] == "stored"

    table = cli.run("query", "--topic", topic, "--key", "k-now").stdout
    row = next(line for line in table.splitlines() if now["message_id"] in line)
    assert "stored" in row
    err = cli.run("send", topic, "x", "--delay-ms", "5", "--deliver-at-ms", "5", code=2).stderr
    assert "at most one of" in err
