"""A starting nameserver ends its warm-up as soon as it can know (real nameserver processes).

- told the broker groups it serves (``EXPECT_BROKERS``, as ``tidemq up`` does): 503 until each
  has a primary registered, then 404 at once, long before ``warmup_s``;
- a nameserver joining a running cluster asks its peers for the cluster view: 503 while a
  group of that view has not registered with it (the protection of a restart), 404 at once
  after; a peer that is warming up itself does not vouch;
- knowing of no group, it waits its whole warm-up, as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.support.broker import TOKEN, unique
from tests.support.procs import ServiceProcess, free_port
from tests.support.wait import quiet_for
from tidemq_server.nameserver.warmup import PEER_RETRY_S

pytestmark = pytest.mark.integration

LONG_WARMUP_S = 60  # longer than any test here: every 404 below comes from the early end


def _nameserver(work: Path, stack: ExitStack, peers: list[str] | None = None,
                port: int | None = None, **settings: str) -> ServiceProcess:
    port = port or free_port()
    env = {"TIDEMQ_NAMESRV_PORT": str(port), "TIDEMQ_NAMESRV_TOKEN": TOKEN,
           **{f"TIDEMQ_NAMESRV_{k.upper()}": v for k, v in settings.items()}}
    if peers is not None:
        env["TIDEMQ_NAMESRV_PEERS"] = ",".join([*peers, f"http://127.0.0.1:{port}"])
    ns = ServiceProcess("nameserver", port, env, work)
    stack.callback(ns.start().stop)
    return ns


def _register(ns: ServiceProcess, group: str, broker_id: int = 0, role: str = "primary") -> None:
    resp = httpx.post(f"{ns.url}/v1/brokers/heartbeat", headers={"X-Tidemq-Token": TOKEN},
                      json={"cluster": "c", "broker_name": group, "broker_id": broker_id,
                            "role": role, "address": f"http://127.0.0.1:{free_port()}",
                            "topics": {"Known": {"queues": 1, "perm": "rw"}}})
    assert resp.status_code == 200, resp.text


def _unknown(ns: ServiceProcess) -> int:
    return httpx.get(f"{ns.url}/v1/routes/{unique('Unknown')}").status_code


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def test_expected_groups_end_the_warm_up_once_registered(work: Path) -> None:
    with ExitStack() as stack:
        ns = _nameserver(work, stack, warmup_s=str(LONG_WARMUP_S),
                         expect_brokers="broker-a,broker-b")
        assert _unknown(ns) == 503
        _register(ns, "broker-a")
        _register(ns, "broker-b", broker_id=1, role="replica")  # a replica is not the group
        assert _unknown(ns) == 503
        _register(ns, "broker-b")
        assert _unknown(ns) == 404
        assert httpx.get(f"{ns.url}/v1/cluster").json()["warming_up"] is False


def test_a_joining_nameserver_trusts_its_peers_view(work: Path) -> None:
    with ExitStack() as stack:
        running = _nameserver(work, stack, warmup_s="0")
        _register(running, "broker-a")
        _register(running, "broker-b")
        joining = _nameserver(work, stack, peers=[running.url], warmup_s=str(LONG_WARMUP_S))
        deadline = time.monotonic() + 10
        while "cluster view" not in joining.logs() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "broker groups broker-a, broker-b" in joining.logs()
        assert _unknown(joining) == 503  # restarted into a running cluster: still protected
        _register(joining, "broker-a")
        assert _unknown(joining) == 503
        _register(joining, "broker-b")
        assert _unknown(joining) == 404


def test_a_warming_peer_does_not_vouch_and_no_knowledge_keeps_the_timer(work: Path) -> None:
    with ExitStack() as stack:
        warming = _nameserver(work, stack, warmup_s=str(LONG_WARMUP_S))
        assert httpx.get(f"{warming.url}/v1/cluster").json()["warming_up"] is True
        joining = _nameserver(work, stack, peers=[warming.url], warmup_s=str(LONG_WARMUP_S))
        _register(joining, "broker-a")
        # through more than one round of asking the peer, both stay protected
        assert quiet_for(lambda: (_unknown(joining), _unknown(warming)), 1.5 * PEER_RETRY_S,
                         "unknown topics") == (503, 503)
