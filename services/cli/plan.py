"""What `tidemq up` starts, in which order, with which environment: pure functions, no I/O.

Each service reads its settings from environment variables with its own prefix; this module is
the one place that spells the variables the CLI passes to each of them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tidemq._constants import TLS_CA_ENV

from tidemq_server.cli.certs import CA_FILE, CERT_FILE, KEY_FILE
from tidemq_server.common.constants import (
    BROKER_GRPC_PORT,
    BROKER_PORT,
    CHECKER_PORT,
    CONSOLE_PORT,
    ETCD_PORT,
    LOOPBACK_HOSTS,
    METRICS_PORT,
    NAMESERVER_PORT,
    SCHEDULER_PORT,
    WILDCARD_HOSTS,
)

# Start order by kind; stopped in reverse. The first two are required, the rest start when
# present. Several broker groups start every broker, then every checker, then every scheduler.
SERVICE_ORDER = ("nameserver", "broker", "checker", "scheduler", "metrics", "console")
REQUIRED_SERVICES = frozenset({"nameserver", "broker"})
GROUP_SERVICES = ("broker", "checker", "scheduler")  # one of each per broker group

ENV_PREFIX = {
    "nameserver": "TIDEMQ_NAMESRV_",
    "broker": "TIDEMQ_BROKER_",
    "checker": "TIDEMQ_CHECKER_",
    "scheduler": "TIDEMQ_SCHEDULER_",
    "metrics": "TIDEMQ_METRICS_",
    "console": "TIDEMQ_CONSOLE_",
}

# Predictable ports of a cluster on one host: group i (0-based) serves REST on the base port +
# GROUP_PORT_STEP * i (broker 10911, 11911, ...; checker 10921, 11921, ...; scheduler 10931,
# 11931, ...) and gRPC on the base gRPC port + i (8081, 8082, ...); nameserver j listens on the
# base nameserver port + j (9876, 9877, ...).
GROUP_PORT_STEP = 1000
GRPC_PORT_STEP = 1
NAMESERVER_PORT_STEP = 1
MAX_GROUPS = 26  # broker-a … broker-z
MAX_NAMESERVERS = 9
# With --replicas R, replica j (broker_id 1 … R-1) of group i serves REST on the group's broker
# port + REPLICA_PORT_STEP * j (10911 → 11011, 11111; group b 11911 → 12011, …) and gRPC on the
# group's gRPC port + REPLICA_GRPC_PORT_STEP * j (8081 → 8181, 8281; group b 8082 → 8182, …): a
# replica promoted by a failover serves RocketMQ 5 clients at once, and until then its door
# names the group's primary in routes.
REPLICA_PORT_STEP = 100
REPLICA_GRPC_PORT_STEP = 100
MAX_REPLICAS = 9


LOOPBACK = "127.0.0.1"  # where the console binds without ACL, whatever --host says


def group_name(index: int) -> str:
    """The broker name of group ``index`` (0-based): broker-a, broker-b, …"""
    return f"broker-{chr(ord('a') + index)}"


@dataclass(frozen=True)
class UpOptions:
    """The options of `tidemq up`, with the defaults of every service."""

    data_dir: Path = Path(".tidemq")
    host: str = "127.0.0.1"  # every service binds it
    # every service advertises it (its ADVERTISED_ADDRESS) and the others reach it there
    # ("" = host; required when host is a wildcard such as 0.0.0.0)
    advertise_host: str = ""
    cluster: str = "DefaultCluster"
    nameserver_port: int = NAMESERVER_PORT  # of the first nameserver
    broker_port: int = BROKER_PORT  # of the first group's broker
    broker_grpc_port: int = BROKER_GRPC_PORT  # RocketMQ 5 clients (gRPC); 0 = off
    checker_port: int = CHECKER_PORT
    scheduler_port: int = SCHEDULER_PORT
    metrics_port: int = METRICS_PORT
    console_port: int = CONSOLE_PORT  # the web console
    flush: str = "async"  # broker flush mode: async or sync
    metrics: bool = True  # start the PySpark metrics sidecar (slow to start)
    skip: frozenset[str] = frozenset()  # services not to start (e.g. run one in a debugger)
    groups: int = 1  # broker groups: one broker, checker and scheduler each
    nameservers: int = 1
    grpc_off: frozenset[int] = frozenset()  # groups whose gRPC door stays off (port busy)
    etcd_port: int = ETCD_PORT  # client port of the etcd started for replicated groups
    replicas: int = 1  # copies of each group's log (1 = no replication)

    def replica_port(self, index: int, broker_id: int) -> int:
        """REST port of group ``index``'s member ``broker_id`` (0 = the primary)."""
        return self.group_port("broker", index) + REPLICA_PORT_STEP * broker_id

    def replica_grpc_port(self, index: int, broker_id: int) -> int:
        """gRPC port of group ``index``'s member ``broker_id``; 0 when the group has none."""
        base = self.grpc_port(index)
        return base + REPLICA_GRPC_PORT_STEP * broker_id if base else 0

    def replica_label(self, index: int, broker_id: int) -> str:
        """``broker-r1``, ``broker-b-r2``, …: a replica's name in the output and its log."""
        return f"{self.label('broker', index)}-r{broker_id}"

    tls: bool = False  # every service serves TLS with the development CA's certificate

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def public_host(self) -> str:
        """The host the services reach each other at (and advertise)."""
        return self.advertise_host or self.host

    @property
    def tls_dir(self) -> Path:
        """Where `tidemq up --tls` keeps the development CA and certificate."""
        return self.data_dir.resolve() / TLS_DIR

    def nameserver_ports(self) -> list[int]:
        return [self.nameserver_port + NAMESERVER_PORT_STEP * j
                for j in range(self.nameservers)]

    def nameserver_urls(self) -> list[str]:
        return [f"{self.scheme}://{self.public_host}:{port}"
                for port in self.nameserver_ports()]

    def group_port(self, kind: str, index: int) -> int:
        """Port of group ``index``'s broker, checker or scheduler."""
        return service_port(self, kind) + GROUP_PORT_STEP * index

    def grpc_port(self, index: int) -> int:
        """Port of group ``index``'s gRPC door; 0 = off."""
        if self.broker_grpc_port == 0 or index in self.grpc_off:
            return 0
        return self.broker_grpc_port + GRPC_PORT_STEP * index

    def label(self, kind: str, index: int) -> str:
        """A service's name in the output and its log file: the kind alone for a single
        instance (``broker``), else per group (``broker-b``, ``checker-b``) or per nameserver
        (``nameserver-2``)."""
        if kind == "nameserver":
            return kind if self.nameservers == 1 else f"{kind}-{index + 1}"
        if kind in GROUP_SERVICES and self.groups > 1:
            return f"{kind}-{group_name(index)[len('broker-'):]}"
        return kind

    def data_subdir(self, kind: str, index: int) -> str:
        """Where group ``index``'s broker or scheduler keeps its files, under the data dir.
        The first group keeps the one-group paths (``broker``, ``scheduler``), so its data
        stays where it was when the group count changes; the others add their broker name's
        letter (``broker-b``, ``scheduler-b``)."""
        return kind if index == 0 else f"{kind}-{group_name(index)[len('broker-'):]}"


