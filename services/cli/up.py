"""`tidemq up`: run a whole local cluster as supervised child processes until Ctrl-C or SIGTERM.

Redis (managed unless REDIS_URL is set) starts first, then the services in plan order
(``tidemq_server.cli.plan``: nameservers, then per broker group a broker, a checker and a
scheduler, then the metrics sidecar), each awaited on its /healthz; then every broker is awaited
in every nameserver's cluster view, so "tidemq is up" means routable. ``--groups N
--nameservers M`` run several groups and nameservers on predictable ports (plan.py). A child
that dies is restarted (``tidemq_server.cli.supervisor``); a crash loop, Ctrl-C or SIGTERM stops the
children in reverse order (SIGTERM, then SIGKILL after a timeout). Each child's output goes to
``<data-dir>/logs/<name>.log``.

Before anything starts, `tidemq up` locks its data dir and checks every port it will use
(``tidemq_server.cli.preflight``): a second `tidemq up` on the same data dir, or one whose ports are
taken, stops with one line naming the running instance (its pid) or the port, having started
nothing.

The cluster token is ``TIDEMQ_TOKEN`` when set, else the one kept in ``<data-dir>/token`` (mode
0600, created on the first run), so clients keep working across restarts.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from tidemq_server.cli import notices
from tidemq_server.cli.acl import prepare_acl
from tidemq_server.cli.certs import ensure_dev_pki
from tidemq_server.cli.plan import (
    MAX_GROUPS,
    MAX_NAMESERVERS,
    MAX_REPLICAS,
    SERVICE_ORDER,
    TOKEN_FILE,
    ServiceSpec,
    UpOptions,
    child_env,
    etcd_command,
    group_name,
    plan_services,
    redis_command,
    resolve_token,
    validate_topology,
    with_etcd,
)
from tidemq_server.cli.preflight import DataDirLock, check_ports, port_in_use
from tidemq_server.cli.rest import CliError, console, reports_errors
from tidemq_server.cli.supervisor import (
    DUPLICATE_SIGNAL_S,
    POLL_S,
    Interrupted,
    Supervisor,
    http_probe,
    redis_probe,
)
from tidemq_server.common.auth.client import service_auth, use_account
from tidemq_server.common.auth.policy import PolicyError
from tidemq_server.common.constants import WILDCARD_HOSTS
from tidemq_server.common.logs import format_from_env
from tidemq_server.common.tls import client_context, use_ca_bundle
from tidemq_server.metrics import SPARK_MISSING, spark_installed

__all__ = ["DUPLICATE_SIGNAL_S", "Supervisor", "up"]

_DEFAULTS = UpOptions()  # the defaults of the options below live in UpOptions


class FlushChoice(StrEnum):
    ASYNC = "async"  # ack once written to the OS; fsync in the background
    SYNC = "sync"  # ack after the fsync that covers the message


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start_redis(sup: Supervisor, host: str, public_host: str = "") -> str:
    """A managed redis-server on a free port of ``host``, its append-only data under the data
    dir (kept across restarts of it). Answers its URL (at ``public_host`` when given)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise CliError("redis-server is not installed: install it (scripts/install-system-"
                       "deps.sh, or apt-get install redis-server) or set REDIS_URL")
    port = free_port(host)
    data = sup.data_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    url = f"redis://{public_host or host}:{port}/0"
    sup.start("redis", redis_command(exe, port, host, data), dict(os.environ), url, "",
              redis_probe(public_host or host, port))
    return url


def start_etcd(sup: Supervisor, host: str, port: int, public_host: str = "") -> str:
    """A managed etcd for replicated groups: client port ``port`` (peers on ``port + 1``),
    data under ``<data dir>/etcd`` (kept across runs). Answers its client URL."""
    exe = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if exe is None:
        raise CliError("etcd is not installed: replicated groups need it for failover; "
                       "install it (scripts/install-system-deps.sh, or apt-get install "
                       "etcd-server)")
    for p in (port, port + 1):
        if port_in_use(host, p):
            raise CliError(f"port {p} on {host} is in use, so etcd cannot start: choose "
                           "another with --etcd-port (its peer port is the next one)")
    data = sup.data_dir / "etcd"
    data.mkdir(parents=True, exist_ok=True)
    url = f"http://{public_host or host}:{port}"
    sup.start("etcd", etcd_command(exe, host, port, data, public_host), dict(os.environ), url, "",
              http_probe(url + "/health"))
    return url


