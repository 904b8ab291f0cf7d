"""The compose topology as local processes, driven by a real transaction end to end.

Every service of docker-compose.yml that is a process (Redis, nameserver, broker, checker,
scheduler, metrics sidecar) starts with its compose command and environment on loopback
(``tests/deploy/topology.py``); a transaction is committed and another rolled back through the
broker's REST API, and both must show up in the sidecar's ``/metrics`` (the PySpark job in
continuous mode) in a form promtool accepts. A service whose ``services/<name>/__main__.py``
does not exist yet is reported and left out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.cli.plan import module_available
from tests.deploy.topology import Topology, load_compose
from tests.support.metrics import parse_exposition, promtool

pytestmark = pytest.mark.integration

ORDER = ("redis", "nameserver", "broker", "checker", "scheduler", "metrics")


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    topo = Topology(load_compose(), tmp_path_factory.mktemp("compose"))
    try:
        for name in ORDER:
            module = (topo.compose["services"][name].get("command") or [""])[-1]
            if module.startswith("services.") and not module_available(module):
                print(f"compose service {name}: {module} has no __main__ yet; not started")
                continue
            topo.start(name)
        yield topo
    finally:
        topo.stop_all()


def test_names_and_ports_are_remapped(topology: Topology, tmp_path: Path) -> None:
    broker = topology.services["broker"]
    assert broker.env["TIDEMQ_BROKER_HOST"] == "127.0.0.1"
    assert broker.env["TIDEMQ_BROKER_PORT"] == str(broker.port)
    redis_port = topology.services["redis"].port
    assert broker.env["TIDEMQ_BROKER_REDIS_URL"] == f"redis://127.0.0.1:{redis_port}/0"
    assert broker.env["TIDEMQ_BROKER_DATA_DIR"].startswith(str(topology.workdir))
    metrics = topology.services["metrics"]
    assert metrics.env["TIDEMQ_METRICS_BROKER_URL"] == topology.url("broker")
    assert metrics.env["TIDEMQ_METRICS_TOKEN"] == broker.env["TIDEMQ_BROKER_TOKEN"]


def test_a_transaction_reaches_the_sidecar_metrics(topology: Topology) -> None:
    broker = httpx.Client(base_url=topology.url("broker"), timeout=10)
    assert broker.put("/v1/topics/Orders", json={"queues": 2}).status_code == 200
    for action in ("commit", "rollback"):
        begun = broker.post("/v1/transactions", json={
            "producer_group": "shop", "topic": "Orders",
            "message": {"body": f"order to {action}"}})
        assert begun.status_code == 200, begun.text
        txid = begun.json()["transaction_id"]
        ended = broker.post(f"/v1/transactions/{txid}/end",
                            json={"producer_group": "shop", "action": action})
        assert ended.status_code == 200, ended.text
    nameserver = httpx.get(topology.url("nameserver") + "/v1/routes/Orders", timeout=10)
    assert nameserver.status_code == 200  # the broker registered itself under its name

    labels = {"producer_group": "shop", "topic": "Orders", "source": "producer"}
    want = {("tidemq_transaction_commits_total", frozenset(labels.items())): 1.0,
            ("tidemq_transaction_rollbacks_total", frozenset(labels.items())): 1.0}
    sidecar = topology.url("metrics") + "/metrics"
    deadline = time.monotonic() + 150
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(sidecar, timeout=10).text
        samples = parse_exposition(text)
        if all(samples.get(k) == v for k, v in want.items()):
            break
        time.sleep(1.0)
    else:
        pytest.fail(f"the transactions never showed in {sidecar}:\n{text[-3000:]}\n"
                    f"sidecar log:\n{topology.services['metrics'].logs()}")
    promtool("check", "metrics", stdin=text)
    samples = parse_exposition(text)
    half = ("tidemq_transaction_half_messages_total",
            frozenset({"producer_group": "shop", "topic": "Orders"}.items()))
    assert samples[half] == 2
    assert samples[("tidemq_metrics_job_up", frozenset())] == 1
    assert "tidemq_broker_messages_put_total" in broker.get("/metrics").text