@dataclass(frozen=True)
class ServiceSpec:
    """One child process: ``python -m <module>`` with ``env`` added to the inherited env."""

    name: str  # label: nameserver, broker, … or nameserver-2, broker-b, checker-b, …
    module: str
    host: str  # bind host
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    grpc_port: int = 0  # the broker's gRPC front door (0 = none)
    kind: str = ""  # nameserver, broker, checker, scheduler or metrics ("" = from the module)
    group: str = ""  # broker name of its group (brokers, checkers, schedulers)
    tls: bool = False  # serves HTTPS (and TLS on the gRPC door)
    public_host: str = ""  # the host it advertises and is reached at ("" = host)

    @property
    def service(self) -> str:
        return self.kind or self.module.rsplit(".", 1)[-1]

    @property
    def url(self) -> str:
        host = self.public_host or self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

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
LOCK_FILE = "up.lock"  # under the data dir: locked (flock) by the running `tidemq up`, its pid
# under the data dir: `tidemq up --tls`'s CA and certificate (tidemq_server.cli.certs)
TLS_DIR = "tls"


def resolve_token(env: Mapping[str, str], stored: str | None = None) -> str:
    """The cluster's shared token: TIDEMQ_TOKEN when set, else the one kept in the data dir
    (``stored``), else a fresh random one."""
    return env.get("TIDEMQ_TOKEN") or stored or secrets.token_hex(16)


