"""scripts/compose_preflight.py: a compose run says what to install, and which port to move."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.compose import preflight
from tests.support.procs import REPO

SCRIPT = REPO / "scripts" / "compose_preflight.py"


def test_a_taken_port_names_its_service_and_the_variable_that_moves_it() -> None:
    pf = preflight()
    ports = pf.load()
    broker_a = next(p for p in ports if p.service == "broker-a")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        env = {p.variable: str(pf.free_port("127.0.0.1")) for p in ports}
        env[broker_a.variable] = str(taken)
        with pytest.raises(pf.PreflightError) as err:
            pf.check_ports(ports, env)
    message = str(err.value)
    assert f"port {taken} on 127.0.0.1 is already taken" in message
    assert "service broker-a" in message and f"set {broker_a.variable}" in message
    assert message.count("\n") == 0  # only that one


def test_free_ports_pass_and_a_bad_variable_is_named() -> None:
    pf = preflight()
    ports = pf.load()
    env = {p.variable: str(pf.free_port("127.0.0.1")) for p in ports}
    pf.check_ports(ports, env)
    env[ports[0].variable] = "ninety"
    with pytest.raises(pf.PreflightError, match=f"{ports[0].variable}='ninety'"):
        pf.check_ports(ports, env)


def test_a_published_port_without_a_variable_is_refused() -> None:
    pf = preflight()
    with pytest.raises(pf.PreflightError, match="web: published port '8080:8080'"):
        pf.published({"services": {"web": {"ports": ["8080:8080"]}}})


def test_without_docker_it_says_what_to_install(tmp_path: Path) -> None:
    # a PATH with neither docker nor docker-compose on it
    done = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 1
    assert "Docker is not installed" in done.stderr
    assert "apt-get install docker.io docker-compose" in done.stderr
