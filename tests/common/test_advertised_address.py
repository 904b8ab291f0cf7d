"""Bind host and advertised address, as settings of every service: a broker bound to every
interface must be told the address to advertise (it advertised http://127.0.0.1 to other hosts:
copies on other hosts followed loopback), and everything it hands out follows that address."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.checker.settings import CheckerSettings
from tidemq_server.console.settings import ConsoleSettings
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.nameserver.settings import NameserverSettings
from tidemq_server.scheduler.settings import SchedulerSettings


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_broker_bound_to_every_interface_needs_an_advertised_address(host: str) -> None:
    with pytest.raises(ValidationError) as err:
        BrokerSettings(host=host, port=10911)
    assert "TIDEMQ_BROKER_ADVERTISED_ADDRESS" in str(err.value)


def test_everything_a_broker_hands_out_follows_its_advertised_address() -> None:
    s = BrokerSettings(host="0.0.0.0", port=10911, grpc_port=8081,
                       advertised_address="http://10.77.0.11:10911/")
    assert s.address == "http://10.77.0.11:10911"  # routes, replication, the etcd claim
    assert s.grpc_address == "10.77.0.11:8081"  # gRPC routes
    assert s.store_host == "10.77.0.11:10911"  # recorded in every stored record
    bound = BrokerSettings(host="10.77.0.12", port=10911, grpc_port=8081)
    assert (bound.address, bound.grpc_address) == ("http://10.77.0.12:10911", "10.77.0.12:8081")


@pytest.mark.parametrize("bad", ["10.0.0.5:10911", "ftp://h:1", "http://0.0.0.0:10911"])
def test_an_advertised_address_must_be_a_reachable_base_url(bad: str) -> None:
    with pytest.raises(ValidationError) as err:
        BrokerSettings(host="0.0.0.0", advertised_address=bad)
    assert "advertised_address" in str(err.value)


@pytest.mark.parametrize("cls", [NameserverSettings, CheckerSettings, SchedulerSettings,
                                 MetricsSettings, ConsoleSettings])
def test_every_service_has_a_bind_host_and_an_advertised_address(
        cls: type[NameserverSettings], monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = cls.model_config["env_prefix"]
    monkeypatch.setenv(f"{prefix}HOST", "0.0.0.0")
    monkeypatch.setenv(f"{prefix}PORT", "4321")
    # the console leaves loopback only with ACL on (services/console/settings.py)
    monkeypatch.setenv(f"{prefix}ACL_FILE", "/etc/tidemq/acl.yaml")
    assert cls().public_url == "http://127.0.0.1:4321"  # wildcard, nothing advertised
    monkeypatch.setenv(f"{prefix}ADVERTISED_ADDRESS", "http://10.77.0.15:4321")
    s = cls()
    assert (s.host, s.public_url, s.public_host) == ("0.0.0.0", "http://10.77.0.15:4321",
                                                     "10.77.0.15")