def service_port(opts: UpOptions, name: str) -> int:
    return int(getattr(opts, f"{name}_port"))


def validate_topology(opts: UpOptions) -> None:
    """Raise ``ValueError`` naming the problem when the group or nameserver counts or the ports
    they imply are impossible (out of range, or two services on one port)."""
    if opts.host in WILDCARD_HOSTS and not opts.advertise_host:
        raise ValueError(f"--host {opts.host or repr('')} binds every interface but names none: "
                         "give the address the services reach each other at with "
                         "--advertise-host (e.g. --advertise-host 10.0.0.5)")
    if opts.advertise_host in WILDCARD_HOSTS and opts.advertise_host:
        raise ValueError(f"--advertise-host {opts.advertise_host} is not an address others "
                         "can reach")
    if not 1 <= opts.groups <= MAX_GROUPS:
        raise ValueError(f"--groups must be 1 to {MAX_GROUPS}, got {opts.groups}")
    if not 1 <= opts.replicas <= MAX_REPLICAS:
        raise ValueError(f"--replicas must be 1 to {MAX_REPLICAS}, got {opts.replicas}")
    if not 1 <= opts.nameservers <= MAX_NAMESERVERS:
        raise ValueError(f"--nameservers must be 1 to {MAX_NAMESERVERS}, got {opts.nameservers}")
    owners: dict[int, str] = {}
    for _, name, port in planned_ports(opts):
        if not 1 <= port <= 65535:
            raise ValueError(f"{name} would listen on port {port}: choose lower base ports "
                             "(--broker-port, --checker-port, --scheduler-port, --grpc-port, "
                             "--nameserver-port) or fewer groups")
        if port in owners:
            raise ValueError(f"{owners[port]} and {name} would both listen on port {port}: "
                             f"group i adds {GROUP_PORT_STEP}*i to the REST ports and "
                             f"{GRPC_PORT_STEP}*i to the gRPC port; choose other base ports")
        owners[port] = name


def planned_ports(opts: UpOptions) -> list[tuple[str, str, int]]:
    """``(kind, name, port)`` of every port the services of ``opts`` listen on, skipped ones
    included; ``kind`` is the service, or ``grpc`` for a broker's gRPC door."""
    ports = [("nameserver", opts.label("nameserver", j), p)
             for j, p in enumerate(opts.nameserver_ports())]
    for i in range(opts.groups):
        ports += [(kind, opts.label(kind, i), opts.group_port(kind, i))
                  for kind in GROUP_SERVICES]
        ports += [("broker", opts.replica_label(i, j), opts.replica_port(i, j))
                  for j in range(1, opts.replicas)]
        if opts.grpc_port(i):
            ports.append(("grpc", f"{opts.label('broker', i)} gRPC", opts.grpc_port(i)))
            ports += [("grpc", f"{opts.replica_label(i, j)} gRPC", opts.replica_grpc_port(i, j))
                      for j in range(1, opts.replicas)]
    ports.append(("metrics", "metrics", opts.metrics_port))
    ports.append(("console", "console", opts.console_port))
    return ports


