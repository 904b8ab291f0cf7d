"""The compose topology as local processes, driven by real transactions end to end.

The TLS init step makes the CA and certificate first; then every service of docker-compose.yml
that is a process (Redis, two nameservers, brokers broker-a and broker-b with a checker and a
scheduler each, the metrics sidecar) starts with its compose command and environment on
loopback (``tests/deploy/topology.py``). Both brokers register with both nameservers; a
transaction is committed on broker-a and another rolled back on broker-b through the REST API,
and both must show up in the sidecar's ``/metrics`` (the PySpark job in continuous mode, reading
every group through the nameservers) in a form promtool accepts; all of it over https://,
verified against the init step's CA, and signed (accounts on: the services as their account,
the test as the admin the init step made; an unsigned request is refused). A service whose
``services/<name>/__main__.py`` does not exist yet is reported and left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.topology import Topology, load_compose
from tests.support.metrics import parse_exposition, promtool
from tests.support.wait import wait_until
from tidemq_server.cli.plan import module_available

pytestmark = pytest.mark.integration

ORDER = ("init-secrets", "redis", "nameserver-1", "nameserver-2", "broker-a", "broker-b",
         "checker-a", "checker-b", "scheduler-a", "scheduler-b", "metrics")
GROUPS = ("broker-a", "broker-b")


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    topo = Topology(load_compose(), tmp_path_factory.mktemp("compose"))
    try:
        topo.run_once("init-secrets")
        for name in ORDER[1:]:
            module = (topo.compose["services"][name].get("command") or [""])[-1]
            if module.startswith("tidemq_server.") and not module_available(module):
                print(f"compose service {name}: {module} has no __main__ yet; not started")
                continue
            topo.start(name)
        yield topo
    finally:
        topo.stop_all()


def test_names_and_ports_are_remapped(topology: Topology, tmp_path: Path) -> None:
    assert set(ORDER) <= set(topology.compose["services"])
    broker = topology.services["broker-b"]
    assert broker.env["TIDEMQ_BROKER_HOST"] == "127.0.0.1"
    assert broker.env["TIDEMQ_BROKER_PORT"] == str(broker.port)
    redis_port = topology.services["redis"].port
    assert broker.env["TIDEMQ_BROKER_REDIS_URL"] == f"redis://127.0.0.1:{redis_port}/0"
    assert broker.env["TIDEMQ_BROKER_DATA_DIR"].startswith(str(topology.workdir))
    nameservers = f"{topology.url('nameserver-1')},{topology.url('nameserver-2')}"
    assert broker.env["TIDEMQ_BROKER_NAMESERVERS"] == nameservers
    assert broker.env["TIDEMQ_BROKER_SCHEDULER_URL"] == topology.url("scheduler-b")
    metrics = topology.services["metrics"]
    assert metrics.env["TIDEMQ_METRICS_NAMESERVERS"] == nameservers
    assert metrics.env["TIDEMQ_METRICS_TOKEN"] == broker.env["TIDEMQ_BROKER_TOKEN"]


def test_every_broker_registers_with_both_nameservers(topology: Topology) -> None:
    for ns in ("nameserver-1", "nameserver-2"):
        view = topology.client(ns).get("/v1/cluster").json()
        assert {b["broker_name"]: b["address"] for b in view["brokers"]} == {
            g: topology.url(g) for g in GROUPS}
        assert view["nameservers"] == [topology.url("nameserver-1"),
                                       topology.url("nameserver-2")]


def test_accounts_are_on_an_unsigned_request_is_refused(topology: Topology) -> None:
    with httpx.Client(base_url=topology.url("broker-a"), timeout=10,
                      verify=topology.verify()) as anonymous:
        refused = anonymous.put("/v1/topics/Anonymous", json={"queues": 1})
    assert refused.status_code == 401, refused.text
    assert refused.json()["code"] == "UNAUTHORIZED"
    assert topology.client("broker-a").get("/v1/topics/Anonymous").status_code == 404


@pytest.mark.timeout(480)  # the wait below, with Spark's start on a loaded host
def test_transactions_on_both_groups_reach_the_sidecar_metrics(topology: Topology) -> None:
    for group, action in zip(GROUPS, ("commit", "rollback"), strict=True):
        broker = topology.client(group)  # signed as the admin the init step made
        assert broker.put("/v1/topics/Orders", json={"queues": 2}).status_code == 200
        begun = broker.post("/v1/transactions", json={
            "producer_group": "shop", "topic": "Orders",
            "message": {"body": f"order to {action} on {group}"}})
        assert begun.status_code == 200, begun.text
        txid = begun.json()["transaction_id"]
        ended = broker.post(f"/v1/transactions/{txid}/end",
                            json={"producer_group": "shop", "action": action})
        assert ended.status_code == 200, ended.text
    for ns in ("nameserver-1", "nameserver-2"):  # the route merges both groups' queues
        route = topology.client(ns).get("/v1/routes/Orders")
        assert route.status_code == 200, route.text
        assert sorted(q["broker_name"] for q in route.json()["queues"]) == list(GROUPS)

    labels = {"producer_group": "shop", "topic": "Orders", "source": "producer"}
    want = {("tidemq_transaction_commits_total", frozenset(labels.items())): 1.0,
            ("tidemq_transaction_rollbacks_total", frozenset(labels.items())): 1.0}
    sidecar = topology.url("metrics") + "/metrics"
    last = [""]

    def shown() -> str | None:
        last[0] = text = httpx.get(sidecar, timeout=10, verify=topology.verify()).text
        samples = parse_exposition(text)
        return text if all(samples.get(k) == v for k, v in want.items()) else None

    try:  # Spark alone took 115-125 s to start on a loaded host
        text = wait_until(shown, timeout=300, every=1.0)
    except AssertionError:
        pytest.fail(f"the transactions never showed in {sidecar}:\n{last[0][-3000:]}\n"
                    f"sidecar log:\n{topology.services['metrics'].logs()}")
    promtool("check", "metrics", stdin=text)
    samples = parse_exposition(text)
    half = ("tidemq_transaction_half_messages_total",
            frozenset({"producer_group": "shop", "topic": "Orders"}.items()))
    assert samples[half] == 2
    assert samples[("tidemq_metrics_job_up", frozenset())] == 1
    for group in GROUPS:
        assert "tidemq_broker_messages_put_total" in httpx.get(
            topology.url(group) + "/metrics", timeout=10, verify=topology.verify()).text
