"""The CLI's settings file: named profiles, one per cluster.

The file is ``$TIDEMQ_CONFIG`` when set, else ``$XDG_CONFIG_HOME/tidemq/config.toml``
(``~/.config/tidemq/config.toml`` when ``XDG_CONFIG_HOME`` is unset)::

    default_profile = "local"          # used without --profile / TIDEMQ_PROFILE

    [profiles.local]
    nameserver = "http://127.0.0.1:9876"

    [profiles.prod]
    nameserver = ["https://ns1.example:9876", "https://ns2.example:9876"]  # or "a,b"
    broker = "https://broker-a.example:10911"
    access_key = "ops"
    secret_key = "..."
    ca = "~/.config/tidemq/prod-ca.pem"   # PEM bundle the services' certificates chain to
    timeout = 5                          # seconds to wait for each request
    token = "..."                        # cluster token, sent as X-Tidemq-Token

A setting comes from, first to last: the command-line option, its environment variable
(``TIDEMQ_NAMESERVER_URL``, ``TIDEMQ_BROKER_URL``, ``TIDEMQ_TIMEOUT``, ``TIDEMQ_ACCESS_KEY`` /
``TIDEMQ_SECRET_KEY``, ``TIDEMQ_TLS_CA``, ``TIDEMQ_TOKEN``), the chosen profile, the default.
Without ``default_profile`` a profile named ``default`` is used when there is one. No file and no
profile asked for: no profile. A bad file stops the command with one line naming the file and
the key (exit status 2).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemq_server.cli.errors import CONFIG, EXIT_USAGE

NAMESERVER_URL_ENV = "TIDEMQ_NAMESERVER_URL"  # --nameserver
BROKER_URL_ENV = "TIDEMQ_BROKER_URL"  # --broker
TIMEOUT_ENV = "TIDEMQ_TIMEOUT"  # --timeout (s)
CONFIG_ENV = "TIDEMQ_CONFIG"  # path of the settings file
PROFILE_ENV = "TIDEMQ_PROFILE"  # the profile to use (like --profile)
TOKEN_ENV = "TIDEMQ_TOKEN"  # cluster token (also what `tidemq up` gives its services)
XDG_CONFIG_HOME_ENV = "XDG_CONFIG_HOME"
#: Every variable the CLI reads (beside TIDEMQ_ACCESS_KEY / _SECRET_KEY, TIDEMQ_TLS_CA and
#: TIDEMQ_LOG_FORMAT, which other processes read too).
CLI_VARIABLES = (NAMESERVER_URL_ENV, BROKER_URL_ENV, TIMEOUT_ENV, CONFIG_ENV, "TIDEMQ_PROFILE",
                 "TIDEMQ_TOKEN")
CONFIG_RELATIVE = Path("tidemq") / "config.toml"  # under XDG_CONFIG_HOME (or ~/.config)
DEFAULT_PROFILE = "default"  # used when the file names no default_profile

_STRING_KEYS = ("broker", "access_key", "secret_key", "ca", "token")
_KEYS = (*_STRING_KEYS, "nameserver", "timeout")


class ConfigError(Exception):
    """The settings file (or the profile asked for) is unusable: one line naming file and key."""

    code = CONFIG
    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Profile:
    """One cluster's settings; empty fields are not set (the next source decides)."""

    name: str = ""  # "" = no profile
    source: str = ""  # the file it came from
    nameservers: tuple[str, ...] = ()
    broker: str = ""
    access_key: str = ""
    secret_key: str = ""
    ca: str = ""
    timeout_s: float | None = None
    token: str = ""


def config_path(env: Mapping[str, str]) -> Path:
    """Where the settings file is (it may not exist)."""
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]).expanduser()
    base = env.get(XDG_CONFIG_HOME_ENV) or str(Path("~/.config").expanduser())
    return Path(base) / CONFIG_RELATIVE


def load_profile(name: str | None, env: Mapping[str, str] | None = None) -> Profile:
    """The profile ``name`` (or the file's default) from the settings file; an empty Profile
    when there is no file and no profile was asked for. ConfigError when the file is bad."""
    env = os.environ if env is None else env
    path = config_path(env)
    explicit_file = bool(env.get(CONFIG_ENV))
    if not path.is_file():
        if explicit_file:
            raise ConfigError(f"{path}: no such file (named by {CONFIG_ENV})")
        if name:
            raise ConfigError(f"{path}: no such file, so there is no profile {name!r}")
        return Profile()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    return _choose(path, data, name)


def _choose(path: Path, data: dict[str, Any], name: str | None) -> Profile:
    for key in data:
        if key not in ("default_profile", "profiles"):
            raise ConfigError(f"{path}: unknown key {key!r} (expected default_profile and "
                              "[profiles.NAME] tables)")
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise ConfigError(f"{path}: profiles must be tables ([profiles.NAME])")
    checked: dict[str, Profile] = {}
    for key, table in profiles.items():  # every profile, so a bad file is found at once
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: profiles.{key} must be a table")
        checked[key] = _profile(path, key, table)
    default = data.get("default_profile")
    if default is not None and (not isinstance(default, str) or default not in profiles):
        raise ConfigError(f"{path}: default_profile {default!r} names no [profiles.NAME] table "
                          f"(profiles: {', '.join(profiles) or 'none'})")
    chosen = name or default or (DEFAULT_PROFILE if DEFAULT_PROFILE in profiles else None)
    if chosen is None:
        return Profile(source=str(path))
    if chosen not in profiles:
        raise ConfigError(f"{path}: no profile {chosen!r} (profiles: "
                          f"{', '.join(profiles) or 'none'})")
    return checked[chosen]


def _profile(path: Path, name: str, table: dict[str, Any]) -> Profile:
    where = f"{path}: profiles.{name}"
    for key in table:
        if key not in _KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(_KEYS)})")
    strings: dict[str, str] = {}
    for key in _STRING_KEYS:
        value = table.get(key, "")
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{key} must be a string, not {value!r}")
        strings[key] = value.strip()
    nameservers = _nameservers(where, table.get("nameserver", ()))
    timeout = table.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not math.isfinite(timeout) or timeout <= 0):
        raise ConfigError(f"{where}.timeout must be a positive number of seconds, "
                          f"not {timeout!r}")
    if bool(strings["access_key"]) != bool(strings["secret_key"]):
        missing = "secret_key" if strings["access_key"] else "access_key"
        raise ConfigError(f"{where}.{missing} is missing: an account needs both keys")
    for key in ("broker",):
        if strings[key] and not strings[key].startswith(("http://", "https://")):
            raise ConfigError(f"{where}.{key} must be a base URL like http://host:port, "
                              f"not {strings[key]!r}")
    return Profile(name=name, source=str(path), nameservers=nameservers,
                   broker=strings["broker"].rstrip("/"), access_key=strings["access_key"],
                   secret_key=strings["secret_key"],
                   ca=str(Path(strings["ca"]).expanduser()) if strings["ca"] else "",
                   timeout_s=float(timeout) if timeout is not None else None,
                   token=strings["token"])


def _nameservers(where: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    elif isinstance(value, list | tuple) and all(isinstance(u, str) for u in value):
        urls = [u.strip().rstrip("/") for u in value if u.strip()]
    else:
        raise ConfigError(f"{where}.nameserver must be a URL, a comma-separated string of URLs "
                          f"or a list of them, not {value!r}")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.nameserver: {url!r} is not a base URL like "
                              "http://host:9876")
    return tuple(urls)