def plan_services(opts: UpOptions, *, redis_url: str, token: str,
                  available: Callable[[str], bool] = module_available,
                  acl: Mapping[str, str] | None = None) -> list[ServiceSpec]:
    """The services to start, in start order, each with the environment it needs.

    ``acl`` (``tidemq up --acl``): the ACL settings every service gets.
    Raises ``LookupError`` when a required service (nameserver, broker) cannot be run and
    ``ValueError`` when the topology is impossible (``validate_topology``).
    """
    validate_topology(opts)
    data_dir = opts.data_dir.resolve()
    kinds: list[str] = []
    for kind in SERVICE_ORDER:
        if kind in opts.skip or (kind == "metrics" and not opts.metrics):
            continue
        if available(f"tidemq_server.{kind}"):
            kinds.append(kind)
        elif kind in REQUIRED_SERVICES:
            raise LookupError(f"tidemq_server.{kind} cannot be run "
                              f"(no services/{kind}/__main__.py)")
    nameservers = ",".join(opts.nameserver_urls())

    def spec(kind: str, index: int, port: int, specific: dict[str, str],
             grpc_port: int = 0) -> ServiceSpec:
        env = {"HOST": opts.host, "PORT": str(port), "CLUSTER": opts.cluster, **specific,
               **(acl or {})}  # ACL_FILE, ACCESS_KEY, SECRET_KEY (`tidemq up --acl`)
        if opts.advertise_host:
            env["ADVERTISED_ADDRESS"] = f"{opts.scheme}://{opts.advertise_host}:{port}"
        if opts.tls:
            env |= {"TLS_CERT": str(opts.tls_dir / CERT_FILE),
                    "TLS_KEY": str(opts.tls_dir / KEY_FILE)}
        full = {ENV_PREFIX[kind] + k: v for k, v in env.items()}
        if opts.tls:  # every client in the child (SDK, internal clients) trusts the dev CA
            full[TLS_CA_ENV] = str(opts.tls_dir / CA_FILE)
        return ServiceSpec(name=opts.label(kind, index), module=f"tidemq_server.{kind}",
                           host=opts.host, port=port, env=full,
                           public_host=opts.advertise_host,
                           grpc_port=grpc_port, kind=kind,
                           group=group_name(index) if kind in GROUP_SERVICES else "",
                           tls=opts.tls)

    def group_url(kind: str, index: int) -> str:
        return f"{opts.scheme}://{opts.public_host}:{opts.group_port(kind, index)}"

    specs: list[ServiceSpec] = []
    for kind in kinds:
        if kind == "nameserver":  # brokers register with every one; each lists them all
            expect = ",".join(group_name(i) for i in range(opts.groups)) \
                if "broker" in kinds else ""  # their warm-up ends once these registered
            specs += [spec(kind, j, port, {"TOKEN": token, "PEERS": nameservers,
                                           "EXPECT_BROKERS": expect})
                      for j, port in enumerate(opts.nameserver_ports())]
        elif kind == "metrics":  # reads the events of every group, found through nameservers
            specs.append(spec(kind, 0, opts.metrics_port, {
                "BROKER_URL": group_url("broker", 0), "NAMESERVERS": nameservers,
                "REDIS_URL": redis_url, "TOKEN": token,
                "DATA_DIR": str(data_dir / "metrics")}))
        elif kind == "console":  # finds every broker through the nameservers
            env = {"NAMESERVERS": nameservers, "TOKEN": token}
            for sidecar in ("checker", "scheduler"):
                if sidecar in kinds:
                    env[f"{sidecar.upper()}S"] = ",".join(
                        group_url(sidecar, i) for i in range(opts.groups))
            console = spec(kind, 0, opts.console_port, env)
            if not acl and opts.host not in LOOPBACK_HOSTS:  # it acts for whoever reaches it
                console = dataclasses.replace(console, host=LOOPBACK, public_host="", env={
                    **{k: v for k, v in console.env.items()
                       if k != "TIDEMQ_CONSOLE_ADVERTISED_ADDRESS"},
                    "TIDEMQ_CONSOLE_HOST": LOOPBACK})
            specs.append(console)
        elif kind == "broker":
            for i in range(opts.groups):
                env = {"BROKER_NAME": group_name(i), "NAMESERVERS": nameservers,
                       "REDIS_URL": redis_url,
                       "DATA_DIR": str(data_dir / opts.data_subdir("broker", i)),
                       "TOKEN": token, "FLUSH": opts.flush,
                       # explicit, so the port printed is the one the broker binds
                       "GRPC_PORT": str(opts.grpc_port(i))}
                if "scheduler" in kinds:  # cancel and /v1/scheduled ask its group's scheduler
                    env["SCHEDULER_URL"] = group_url("scheduler", i)
                if opts.replicas > 1:
                    env["REPLICAS"] = str(opts.replicas)
                specs.append(spec(kind, i, opts.group_port(kind, i), env, opts.grpc_port(i)))
                for j in range(1, opts.replicas):  # static replicas following broker_id 0
                    port, grpc = opts.replica_port(i, j), opts.replica_grpc_port(i, j)
                    replica = {**env, "BROKER_ID": str(j), "PRIMARY_ADDRESS":
                               group_url("broker", i), "GRPC_PORT": str(grpc),
                               "DATA_DIR": f"{env['DATA_DIR']}-r{j}"}
                    member = spec(kind, i, port, replica, grpc)  # the group's TLS and ACL
                    specs.append(dataclasses.replace(member, name=opts.replica_label(i, j)))
        else:  # checker, scheduler: one per group, finding its broker by name (or URL)
            for i in range(opts.groups):
                env = {"BROKER_NAME": group_name(i), "NAMESERVERS": nameservers,
                       "BROKER_URL": group_url("broker", i), "REDIS_URL": redis_url,
                       "TOKEN": token}
                if kind == "scheduler":
                    env["DATA_DIR"] = str(data_dir / opts.data_subdir(kind, i))
                specs.append(spec(kind, i, opts.group_port(kind, i), env))
    return specs