def start_service(sup: Supervisor, spec: ServiceSpec) -> None:
    option = f"--{spec.service}-port"
    if port_in_use(spec.host, spec.port):
        raise CliError(f"port {spec.port} on {spec.host} is in use, so {spec.name} cannot "
                       f"start: is another tidemq running? Choose another base port with "
                       f"{option}")
    if spec.grpc_port and port_in_use(spec.host, spec.grpc_port):
        raise CliError(f"gRPC port {spec.grpc_port} on {spec.host} is in use, so "
                       f"{spec.name} cannot start: choose another with --grpc-port "
                       "(0 turns the gRPC door off)")
    sup.start(spec.name, spec.command(sys.executable), child_env(spec), spec.shown_url,
              spec.docs_url, http_probe(spec.health_url))


def wait_registered(sup: Supervisor, nameservers: list[str], groups: list[str]) -> None:
    """Wait until every nameserver lists every broker group; warn (not fail) after the start
    timeout: a broker that cannot register still serves its own REST port."""
    deadline = time.monotonic() + sup.start_timeout_s
    missing: dict[str, list[str]] = {}
    with (httpx.Client(timeout=1.0, verify=client_context(), auth=service_auth()) as client,
          notices.status("brokers registering …")):
        while time.monotonic() < deadline:
            if sup.stop_requested:
                raise Interrupted
            missing = {}
            for url in nameservers:
                try:
                    listed = {b["broker_name"] for b in
                              client.get(f"{url}/v1/cluster").json()["brokers"]}
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    listed = set()
                if set(groups) - listed:
                    missing[url] = sorted(set(groups) - listed)
            if not missing:
                return
            time.sleep(POLL_S)
    for url, names in missing.items():
        notices.say(f"{', '.join(names)} not registered with {url} after "
                    f"{sup.start_timeout_s:.0f} s: see the broker logs", err=True,
                    level=logging.WARNING, style="yellow")


def _port_option(what: str) -> Any:
    return typer.Option(min=1, max=65535, help=f"Port of the {what}.")


def stored_token(data_dir: Path) -> tuple[str, Path]:
    """The token kept in ``<data-dir>/token``, created (random, mode 0600) when absent or empty.

    ``TIDEMQ_TOKEN`` still wins (``resolve_token``); the file only makes the generated token
    stable across runs, so clients and scripts holding it keep working after a restart.
    """
    path = data_dir / TOKEN_FILE
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    except OSError as exc:
        raise CliError(f"cannot read the cluster token in {path}: {exc}") from None
    if token:
        if path.stat().st_mode & 0o077:  # readable by others: the token guards the cluster
            path.chmod(0o600)
        return token, path
    token = resolve_token({})
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    path.chmod(0o600)  # O_CREAT's mode does not apply to a file that already existed
    return token, path


