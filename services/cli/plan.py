"""What `tidemq up` starts, in which order, with which environment: pure functions, no I/O.

Each service reads its settings from environment variables with its own prefix; this module is
the one place that spells the variables the CLI passes to each of them.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.constants import (
    BROKER_GRPC_PORT,
    BROKER_PORT,
    CHECKER_PORT,
    METRICS_PORT,
    NAMESERVER_PORT,
    SCHEDULER_PORT,
)

# Start order; stopped in reverse. The first two are required, the rest start when present.
SERVICE_ORDER = ("nameserver", "broker", "checker", "scheduler", "metrics")
REQUIRED_SERVICES = frozenset({"nameserver", "broker"})

ENV_PREFIX = {
    "nameserver": "TIDEMQ_NAMESRV_",
    "broker": "TIDEMQ_BROKER_",
    "checker": "TIDEMQ_CHECKER_",
    "scheduler": "TIDEMQ_SCHEDULER_",
    "metrics": "TIDEMQ_METRICS_",
}


@dataclass(frozen=True)
class UpOptions:
    """The options of `tidemq up`, with the defaults of every service."""

    data_dir: Path = Path(".tidemq")
    host: str = "127.0.0.1"
    cluster: str = "DefaultCluster"
    nameserver_port: int = NAMESERVER_PORT
    broker_port: int = BROKER_PORT
    broker_grpc_port: int = BROKER_GRPC_PORT  # RocketMQ 5 clients (gRPC); 0 = off
    checker_port: int = CHECKER_PORT
    scheduler_port: int = SCHEDULER_PORT
    metrics_port: int = METRICS_PORT
    flush: str = "async"  # broker flush mode: async or sync
    metrics: bool = True  # start the PySpark metrics sidecar (slow to start)
    skip: frozenset[str] = frozenset()  # services not to start (e.g. run one in a debugger)


@dataclass(frozen=True)
class ServiceSpec:
    """One child process: ``python -m <module>`` with ``env`` added to the inherited env."""

    name: str
    module: str
    host: str
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    grpc_port: int = 0  # the broker's gRPC front door (0 = none)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def shown_url(self) -> str:
        """The URL as `tidemq up` prints it: with the gRPC port (same host) when there is one,
        kept short so that the endpoints table fits 80 columns."""
        return f"{self.url} grpc:{self.grpc_port}" if self.grpc_port else self.url

    @property
    def health_url(self) -> str:
        return f"{self.url}/healthz"

    @property
    def docs_url(self) -> str:
        return f"{self.url}/docs"

    def command(self, python: str) -> list[str]:
        return [python, "-m", self.module]


def module_available(module: str) -> bool:
    """True when ``python -m module`` can run: the package exists and has a ``__main__``.

    Looks at files only; nothing is imported (an empty directory is not a service).
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(loc) / "__main__.py").is_file() for loc in spec.submodule_search_locations)


TOKEN_FILE = "token"  # under the data dir: the cluster token kept across runs (mode 0600)


def resolve_token(env: Mapping[str, str], stored: str | None = None) -> str:
    """The cluster's shared token: TIDEMQ_TOKEN when set, else the one kept in the data dir
    (``stored``), else a fresh random one."""
    return env.get("TIDEMQ_TOKEN") or stored or secrets.token_hex(16)


def needs_managed_redis(env: Mapping[str, str]) -> bool:
    return not env.get("REDIS_URL")


def service_port(opts: UpOptions, name: str) -> int:
    return int(getattr(opts, f"{name}_port"))


def plan_services(opts: UpOptions, *, redis_url: str, token: str,
                  available: Callable[[str], bool] = module_available) -> list[ServiceSpec]:
    """The services to start, in start order, each with the environment it needs.

    Raises ``LookupError`` when a required service (nameserver, broker) cannot be run.
    """
    data_dir = opts.data_dir.resolve()
    wanted = [n for n in SERVICE_ORDER
              if n not in opts.skip and (opts.metrics or n != "metrics")]
    names: list[str] = []
    for name in wanted:
        if available(f"services.{name}"):
            names.append(name)
        elif name in REQUIRED_SERVICES:
            raise LookupError(f"services.{name} cannot be run (no services/{name}/__main__.py)")
    url = {n: f"http://{opts.host}:{service_port(opts, n)}" for n in SERVICE_ORDER}

    def common(name: str) -> dict[str, str]:
        return {"HOST": opts.host, "PORT": str(service_port(opts, name)),
                "CLUSTER": opts.cluster}

    specific: dict[str, dict[str, str]] = {
        "nameserver": {"TOKEN": token},  # brokers register with it
        "broker": {
            "NAMESERVERS": url["nameserver"],
            "REDIS_URL": redis_url,
            "DATA_DIR": str(data_dir / "broker"),
            "TOKEN": token,
            "FLUSH": opts.flush,
        },
    }
    for sidecar in ("checker", "scheduler", "metrics"):
        specific[sidecar] = {"BROKER_URL": url["broker"], "REDIS_URL": redis_url, "TOKEN": token}
    specific["scheduler"]["DATA_DIR"] = str(data_dir / "scheduler")
    specific["metrics"]["DATA_DIR"] = str(data_dir / "metrics")
    # Always explicit, so the port printed is the one the broker binds (never an inherited one).
    specific["broker"]["GRPC_PORT"] = str(opts.broker_grpc_port)
    if "scheduler" in names:  # the broker answers cancel and /v1/scheduled by asking it
        specific["broker"]["SCHEDULER_URL"] = url["scheduler"]

    return [
        ServiceSpec(name=name, module=f"services.{name}", host=opts.host,
                    port=service_port(opts, name),
                    env={ENV_PREFIX[name] + k: v
                         for k, v in {**common(name), **specific[name]}.items()},
                    grpc_port=opts.broker_grpc_port if name == "broker" else 0)
        for name in names
    ]


def redis_command(exe: str, port: int, host: str, data_dir: Path) -> list[str]:
    """A managed redis-server: append-only file under the data dir, no RDB snapshots."""
    return [exe, "--port", str(port), "--bind", host, "--dir", str(data_dir),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--protected-mode", "no", "--daemonize", "no"]


def child_env(spec: ServiceSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full environment of a child: ours, plus the spec's variables, unbuffered output."""
    return {**(os.environ if base is None else base), **spec.env, "PYTHONUNBUFFERED": "1"}
