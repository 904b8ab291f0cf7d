"""Settings base: one pydantic-settings object per service, each with its own env prefix."""

from __future__ import annotations

from typing import Annotated, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tidemq_server.common.constants import BROKER_PORT, LOG_FORMAT_ENV, WILDCARD_HOSTS
from tidemq_server.common.discovery import BrokerResolver, split_urls
from tidemq_server.common.logs import check_format, check_level
from tidemq_server.common.redis import validate_redis_url
from tidemq_server.common.tls import ServerTls, scheme, server_tls

# redis://host:port/db, or redis+sentinel://host1:26379,host2:26379/master-name/db (see
# services/common/redis.py and docs/operations.md)
RedisUrl = Annotated[str, AfterValidator(validate_redis_url)]
# critical, error, warning, info or debug (any case); anything else stops the service at start
LogLevel = Annotated[str, BeforeValidator(check_level)]
# text or json (services/common/logs.py)
LogFormat = Annotated[str, BeforeValidator(check_format)]


class ServiceSettings(BaseSettings):
    """Fields every service has. Subclasses set ``model_config`` with their env prefix."""

    model_config = SettingsConfigDict(env_prefix="TIDEMQ_", extra="ignore")

    host: str = "127.0.0.1"  # bind address; loopback until ACL exists
    port: int = 0  # listen port (each service sets its default)
    # base URL the others use to reach this service, e.g. http://10.0.0.5:10911 ("" =
    # {scheme}://{host}:{port}); needed when host is a wildcard (0.0.0.0, ::) on a service
    # whose address is handed to others (a broker: routes, replication, its etcd claim)
    advertised_address: str = ""
    cluster: str = "DefaultCluster"  # namespaces Redis keys and registrations
    token: str = ""  # shared cluster token for /internal/ endpoints ("" = none required)
    # accounts and rules (YAML, docs/operations.md "Accounts and ACL"); "" = ACL off
    acl_file: str = ""
    access_key: str = ""  # this service's account, signing its calls to the others ("" = none)
    secret_key: str = ""  # that account's secret key
    log_level: LogLevel = "info"
    # log line format, text or json: one variable for every service, TIDEMQ_LOG_FORMAT
    log_format: LogFormat = Field(default="text", validation_alias=LOG_FORMAT_ENV)
    # HTTPS (and TLS on a broker's gRPC door) with this certificate chain and private key (PEM
    # files; both or neither; "" = plain HTTP). Clients verify it against TIDEMQ_TLS_CA.
    tls_cert: str = ""
    tls_key: str = ""

    @model_validator(mode="after")
    def _validate_tls_pair(self) -> Self:
        if bool(self.tls_cert) != bool(self.tls_key):
            missing = "tls_cert" if not self.tls_cert else "tls_key"
            raise ValueError(f"TLS needs both a certificate and its key: {missing} is not set")
        return self

    @field_validator("advertised_address")
    @classmethod
    def _check_advertised(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and (urlsplit(value).scheme not in ("http", "https")
                      or not urlsplit(value).hostname):
            raise ValueError(f"advertised_address {value!r} is not a base URL like "
                             "http://10.0.0.5:10911")
        if value and urlsplit(value).hostname in WILDCARD_HOSTS:
            raise ValueError(f"advertised_address {value!r} names no host others can reach")
        return value

    @property
    def public_url(self) -> str:
        """The base URL others use to reach this service (``advertised_address``, or the bind
        host and port; a wildcard bind then says loopback: reachable from this host only)."""
        if self.advertised_address:
            return self.advertised_address
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        host = f"[{host}]" if ":" in host else host
        return f"{scheme(self.tls)}://{host}:{self.port}"

    @property
    def public_host(self) -> str:
        """The host of ``public_url``."""
        return urlsplit(self.public_url).hostname or "127.0.0.1"

    @property
    def tls(self) -> bool:
        """True when the service serves HTTPS (a certificate and key are set)."""
        return bool(self.tls_cert)

    def server_tls(self) -> ServerTls | None:
        """The loaded certificate and key, or None for plain HTTP (ValueError naming a bad
        file)."""
        return server_tls(self.tls_cert, self.tls_key)


class GroupServiceSettings(ServiceSettings):
    """Fields of a service that serves one broker group (checker, scheduler): the group is found
    through the nameservers by ``broker_name``, or is the fixed ``broker_url`` when no
    nameservers are given. Subclasses set ``model_config`` with their env prefix."""

    broker_url: str = f"http://127.0.0.1:{BROKER_PORT}"  # fixed broker (no nameservers given)
    broker_name: str = ""  # the group served, found through the nameservers by this name
    nameservers: str = ""  # comma-separated nameserver base URLs ("" = use broker_url)

    @field_validator("broker_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @model_validator(mode="after")
    def _validate_group(self) -> Self:
        if self.nameserver_urls and not self.broker_name:
            raise ValueError("nameservers are set but broker_name is not: name the broker group "
                             "this service serves (e.g. broker-a)")
        return self

    @property
    def nameserver_urls(self) -> list[str]:
        return split_urls(self.nameservers)

    def resolver(self) -> BrokerResolver:
        """The group's address: through the nameservers, or the fixed ``broker_url``."""
        return BrokerResolver(self.broker_name, self.nameserver_urls, self.broker_url)
