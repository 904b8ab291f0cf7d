"""`tidemq up` and etcd: the managed etcd (a real one, on a free port, data under the data dir)
and brokers told where it is."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from tidemq_server.cli.plan import UpOptions, etcd_command, plan_services, with_etcd
from tidemq_server.cli.supervisor import Supervisor
from tidemq_server.cli.up import start_etcd
from tidemq_server.common.constants import ETCD_PORT


def _free_pair() -> int:
    """A port whose successor is free too (etcd's client and peer ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            with socket.socket() as t:
                t.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two adjacent free ports")


def test_brokers_and_only_brokers_get_the_etcd_endpoints() -> None:
    opts = UpOptions(groups=2, metrics=False, replicas=3)
    specs = plan_services(opts, redis_url="redis://x:1/0", token="t")
    changed = with_etcd(specs, "http://127.0.0.1:2379")
    for before, after in zip(specs, changed, strict=True):
        if before.service == "broker":
            assert after.env["TIDEMQ_BROKER_ETCD_ENDPOINTS"] == "http://127.0.0.1:2379"
            assert {k: v for k, v in after.env.items()
                    if k != "TIDEMQ_BROKER_ETCD_ENDPOINTS"} == dict(before.env)
        else:
            assert after == before
    assert sum(s.service == "broker" for s in changed) == 6  # 2 groups of 3 copies
    assert opts.etcd_port == ETCD_PORT


def test_etcd_command_names_its_ports_and_data_dir(tmp_path: Path) -> None:
    argv = etcd_command("/usr/bin/etcd", "127.0.0.1", 4000, tmp_path / "etcd")
    assert argv[0] == "/usr/bin/etcd"
    assert argv[argv.index("--listen-client-urls") + 1] == "http://127.0.0.1:4000"
    assert argv[argv.index("--listen-peer-urls") + 1] == "http://127.0.0.1:4001"
    assert argv[argv.index("--data-dir") + 1] == str(tmp_path / "etcd")
    # bound to every interface, it advertises the address given
    argv = etcd_command("/usr/bin/etcd", "0.0.0.0", 4000, tmp_path / "etcd", "10.77.0.5")
    assert argv[argv.index("--listen-client-urls") + 1] == "http://0.0.0.0:4000"
    assert argv[argv.index("--advertise-client-urls") + 1] == "http://10.77.0.5:4000"
    assert argv[argv.index("--initial-cluster") + 1] == "tidemq=http://10.77.0.5:4001"


@pytest.mark.integration
def test_start_etcd_runs_a_real_etcd_under_the_data_dir(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, start_timeout_s=30, stop_timeout_s=5)
    port = _free_pair()
    try:
        url = start_etcd(sup, "127.0.0.1", port)
        assert url == f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/health", timeout=2).json()["health"] == "true"
        assert (tmp_path / "etcd" / "member").is_dir()
    finally:
        sup.stop_all()