def etcd_command(exe: str, host: str, client_port: int, data_dir: Path,
                 public_host: str = "") -> list[str]:
    """A managed single-member etcd: client URL on ``client_port`` of ``host``, peers on the
    next port, advertised at ``public_host`` (default ``host``), data under ``data_dir`` (kept
    across runs)."""
    client, peer = f"http://{host}:{client_port}", f"http://{host}:{client_port + 1}"
    public = public_host or host
    shown, shown_peer = f"http://{public}:{client_port}", f"http://{public}:{client_port + 1}"
    return [exe, "--name", "tidemq", "--data-dir", str(data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", shown,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", shown_peer,
            "--initial-cluster", f"tidemq={shown_peer}", "--log-level", "warn"]


def with_etcd(specs: list[ServiceSpec], etcd_url: str) -> list[ServiceSpec]:
    """Every broker of ``specs`` told where etcd is (automatic failover in its group)."""
    return [dataclasses.replace(s, env={**s.env, ENV_PREFIX["broker"] + "ETCD_ENDPOINTS":
                                        etcd_url})
            if s.service == "broker" else s for s in specs]


def redis_command(exe: str, port: int, host: str, data_dir: Path) -> list[str]:
    """A managed redis-server: append-only file under the data dir, no RDB snapshots."""
    return [exe, "--port", str(port), "--bind", host, "--dir", str(data_dir),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--protected-mode", "no", "--daemonize", "no"]


def child_env(spec: ServiceSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full environment of a child: ours, plus the spec's variables, unbuffered output."""
    return {**(os.environ if base is None else base), **spec.env, "PYTHONUNBUFFERED": "1"}