@reports_errors
def up(
    broker_port: Annotated[int, typer.Option(
        min=1, max=65535, help="Port of the first group's broker; group i adds 1000*i.")
                           ] = _DEFAULTS.broker_port,
    grpc_port: Annotated[int | None, typer.Option(
        min=0, max=65535, show_default=False,
        help="Port of the first broker's gRPC door (RocketMQ 5 clients), group i adds i; 0 = "
             f"off. Default {_DEFAULTS.broker_grpc_port}, or off for a group whose port is "
             "busy.")] = None,
    nameserver_port: Annotated[int, typer.Option(
        min=1, max=65535, help="Port of the first nameserver; nameserver j adds j.")
                               ] = _DEFAULTS.nameserver_port,
    checker_port: Annotated[int, typer.Option(
        min=1, max=65535, help="Port of the first group's checker; group i adds 1000*i.")
                            ] = _DEFAULTS.checker_port,
    scheduler_port: Annotated[int, typer.Option(
        min=1, max=65535, help="Port of the first group's scheduler; group i adds 1000*i.")
                              ] = _DEFAULTS.scheduler_port,
    metrics_port: Annotated[int, _port_option("metrics sidecar")] = _DEFAULTS.metrics_port,
    console_port: Annotated[int, _port_option("web console")] = _DEFAULTS.console_port,
    etcd_port: Annotated[int, _port_option("etcd started for replicated groups (its peer "
                                           "port is the next one)")] = _DEFAULTS.etcd_port,
    groups: Annotated[int, typer.Option(
        min=1, max=MAX_GROUPS, help="Broker groups (broker-a, broker-b, …), each with its "
                                    "broker, checker and scheduler.")] = _DEFAULTS.groups,
    nameservers: Annotated[int, typer.Option(
        min=1, max=MAX_NAMESERVERS, help="Nameservers; every broker registers with all.")
                           ] = _DEFAULTS.nameservers,
    replicas: Annotated[int, typer.Option(
        min=1, max=MAX_REPLICAS, help="Copies of each group's log: broker_id 0 is primary, "
                                      "replica j listens on the broker port + 100*j.")
                        ] = _DEFAULTS.replicas,
    data_dir: Annotated[Path, typer.Option(help="Store, Redis and logs go here.")
                        ] = _DEFAULTS.data_dir,
    flush: Annotated[FlushChoice, typer.Option(help="Broker flush mode.")
                 ] = FlushChoice(_DEFAULTS.flush),
    metrics: Annotated[bool, typer.Option("--metrics/--no-metrics",
                                          help="Start the PySpark metrics sidecar.")
                   ] = _DEFAULTS.metrics,
    host: Annotated[str, typer.Option(help="Address every service binds.")
                ] = _DEFAULTS.host,
    advertise_host: Annotated[str, typer.Option(
        help="Address every service advertises and the services reach each other at "
             "(default: --host; required when --host is 0.0.0.0 or ::).")
                          ] = _DEFAULTS.advertise_host,
    cluster: Annotated[str, typer.Option(help="Cluster name.")] = _DEFAULTS.cluster,
    skip: Annotated[list[str] | None, typer.Option(
        help=f"Do not start this service (repeatable): {', '.join(SERVICE_ORDER)}.")] = None,
    start_timeout: Annotated[float, typer.Option(help="Seconds to wait for each /healthz.")
                             ] = 60.0,
    stop_timeout: Annotated[float, typer.Option(help="Seconds before a stopping child is "
                                                     "killed.")] = 10.0,
    tls: Annotated[bool, typer.Option(
        "--tls", help="Serve TLS on every port with a development CA and certificate made "
                      "under <data-dir>/tls (kept across runs); clients need "
                      "TIDEMQ_TLS_CA=<data-dir>/tls/ca.pem.")] = False,
    acl: Annotated[Path | None, typer.Option(
        help="Accounts and rules (YAML, docs/operations.md): every service requires signed "
             "requests; their own account is kept in <data-dir>/acl-services.yaml.")] = None,
) -> None:
    """Start Redis and every service locally, print the endpoints, and keep them running
    (a service that dies is restarted) until Ctrl-C."""
    try:
        if format_from_env(os.environ) == "json":
            notices.use_json()  # our notices and (inherited) the children's logs
    except ValueError as exc:
        raise CliError(f"CONFIG: {exc}") from None
    skipped = frozenset(skip or [])
    unknown = sorted(skipped - set(SERVICE_ORDER))
    if unknown:
        raise CliError(f"BAD_REQUEST: unknown service(s) {unknown} in --skip; "
                       f"choose from {', '.join(SERVICE_ORDER)}", 2)
    lock = DataDirLock(data_dir)
    lock.acquire()  # before anything is written or started: one `tidemq up` per data dir
    sup = Supervisor(data_dir, start_timeout, stop_timeout)
    sup.install_signal_handlers()
    crash_loop: str | None = None
    try:
        grpc = _DEFAULTS.broker_grpc_port if grpc_port is None else grpc_port
        grpc_off: set[int] = set()
        if grpc_port is None and grpc and "broker" not in skipped:
            for i in range(groups):
                if port_in_use(host, grpc + i):
                    notices.say(f"port {grpc + i} is in use: {group_name(i)} starts "
                                "without its gRPC door (choose a free port with "
                                "--grpc-port)", err=True, level=logging.WARNING)
                    grpc_off.add(i)
        if metrics and "metrics" not in skipped and not spark_installed():
            notices.say(f"metrics sidecar not started: {SPARK_MISSING}", err=True,
                        markup=False, level=logging.WARNING)
            metrics = False
        opts = UpOptions(data_dir=data_dir, host=host, advertise_host=advertise_host,
                         cluster=cluster,
                         nameserver_port=nameserver_port, broker_port=broker_port,
                         broker_grpc_port=grpc, checker_port=checker_port,
                         scheduler_port=scheduler_port, metrics_port=metrics_port,
                         console_port=console_port, etcd_port=etcd_port,
                         flush=flush.value, metrics=metrics, skip=skipped, groups=groups,
                         nameservers=nameservers, grpc_off=frozenset(grpc_off),
                         replicas=replicas, tls=tls)
        try:
            validate_topology(opts)
        except ValueError as exc:
            raise CliError(f"BAD_REQUEST: {exc}", 2) from None
        check_ports(opts)  # every port of the plan, before Redis starts on the data dir
        ca_line = ""
        if tls:
            pki = ensure_dev_pki(opts.tls_dir, [opts.public_host]
                                 if opts.public_host not in WILDCARD_HOSTS else [])
            use_ca_bundle(str(pki.ca))  # our own probes verify the children like any client
            ca_line = (f"TLS on: CA [bold]{pki.ca}[/] (clients: TIDEMQ_TLS_CA={pki.ca}; "
                       "RocketMQ 5 clients: tls_enable=True, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)")
        if os.environ.get("TIDEMQ_TOKEN"):
            token, token_origin = resolve_token(os.environ), "from TIDEMQ_TOKEN"
        else:
            token, token_path = stored_token(data_dir)
            token_origin = f"kept in {token_path}; TIDEMQ_TOKEN overrides it"
        acl_setup = None
        if acl is not None:
            try:
                acl_setup = prepare_acl(acl, data_dir)
            except PolicyError as exc:
                raise CliError(f"BAD_REQUEST: --acl: {exc}", 2) from None
            use_account(acl_setup.access_key, acl_setup.secret_key)  # this process's own calls
        redis_url = os.environ.get("REDIS_URL") or start_redis(sup, host, advertise_host)
        try:
            specs = plan_services(opts, redis_url=redis_url, token=token,
                                  acl=acl_setup.env() if acl_setup else None)
        except LookupError as exc:
            raise CliError(str(exc)) from None
        except ValueError as exc:
            raise CliError(f"BAD_REQUEST: {exc}", 2) from None
        if opts.replicas > 1 and "broker" not in skipped:
            specs = with_etcd(specs, start_etcd(sup, host, opts.etcd_port, advertise_host))
        for spec in specs:
            start_service(sup, spec)
        kinds = {spec.service for spec in specs}
        if {"nameserver", "broker"} <= kinds:
            wait_registered(sup, opts.nameserver_urls(),
                            [group_name(i) for i in range(groups)])
        if notices.json_on():
            notices.say(f"tidemq is up (logs in {sup.log_dir})", fields={"endpoints": {
                child.name: child.url for child in sup.children}})
        else:
            console.print(sup.endpoints_table())
        if "nameserver" in kinds:
            notices.say(f"nameservers {','.join(opts.nameserver_urls())} (clients: "
                        "--nameserver or TIDEMQ_NAMESERVER_URL)", highlight=False)
        if ca_line:
            notices.say(ca_line, highlight=False)
        if acl_setup is not None:
            notices.say(f"ACL on: accounts from {acl_setup.files} (clients sign with "
                        "TIDEMQ_ACCESS_KEY / TIDEMQ_SECRET_KEY)", highlight=False)
        notices.say(f"cluster token [bold]{token}[/] ({token_origin}) · "
                    "Ctrl-C stops everything")
        crash_loop = sup.supervise()
    except Interrupted:
        notices.say("stop requested while starting", err=True)
    finally:
        if sup.children:
            notices.say(f"stopping … (a Ctrl-C {DUPLICATE_SIGNAL_S:.0f} s or more from "
                        "now kills whatever is still running)", err=True)
        sup.stop_all()
        sup.restore_signal_handlers()
        lock.release()
    if crash_loop is not None:
        raise CliError(f"{crash_loop}: stopped everything")
