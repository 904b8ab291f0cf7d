"""`tidemq up`: run a whole local cluster as child processes until Ctrl-C or SIGTERM.

Redis (managed unless REDIS_URL is set) starts first, then the services in plan order, each
awaited on its /healthz. On a signal the children stop in reverse order (SIGTERM, then SIGKILL
after a timeout) and the command exits 0. If a child dies, its last log lines are printed and
everything stops with exit status 1. Each child's output goes to ``<data-dir>/logs/<name>.log``.

One stop request gives every child its whole graceful timeout, however many signals carry it:
``make up`` forwards the SIGTERM its process group already got, so a second signal often arrives
at once. Only a Ctrl-C pressed again ``DUPLICATE_SIGNAL_S`` or more after the first skips the wait.

The cluster token is ``TIDEMQ_TOKEN`` when set, else the one kept in ``<data-dir>/token`` (mode
0600, created on the first run), so clients keep working across restarts.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import httpx
import redis
import typer
from rich.table import Table

from services.cli.plan import (
    SERVICE_ORDER,
    TOKEN_FILE,
    ServiceSpec,
    UpOptions,
    child_env,
    plan_services,
    redis_command,
    resolve_token,
)
from services.cli.rest import CliError, console, err_console, reports_errors
from services.common.constants import (
    BROKER_GRPC_PORT,
    BROKER_PORT,
    CHECKER_PORT,
    METRICS_PORT,
    NAMESERVER_PORT,
    SCHEDULER_PORT,
)

POLL_S = 0.1
LOG_TAIL_LINES = 30
DUPLICATE_SIGNAL_S = 2.0  # signals this soon after the first one are the same stop request
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class FlushChoice(StrEnum):
    ASYNC = "async"  # ack once written to the OS; fsync in the background
    SYNC = "sync"  # ack after the fsync that covers the message


class Interrupted(Exception):
    """A stop was requested (Ctrl-C or SIGTERM) while starting."""


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if `tidemq up` itself dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class Child:
    name: str
    url: str
    docs_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_start: int  # where this run's output begins in the log file

    def tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.log_start)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]


class Supervisor:
    """Starts, watches and stops the children of one `tidemq up`."""

    def __init__(self, data_dir: Path, start_timeout_s: float, stop_timeout_s: float) -> None:
        self.data_dir = data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.children: list[Child] = []
        self.stop_requested = False
        self.force = False
        self._first_signal_at: float | None = None  # time.monotonic() of the first stop signal
        self._previous: dict[int, Any] = {}

    # --- signals ------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore_signal_handlers(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _: FrameType | None) -> None:
        now = time.monotonic()
        if self._first_signal_at is None:
            self._first_signal_at = now
        elif (signum == signal.SIGINT
              and now - self._first_signal_at >= DUPLICATE_SIGNAL_S):
            self.force = True  # Ctrl-C pressed again later: stop waiting for children, kill them
        # Any other repeat (make forwarding the group's SIGTERM, a second SIGTERM from a
        # supervisor) is the same request: the children keep their graceful timeout.
        self.stop_requested = True

    # --- starting -----------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], url: str,
               docs_url: str) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            log.write(f"\n=== tidemq up: {name} starting at {time.ctime()} ===\n".encode())
            log.flush()
            start = log.tell()
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        child = Child(name, url, docs_url, proc, log_path, start)
        self.children.append(child)
        return child

    def start_redis(self, host: str) -> Child:
        exe = shutil.which("redis-server")
        if exe is None:
            raise CliError("redis-server is not installed: install it (scripts/install-system-"
                           "deps.sh, or apt-get install redis-server) or set REDIS_URL")
        port = free_port(host)
        data = self.data_dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        child = self._spawn("redis", redis_command(exe, port, host, data), dict(os.environ),
                            f"redis://{host}:{port}/0", "")
        client = redis.Redis(host=host, port=port, socket_timeout=0.5)
        try:
            self._wait(child, lambda: bool(client.ping()))
        finally:
            client.close()
        return child

    def start_service(self, spec: ServiceSpec) -> Child:
        if port_in_use(spec.host, spec.port):
            raise CliError(f"port {spec.port} on {spec.host} is in use, so {spec.name} cannot "
                           f"start: is another tidemq running? Choose another with "
                           f"--{spec.name}-port")
        if spec.grpc_port and port_in_use(spec.host, spec.grpc_port):
            raise CliError(f"gRPC port {spec.grpc_port} on {spec.host} is in use, so "
                           f"{spec.name} cannot start: choose another with --grpc-port "
                           "(0 turns the gRPC door off)")
        child = self._spawn(spec.name, spec.command(sys.executable), child_env(spec),
                            spec.shown_url, spec.docs_url)
        with httpx.Client(timeout=0.5) as client:
            self._wait(child, lambda: client.get(spec.health_url).status_code == 200)
        return child

    def _wait(self, child: Child, healthy: Any) -> None:
        """Poll ``healthy()`` until true; fail if the child exits or the timeout passes."""
        started = time.monotonic()
        with console.status(f"starting {child.name} …", spinner="dots"):
            while True:
                if self.stop_requested:
                    raise Interrupted
                if child.proc.poll() is not None:
                    self.report_death(child)
                    raise CliError(f"{child.name} exited while starting "
                                   f"(log: {child.log_path})")
                try:
                    if healthy():
                        break
                except (httpx.HTTPError, redis.RedisError, OSError):
                    pass
                if time.monotonic() - started > self.start_timeout_s:
                    self.report_death(child, "is not healthy")
                    raise CliError(f"{child.name} not healthy after {self.start_timeout_s:.0f} s "
                                   f"(log: {child.log_path})")
                time.sleep(POLL_S)
        console.print(f"[green]✓[/] {child.name} ready at {child.url} "
                      f"({time.monotonic() - started:.1f} s)")

    # --- running and stopping -----------------------------------------------------------------

    def watch(self) -> Child | None:
        """Block until a stop is requested (None) or a child exits (that child)."""
        while not self.stop_requested:
            for child in self.children:
                if child.proc.poll() is not None:
                    return child
            time.sleep(POLL_S * 2)
        return None

    def report_death(self, child: Child, what: str | None = None) -> None:
        status = what or f"exited {describe_status(child.proc.returncode)}"
        err_console.print(f"[bold red]{child.name} {status}[/]; last lines of {child.log_path}:")
        for line in child.tail():
            err_console.print("  " + line, markup=False, highlight=False, style="dim",
                              soft_wrap=True)

    def stop_all(self) -> None:
        """Stop every child in reverse start order: SIGTERM, then SIGKILL after the timeout."""
        self.stop_requested = True
        for child in reversed(self.children):
            proc = child.proc
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + self.stop_timeout_s
                while proc.poll() is None and time.monotonic() < deadline and not self.force:
                    time.sleep(POLL_S / 2)
                if proc.poll() is None:
                    err_console.print(f"{child.name} did not stop in time: killing it")
                    proc.kill()
                proc.wait()
                console.print(f"stopped {child.name} {describe_status(proc.returncode)}")
        self.children.clear()

    def endpoints_table(self) -> Table:
        table = Table(title="tidemq is up", caption=f"logs in {self.log_dir}")
        table.add_column("service", style="bold")
        table.add_column("URL", no_wrap=True)
        table.add_column("docs", no_wrap=True)
        for child in self.children:
            table.add_row(child.name, child.url, child.docs_url or "-")
        return table


def describe_status(code: int | None) -> str:
    """A child's exit status in words: uvicorn re-raises SIGTERM after a clean shutdown."""
    if code is None:
        return "still running"
    if code in (0, -signal.SIGTERM, -signal.SIGINT):
        return "cleanly"
    if code < 0:
        return f"by signal {signal.Signals(-code).name}"
    return f"with status {code}"


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
    broker_port: Annotated[int, _port_option("broker")] = BROKER_PORT,
    grpc_port: Annotated[int | None, typer.Option(
        min=0, max=65535, show_default=False,
        help="Port of the broker's gRPC door (RocketMQ 5 clients); 0 = off. Default "
             f"{BROKER_GRPC_PORT}, or off when that port is busy.")] = None,
    nameserver_port: Annotated[int, _port_option("nameserver")
                               ] = NAMESERVER_PORT,
    checker_port: Annotated[int, _port_option("checker")] = CHECKER_PORT,
    scheduler_port: Annotated[int, _port_option("scheduler")] = SCHEDULER_PORT,
    metrics_port: Annotated[int, _port_option("metrics sidecar")] = METRICS_PORT,
    data_dir: Annotated[Path, typer.Option(help="Store, Redis and logs go here.")
                        ] = Path(".tidemq"),
    flush: Annotated[FlushChoice, typer.Option(help="Broker flush mode.")] = FlushChoice.ASYNC,
    metrics: Annotated[bool, typer.Option("--metrics/--no-metrics",
                                          help="Start the PySpark metrics sidecar.")] = True,
    host: Annotated[str, typer.Option(help="Address every service binds.")] = "127.0.0.1",
    cluster: Annotated[str, typer.Option(help="Cluster name.")] = "DefaultCluster",
    skip: Annotated[list[str] | None, typer.Option(
        help=f"Do not start this service (repeatable): {', '.join(SERVICE_ORDER)}.")] = None,
    start_timeout: Annotated[float, typer.Option(help="Seconds to wait for each /healthz.")
                             ] = 60.0,
    stop_timeout: Annotated[float, typer.Option(help="Seconds before a stopping child is "
                                                     "killed.")] = 10.0,
) -> None:
    """Start Redis and every service locally, print the endpoints, run until Ctrl-C."""
    unknown = sorted(set(skip or []) - set(SERVICE_ORDER))
    if unknown:
        raise CliError(f"BAD_REQUEST: unknown service(s) {unknown} in --skip; "
                       f"choose from {', '.join(SERVICE_ORDER)}", 2)
    grpc = BROKER_GRPC_PORT if grpc_port is None else grpc_port
    if grpc_port is None and "broker" not in (skip or []) and port_in_use(host, grpc):
        err_console.print(f"port {grpc} is in use: the broker starts without its gRPC door "
                          "(choose a free port with --grpc-port)")
        grpc = 0
    opts = UpOptions(data_dir=data_dir, host=host, cluster=cluster,
                     nameserver_port=nameserver_port, broker_port=broker_port,
                     broker_grpc_port=grpc,
                     checker_port=checker_port, scheduler_port=scheduler_port,
                     metrics_port=metrics_port, flush=flush.value, metrics=metrics,
                     skip=frozenset(skip or []))
    if os.environ.get("TIDEMQ_TOKEN"):
        token, token_origin = resolve_token(os.environ), "from TIDEMQ_TOKEN"
    else:
        token, token_path = stored_token(data_dir)
        token_origin = f"kept in {token_path}; TIDEMQ_TOKEN overrides it"
    sup = Supervisor(data_dir, start_timeout, stop_timeout)
    sup.install_signal_handlers()
    dead: Child | None = None
    try:
        redis_url = os.environ.get("REDIS_URL") or sup.start_redis(host).url
        try:
            specs = plan_services(opts, redis_url=redis_url, token=token)
        except LookupError as exc:
            raise CliError(str(exc)) from None
        for spec in specs:
            sup.start_service(spec)
        console.print(sup.endpoints_table())
        console.print(f"cluster token [bold]{token}[/] ({token_origin}) · "
                      "Ctrl-C stops everything")
        dead = sup.watch()
        if dead is not None:
            sup.report_death(dead)
    except Interrupted:
        err_console.print("stop requested while starting")
    finally:
        err_console.print(f"stopping … (a Ctrl-C {DUPLICATE_SIGNAL_S:.0f} s or more from now "
                          "kills whatever is still running)")
        sup.stop_all()
        sup.restore_signal_handlers()
    if dead is not None:
        raise CliError(f"{dead.name} exited {describe_status(dead.proc.returncode)}: "
                       "stopped everything")
