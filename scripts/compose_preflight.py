"""Before and after ``docker-compose up``: Docker present, host ports free, services healthy.

    python scripts/compose_preflight.py check          # Docker and compose installed, the
                                                       # daemon answering, every port free
    python scripts/compose_preflight.py free-ports     # `export VAR=PORT`: free ports for all
    python scripts/compose_preflight.py wait-healthy [SERVICE ...] [--timeout-s S]

Every host port docker-compose.yml publishes is written ``127.0.0.1:${VARIABLE:-DEFAULT}:PORT``:
the variable moves it. A port already taken is named with its service and that variable. Needs
PyYAML (Debian's docker-compose depends on python3-yaml; the project's virtualenv has it).
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"
PUBLISHED = re.compile(r"^(?P<ip>[\d.]+):\$\{(?P<var>\w+):-(?P<default>\d+)\}:(?P<inner>\d+)$")
INSTALL = ("Docker is not installed: on Debian or Ubuntu, `sudo apt-get install docker.io "
           "docker-compose` (or Docker's own docker-ce with the compose plugin), then start it "
           "(`sudo systemctl start docker`)")
HEALTH_TIMEOUT_S = 300.0  # longest wait for every service to be healthy (s)
POLL_S = 1.0


class PreflightError(Exception):
    """What is wrong, in a sentence that says what to do."""


@dataclass(frozen=True, slots=True)
class Published:
    service: str
    ip: str
    variable: str
    default: int
    inner: int  # the port inside the container

    def port(self, env: Mapping[str, str]) -> int:
        value = env.get(self.variable, "")
        if value and not value.isdigit():
            raise PreflightError(f"{self.variable}={value!r} is not a port number")
        return int(value) if value else self.default


def published(compose: Mapping[str, object]) -> list[Published]:
    """Every published port of the compose file; one not written with a variable is an error."""
    out = []
    services = compose.get("services")
    assert isinstance(services, Mapping), "no services in the compose file"
    for name, svc in services.items():
        for spec in (svc or {}).get("ports", []):
            m = PUBLISHED.match(str(spec))
            if not m:
                raise PreflightError(f"{name}: published port {spec!r} is not written as "
                                     "IP:${VARIABLE:-PORT}:PORT")
            out.append(Published(name, m["ip"], m["var"], int(m["default"]), int(m["inner"])))
    return out


def load(path: Path = COMPOSE) -> list[Published]:
    return published(yaml.safe_load(path.read_text()))


def taken(ip: str, port: int) -> bool:
    """True when something listens on (ip, port): binding it fails with EADDRINUSE."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def check_ports(ports: Sequence[Published], env: Mapping[str, str]) -> None:
    """Raises PreflightError naming each taken port's service and the variable that moves it."""
    problems = []
    for p in ports:
        port = p.port(env)
        if taken(p.ip, port):
            problems.append(f"port {port} on {p.ip} is already taken: service {p.service} "
                            f"publishes it; set {p.variable} to a free port "
                            f"(e.g. {p.variable}={port + 10000} docker-compose up -d)")
    if problems:
        raise PreflightError("\n".join(problems))


def compose_command() -> list[str] | None:
    """``docker-compose`` (Debian's 1.29) or the ``docker compose`` plugin, None without."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def check_docker() -> None:
    if not shutil.which("docker") or compose_command() is None:
        raise PreflightError(INSTALL)
    info = subprocess.run(["docker", "info"], capture_output=True, text=True)
    if info.returncode != 0:
        where = os.environ.get("DOCKER_HOST", "its default socket")
        raise PreflightError(f"the Docker daemon does not answer at {where}: start it "
                             "(`sudo systemctl start docker`), or set DOCKER_HOST to one that "
                             f"runs; docker said: {info.stderr.strip()[:300]}")


def free_port(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def project() -> str:
    """The compose project: COMPOSE_PROJECT_NAME, else the folder's name as compose makes it."""
    return os.environ.get("COMPOSE_PROJECT_NAME") or re.sub(r"[^a-z0-9]", "",
                                                             COMPOSE.parent.name.lower())


def containers(name: str) -> dict[str, str]:
    """Service → container id of the project's containers (by the labels compose sets)."""
    label = f"label=com.docker.compose.project={name}"
    out = subprocess.run(["docker", "ps", "-a", "--filter", label, "--format",
                          '{{.Label "com.docker.compose.service"}} {{.ID}}'],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def states(ids: Mapping[str, str]) -> dict[str, str]:
    """Service → ``healthy``, ``done`` (a one-shot that exited 0), or what it is doing."""
    if not ids:
        return {}
    fmt = ('{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}} '
           "{{.State.ExitCode}} {{if .State.Health}}{{.State.Health.Status}}{{end}}")
    out = subprocess.run(["docker", "inspect", "-f", fmt, *ids.values()],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        service, status, code, health = [*line.split(), "", "", ""][:4]
        found[service] = "done" if (status, code) == ("exited", "0") else health or status
    return found


def wait_healthy(services: Sequence[str], timeout_s: float) -> None:
    start = time.monotonic()
    waiting = set(services)
    now: dict[str, str] = {}
    while waiting:
        now = states(containers(project()))
        for service in sorted(waiting):
            if now.get(service) in ("healthy", "done"):
                waiting.discard(service)
                print(f"  {service:<14} {now[service]:<8} after "
                      f"{time.monotonic() - start:5.1f} s", file=sys.stderr)
        if waiting and time.monotonic() - start > timeout_s:
            raise PreflightError(f"not healthy after {timeout_s:g} s: " + ", ".join(
                f"{s} ({now.get(s, 'no container')})" for s in sorted(waiting)))
        if waiting:
            time.sleep(POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check")
    sub.add_parser("free-ports")
    wait = sub.add_parser("wait-healthy")
    wait.add_argument("services", nargs="*")
    wait.add_argument("--timeout-s", type=float, default=HEALTH_TIMEOUT_S)
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            check_docker()
            check_ports(load(), os.environ)
        elif args.command == "free-ports":
            for p in load():
                print(f"export {p.variable}={free_port(p.ip)}")
        else:
            services = args.services or subprocess.run(
                [*(compose_command() or ["docker-compose"]), "config", "--services"],
                capture_output=True, text=True, check=True).stdout.split()
            wait_healthy(services, args.timeout_s)
    except PreflightError as exc:
        print(f"compose: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
