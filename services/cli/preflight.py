"""What `tidemq up` makes sure of before it starts anything: the data dir is its own, every port
it will listen on is free.

A second `tidemq up` in the same checkout must not touch the running system's files: before,
it started another redis-server on the live ``<data-dir>/redis`` (opening the live AOF) and only
then found port 9876 taken. Now the first thing it does is lock ``<data-dir>/up.lock``
(``flock``, held for the life of `tidemq up`, released by the kernel however the process
ends; the file holds the holder's pid), and the second thing is to check every port of the
plan; either failure is one line naming the running instance or the taken port, and nothing
was started or written (besides the lock file).
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO

from tidemq_server.cli.plan import LOCK_FILE, UpOptions, planned_ports
from tidemq_server.cli.rest import CliError

#: The `tidemq up` option that moves each kind of port (``planned_ports`` kinds, and etcd).
PORT_OPTIONS = {"nameserver": "--nameserver-port", "broker": "--broker-port",
                "grpc": "--grpc-port", "checker": "--checker-port",
                "scheduler": "--scheduler-port", "metrics": "--metrics-port",
                "console": "--console-port", "etcd": "--etcd-port"}


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class DataDirLock:
    """The lock of one `tidemq up` on its data dir (a ``flock`` on ``<data-dir>/up.lock``)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir.resolve() / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock, or raise CliError naming the `tidemq up` that holds it (its pid)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = self.path.open("a+", encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot lock the data dir {self.path.parent}: {exc}") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            pid = f.read().strip()
            f.close()
            who = f"(pid {pid}) " if pid.isdigit() else ""
            raise CliError(f"another tidemq up {who}is running on the data dir "
                           f"{self.path.parent} (it holds {self.path}): stop it first, or "
                           "start this one with another --data-dir") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def check_ports(opts: UpOptions) -> None:
    """Raise CliError naming the first port of the plan that is taken (skipped services and
    a disabled metrics sidecar excepted; etcd's two ports when groups are replicated)."""
    skipped = set(opts.skip) | (set() if opts.metrics else {"metrics"})
    wanted = [(kind, name, port) for kind, name, port in planned_ports(opts)
              if (kind if kind != "grpc" else "broker") not in skipped]
    if opts.replicas > 1 and "broker" not in skipped:
        wanted += [("etcd", "etcd", opts.etcd_port), ("etcd", "etcd peer", opts.etcd_port + 1)]
    for kind, name, port in wanted:
        if port_in_use(opts.host, port):
            raise CliError(f"port {port} on {opts.host} is in use, so {name} cannot start: is "
                           f"another tidemq running? Choose another with {PORT_OPTIONS[kind]}; "
                           "nothing was started")
