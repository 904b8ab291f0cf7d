"""docs/operations.md against the code: every setting of every service is documented under its
environment variable (and no variable is documented that no service reads), and every Redis key
the services build appears in the key table."""

from __future__ import annotations

import inspect
import re

from pydantic_settings import BaseSettings
from tidemq._constants import TLS_CA_ENV
from tidemq.protocol.signing import ACCESS_KEY_ENV, SECRET_KEY_ENV

from tests.support.procs import REPO
from tidemq_server.broker.settings import BrokerSettings
from tidemq_server.checker.settings import CheckerSettings
from tidemq_server.cli.config import CLI_VARIABLES
from tidemq_server.common import constants
from tidemq_server.common.settings import ServiceSettings
from tidemq_server.console.settings import ConsoleSettings
from tidemq_server.metrics.settings import MetricsSettings
from tidemq_server.nameserver.settings import NameserverSettings
from tidemq_server.scheduler.settings import SchedulerSettings

DOC = (REPO / "docs" / "operations.md").read_text()
SERVICES: list[type[BaseSettings]] = [NameserverSettings, BrokerSettings, CheckerSettings,
                                      SchedulerSettings, MetricsSettings, ConsoleSettings]
# a common setting read under one variable for every service (TIDEMQ_LOG_FORMAT): as is
ALIASED = {name: str(f.validation_alias) for name, f in ServiceSettings.model_fields.items()
           if isinstance(f.validation_alias, str)}
COMMON = set(ServiceSettings.model_fields) - set(ALIASED)  # documented once, as `…HOST` etc.
VARIABLE = re.compile(r"`(TIDEMQ_[A-Z]+_[A-Z0-9_]+)`")


def env_vars() -> set[str]:
    out = set()
    for cls in SERVICES:
        prefix = str(cls.model_config["env_prefix"])
        out |= {ALIASED.get(name, prefix + name.upper()) for name in cls.model_fields}
    return out


def test_every_setting_is_documented() -> None:
    missing = sorted(v for v in env_vars()
                     if f"`{v}`" not in DOC and v.split("_", 2)[2].lower() not in COMMON)
    assert not missing, "settings missing from docs/operations.md: " + ", ".join(missing)
    for field in COMMON:
        assert f"`…{field.upper()}`" in DOC, f"common setting {field} is not documented"
    for variable in ALIASED.values():
        assert f"`{variable}`" in DOC, f"common setting {variable} is not documented"


def test_every_documented_variable_is_read_by_a_service() -> None:
    known = env_vars() | {TLS_CA_ENV}  # read by every client in a process (the SDK)
    known |= {*CLI_VARIABLES, ACCESS_KEY_ENV, SECRET_KEY_ENV}  # the CLI's
    stale = sorted(v for v in set(VARIABLE.findall(DOC)) if v not in known)
    assert not stale, "docs/operations.md names variables no service reads: " + ", ".join(stale)


def test_every_redis_key_is_in_the_key_table() -> None:
    at = ("{cluster}", "{broker_name}")  # consumer state is per broker
    keys = {
        "consumer_offsets_key": constants.consumer_offsets_key(*at, "{group}", "{topic}"),
        "consumer_offsets_index_key": constants.consumer_offsets_index_key(*at, "{group}"),
        "inflight_key": constants.inflight_key(*at, "{group}", "{topic}"),
        "receive_cursor_key": constants.receive_cursor_key(*at, "{group}", "{topic}"),
        "checker_progress_key": constants.checker_progress_key("{cluster}", "{broker_name}"),
        "scheduler_progress_key": constants.scheduler_progress_key("{cluster}", "{broker_name}"),
        "scheduler_level_cancels_key": constants.scheduler_level_cancels_key("{cluster}",
                                                                             "{broker_name}"),
        "scheduler_rebuild_key": constants.scheduler_rebuild_key("{cluster}", "{broker_name}"),
    }
    builders = {name for name, fn in inspect.getmembers(constants, inspect.isfunction)
                if name.endswith("_key") and name != "service_progress_key"}
    assert builders == set(keys), "a Redis key builder is not covered here (and in the docs)"
    missing = [key for key in keys.values() if f"`{key}`" not in DOC]
    assert not missing, f"Redis keys missing from docs/operations.md: {missing}"
