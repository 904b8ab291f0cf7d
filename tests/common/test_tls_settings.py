"""TLS settings: both files or neither, loaded at start with errors naming the file; brokers
advertise https://; `tidemq up --tls` plans TLS for every service; the SDK's CA bundle."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError
from tidemq import ConfigurationError, use_ca_bundle
from tidemq._http import shared_ssl_context

from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.cli.certs import DevPki, ensure_dev_pki
from tidemq_server.cli.plan import ENV_PREFIX, UpOptions, plan_services
from tidemq_server.common.tls import server_tls
from tidemq_server.nameserver.settings import NameserverSettings


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return ensure_dev_pki(tmp_path_factory.mktemp("pki"))


def test_a_certificate_needs_its_key(pki: DevPki) -> None:
    with pytest.raises(ValidationError, match="tls_key is not set"):
        NameserverSettings(tls_cert=str(pki.cert))
    with pytest.raises(ValidationError, match="tls_cert is not set"):
        NameserverSettings(tls_key=str(pki.key))
    assert NameserverSettings().server_tls() is None  # neither: plain HTTP
    settings = NameserverSettings(tls_cert=str(pki.cert), tls_key=str(pki.key))
    tls = settings.server_tls()
    assert tls is not None and settings.tls
    assert tls.uvicorn_options() == {"ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.key)}


def test_bad_files_stop_the_service_naming_the_file(pki: DevPki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not found: .*missing\.pem"):
        server_tls(str(tmp_path / "missing.pem"), str(pki.key))
    other = ensure_dev_pki(tmp_path / "other")
    with pytest.raises(ValueError, match="cannot load the TLS certificate"):
        server_tls(str(pki.cert), str(other.key))  # a key that is not the certificate's


def test_a_tls_broker_advertises_https(pki: DevPki) -> None:
    plain = BrokerSettings(port=10999)
    assert plain.address == "http://127.0.0.1:10999"
    tls = BrokerSettings(port=10999, tls_cert=str(pki.cert), tls_key=str(pki.key))
    assert tls.address == "https://127.0.0.1:10999"
    named = BrokerSettings(port=10999, tls_cert=str(pki.cert), tls_key=str(pki.key),
                           advertised_address="https://broker-a.example:443/")
    assert named.address == "https://broker-a.example:443"


def test_up_tls_plans_tls_for_every_service(tmp_path: Path) -> None:
    opts = UpOptions(data_dir=tmp_path, tls=True, groups=2, nameservers=2)
    specs = plan_services(opts, redis_url="redis://127.0.0.1:1/0", token="t",
                          available=lambda module: True)
    tls_dir = tmp_path.resolve() / "tls"
    assert {s.service for s in specs} == set(ENV_PREFIX)
    for spec in specs:
        prefix = ENV_PREFIX[spec.service]
        assert spec.env[prefix + "TLS_CERT"] == str(tls_dir / "server.pem")
        assert spec.env[prefix + "TLS_KEY"] == str(tls_dir / "server.key")
        assert spec.env["TIDEMQ_TLS_CA"] == str(tls_dir / "ca.pem")
        assert spec.url.startswith("https://") and spec.health_url.startswith("https://")
        urls = [u for v in spec.env.values() for u in v.split(",") if "://" in u
                and not u.startswith("redis://")]
        assert all(u.startswith("https://") for u in urls), (spec.name, urls)
    plain = plan_services(UpOptions(data_dir=tmp_path), redis_url="redis://127.0.0.1:1/0",
                          token="t", available=lambda module: True)
    assert all(not any("TLS" in k for k in s.env) and s.url.startswith("http://")
               for s in plain)


def test_the_sdk_trusts_the_ca_bundle_it_is_given(pki: DevPki,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    def subjects(context: ssl.SSLContext) -> list[str]:
        return [str(c.get("subject")) for c in context.get_ca_certs()]

    try:
        monkeypatch.setenv("TIDEMQ_TLS_CA", str(pki.ca))
        use_ca_bundle(None)
        from_env = shared_ssl_context()
        assert any("tidemq development CA" in s for s in subjects(from_env))
        assert shared_ssl_context() is from_env  # one per process
        assert from_env.verify_mode == ssl.CERT_REQUIRED and from_env.check_hostname
        monkeypatch.delenv("TIDEMQ_TLS_CA")
        use_ca_bundle(None)
        assert not any("tidemq development CA" in s for s in subjects(shared_ssl_context()))
        use_ca_bundle(str(tmp_path / "nope.pem"))
        with pytest.raises(ConfigurationError, match=r"nope\.pem"):
            shared_ssl_context()
    finally:
        use_ca_bundle(None)
