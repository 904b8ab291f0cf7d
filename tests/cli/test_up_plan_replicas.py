"""The plan of `tidemq up --replicas R` (pure): replica ports, names, data dirs, environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq_server.cli.plan import UpOptions, plan_services


def everything(_: str) -> bool:
    return True


def test_three_copies_in_two_groups(tmp_path: Path) -> None:
    opts = UpOptions(data_dir=tmp_path / "d", groups=2, replicas=3, metrics=False)
    specs = plan_services(opts, redis_url="redis://r", token="tok", available=everything)
    data = (tmp_path / "d").resolve()
    brokers = [(s.name, s.port, s.grpc_port) for s in specs if s.service == "broker"]
    assert brokers == [
        ("broker-a", 10911, 8081), ("broker-a-r1", 11011, 8181), ("broker-a-r2", 11111, 8281),
        ("broker-b", 11911, 8082), ("broker-b-r1", 12011, 8182), ("broker-b-r2", 12111, 8282)]
    env = {s.name: dict(s.env) for s in specs}
    assert env["broker-a"]["TIDEMQ_BROKER_REPLICAS"] == "3"
    assert "TIDEMQ_BROKER_BROKER_ID" not in env["broker-a"]
    replica = env["broker-b-r2"]
    assert replica["TIDEMQ_BROKER_BROKER_NAME"] == "broker-b"
    assert replica["TIDEMQ_BROKER_BROKER_ID"] == "2"
    assert replica["TIDEMQ_BROKER_REPLICAS"] == "3"
    assert replica["TIDEMQ_BROKER_PRIMARY_ADDRESS"] == "http://127.0.0.1:11911"
    assert replica["TIDEMQ_BROKER_DATA_DIR"] == str(data / "broker-b-r2")
    assert replica["TIDEMQ_BROKER_PORT"] == "12111"
    assert replica["TIDEMQ_BROKER_GRPC_PORT"] == "8282"  # every copy has a gRPC door
    assert {s.group for s in specs if s.service == "broker"} == {"broker-a", "broker-b"}
    # checkers and schedulers still talk to their group's primary
    assert env["checker-b"]["TIDEMQ_CHECKER_BROKER_URL"] == "http://127.0.0.1:11911"


def test_one_copy_plans_exactly_what_it_did() -> None:
    plain = plan_services(UpOptions(), redis_url="redis://r", token="t", available=everything)
    same = plan_services(UpOptions(replicas=1), redis_url="redis://r", token="t",
                         available=everything)
    assert plain == same
    assert not any("TIDEMQ_BROKER_REPLICAS" in s.env for s in plain)


def test_impossible_replica_counts_and_ports_are_refused() -> None:
    with pytest.raises(ValueError, match="--replicas must be 1 to 9"):
        plan_services(UpOptions(replicas=10), redis_url="r", token="t", available=everything)
    with pytest.raises(ValueError, match="both listen on port 11011"):
        plan_services(UpOptions(replicas=2, checker_port=11011), redis_url="r", token="t",
                      available=everything)


def test_replicas_serve_tls_and_load_the_accounts_file_like_their_primary(tmp_path: Path,
                                                                         ) -> None:
    opts = UpOptions(data_dir=tmp_path / "d", replicas=2, metrics=False, tls=True)
    specs = plan_services(opts, redis_url="redis://r", token="tok", available=everything,
                          acl={"ACL_FILE": "/acl.yaml"})
    by_name = {s.name: s for s in specs}
    primary, replica = by_name["broker"], by_name["broker-r1"]
    assert replica.tls and replica.url == "https://127.0.0.1:11011"  # the supervisor probes it
    assert replica.env["TIDEMQ_BROKER_PRIMARY_ADDRESS"] == "https://127.0.0.1:10911"
    for key in ("TIDEMQ_BROKER_TLS_CERT", "TIDEMQ_BROKER_TLS_KEY", "TIDEMQ_BROKER_ACL_FILE"):
        assert replica.env[key] == primary.env[key]
