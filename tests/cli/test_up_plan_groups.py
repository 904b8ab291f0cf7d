"""The plan of `tidemq up --groups N --nameservers M` (pure): names, predictable ports, data
dirs and the environment that wires each group's checker and scheduler to its broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq_server.cli.plan import UpOptions, group_name, plan_services


def everything(_: str) -> bool:
    return True


def test_two_groups_two_nameservers(tmp_path: Path) -> None:
    opts = UpOptions(data_dir=tmp_path / "d", groups=2, nameservers=2)
    specs = plan_services(opts, redis_url="redis://r", token="tok", available=everything)
    data = (tmp_path / "d").resolve()

    assert [(s.name, s.port, s.grpc_port) for s in specs] == [
        ("nameserver-1", 9876, 0), ("nameserver-2", 9877, 0),
        ("broker-a", 10911, 8081), ("broker-b", 11911, 8082),
        ("checker-a", 10921, 0), ("checker-b", 11921, 0),
        ("scheduler-a", 10931, 0), ("scheduler-b", 11931, 0),
        ("metrics", 9464, 0), ("console", 8080, 0)]
    env = {s.name: dict(s.env) for s in specs}
    nameservers = "http://127.0.0.1:9876,http://127.0.0.1:9877"
    for name in ("nameserver-1", "nameserver-2"):
        assert env[name]["TIDEMQ_NAMESRV_PEERS"] == nameservers
        assert env[name]["TIDEMQ_NAMESRV_TOKEN"] == "tok"
    for letter, broker_port, scheduler_port, data_dir in (
            ("a", 10911, 10931, "broker"), ("b", 11911, 11931, "broker-b")):
        broker = env[f"broker-{letter}"]
        assert broker["TIDEMQ_BROKER_BROKER_NAME"] == f"broker-{letter}"
        assert broker["TIDEMQ_BROKER_NAMESERVERS"] == nameservers
        assert broker["TIDEMQ_BROKER_DATA_DIR"] == str(data / data_dir)
        assert broker["TIDEMQ_BROKER_SCHEDULER_URL"] == f"http://127.0.0.1:{scheduler_port}"
        for kind, prefix in (("checker", "TIDEMQ_CHECKER_"), ("scheduler", "TIDEMQ_SCHEDULER_")):
            sidecar = env[f"{kind}-{letter}"]
            assert sidecar[prefix + "BROKER_NAME"] == f"broker-{letter}"
            assert sidecar[prefix + "NAMESERVERS"] == nameservers
            assert sidecar[prefix + "BROKER_URL"] == f"http://127.0.0.1:{broker_port}"
            assert sidecar[prefix + "TOKEN"] == "tok"
    assert env["scheduler-a"]["TIDEMQ_SCHEDULER_DATA_DIR"] == str(data / "scheduler")
    assert env["scheduler-b"]["TIDEMQ_SCHEDULER_DATA_DIR"] == str(data / "scheduler-b")
    assert env["metrics"]["TIDEMQ_METRICS_NAMESERVERS"] == nameservers
    assert env["console"]["TIDEMQ_CONSOLE_NAMESERVERS"] == nameservers
    assert env["console"]["TIDEMQ_CONSOLE_SCHEDULERS"] == (
        "http://127.0.0.1:10931,http://127.0.0.1:11931")
    assert {s.group for s in specs if s.service == "checker"} == {"broker-a", "broker-b"}


def test_one_group_keeps_the_single_names_and_paths() -> None:
    specs = plan_services(UpOptions(), redis_url="redis://r", token="t", available=everything)
    assert [s.name for s in specs] == ["nameserver", "broker", "checker", "scheduler", "metrics",
                                       "console"]
    assert specs[1].env["TIDEMQ_BROKER_DATA_DIR"].endswith("/broker")
    assert specs[2].env["TIDEMQ_CHECKER_BROKER_NAME"] == "broker-a"


def test_base_ports_move_every_group_and_busy_grpc_stays_off() -> None:
    opts = UpOptions(broker_port=20000, checker_port=20010, scheduler_port=20020,
                     nameserver_port=30000, broker_grpc_port=40000, groups=3, nameservers=3,
                     grpc_off=frozenset({1}))
    specs = plan_services(opts, redis_url="redis://r", token="t", available=everything)
    ports = {s.name: (s.port, s.grpc_port) for s in specs}
    assert ports["nameserver-3"] == (30002, 0)
    assert ports["broker-a"] == (20000, 40000)
    assert ports["broker-b"] == (21000, 0)
    assert ports["broker-c"] == (22000, 40002)
    assert ports["scheduler-c"] == (22020, 0)
    broker_b = next(s for s in specs if s.name == "broker-b")
    assert broker_b.env["TIDEMQ_BROKER_GRPC_PORT"] == "0"
    assert [group_name(i) for i in (0, 1, 25)] == ["broker-a", "broker-b", "broker-z"]


@pytest.mark.parametrize(("opts", "message"), [
    (UpOptions(groups=0), "--groups must be 1 to 26"),
    (UpOptions(nameservers=10), "--nameservers must be 1 to 9"),
    (UpOptions(broker_port=64000, groups=3), "broker-c would listen on port 66000"),
    (UpOptions(checker_port=11911, groups=2), "checker-a and broker-b would both listen on "
                                              "port 11911"),
    (UpOptions(broker_grpc_port=9877, nameservers=2),
     "nameserver-2 and broker gRPC would both listen on port 9877"),
    (UpOptions(host="0.0.0.0"), "--host 0.0.0.0 binds every interface but names none"),
    (UpOptions(host="0.0.0.0", advertise_host="::"), "--advertise-host :: is not an address"),
])
def test_impossible_topologies_are_refused(opts: UpOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_services(opts, redis_url="redis://r", token="t", available=everything)


def test_skip_applies_to_every_group() -> None:
    opts = UpOptions(groups=2, skip=frozenset({"checker"}), metrics=False)
    specs = plan_services(opts, redis_url="redis://r", token="t", available=everything)
    assert [s.name for s in specs] == ["nameserver", "broker-a", "broker-b", "scheduler-a",
                                       "scheduler-b", "console"]


def test_bound_to_every_interface_each_service_advertises_the_given_host() -> None:
    opts = UpOptions(host="0.0.0.0", advertise_host="10.77.0.5", replicas=2)
    specs = plan_services(opts, redis_url="redis://r", token="t", available=everything)
    env = {s.name: dict(s.env) for s in specs}
    assert all(s.host == "0.0.0.0" for s in specs if s.service != "console")
    assert env["nameserver"]["TIDEMQ_NAMESRV_HOST"] == "0.0.0.0"
    assert env["nameserver"]["TIDEMQ_NAMESRV_ADVERTISED_ADDRESS"] == "http://10.77.0.5:9876"
    assert env["broker"]["TIDEMQ_BROKER_ADVERTISED_ADDRESS"] == "http://10.77.0.5:10911"
    assert env["broker-r1"]["TIDEMQ_BROKER_ADVERTISED_ADDRESS"] == "http://10.77.0.5:11011"
    assert env["broker-r1"]["TIDEMQ_BROKER_PRIMARY_ADDRESS"] == "http://10.77.0.5:10911"
    assert env["broker"]["TIDEMQ_BROKER_NAMESERVERS"] == "http://10.77.0.5:9876"
    assert env["checker"]["TIDEMQ_CHECKER_ADVERTISED_ADDRESS"] == "http://10.77.0.5:10921"
    assert env["checker"]["TIDEMQ_CHECKER_BROKER_URL"] == "http://10.77.0.5:10911"
    assert env["broker"]["TIDEMQ_BROKER_SCHEDULER_URL"] == "http://10.77.0.5:10931"
    assert specs[0].url == "http://10.77.0.5:9876"  # what `tidemq up` prints and probes
    # without --advertise-host nothing is added: every service advertises its bind host
    plain = plan_services(UpOptions(), redis_url="redis://r", token="t", available=everything)
    assert not any(k.endswith("ADVERTISED_ADDRESS") for s in plain for k in s.env)


def test_without_acl_the_console_stays_on_loopback_whatever_the_host() -> None:
    """It acts with full rights for whoever reaches it (issue 25 item 1); with ACL it binds the
    host like every service (a sign-in is asked)."""
    opts = UpOptions(host="0.0.0.0", advertise_host="10.77.0.5")
    [console] = [s for s in plan_services(opts, redis_url="redis://r", token="t",
                                          available=everything) if s.service == "console"]
    assert console.host == "127.0.0.1" and console.url == "http://127.0.0.1:8080"
    assert console.env["TIDEMQ_CONSOLE_HOST"] == "127.0.0.1"
    assert "TIDEMQ_CONSOLE_ADVERTISED_ADDRESS" not in console.env
    acl = {"ACL_FILE": "/acl.yaml", "ACCESS_KEY": "ak", "SECRET_KEY": "sk"}
    [guarded] = [s for s in plan_services(opts, redis_url="redis://r", token="t",
                                          available=everything, acl=acl)
                 if s.service == "console"]
    assert guarded.host == "0.0.0.0" and guarded.env["TIDEMQ_CONSOLE_HOST"] == "0.0.0.0"
