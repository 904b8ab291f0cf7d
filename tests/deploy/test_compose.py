"""docker-compose.yml, deploy/Dockerfile and the Prometheus config, validated offline."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from services.cli.plan import ENV_PREFIX, SERVICE_ORDER
from tests.deploy.topology import COMPOSE, env_of, load_compose
from tests.support.metrics import promtool
from tests.support.procs import REPO

DEPLOY = REPO / "deploy"
TIDEMQ = set(SERVICE_ORDER)  # nameserver, broker, checker, scheduler, metrics


@pytest.mark.integration
def test_docker_compose_accepts_the_file() -> None:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is not installed: run scripts/install-system-deps.sh"
    proc = subprocess.run([exe, "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_service_is_there_with_health_restart_and_volumes() -> None:
    compose = load_compose()
    services = compose["services"]
    assert set(services) == TIDEMQ | {"redis", "prometheus", "grafana"}
    for name, svc in services.items():
        assert svc.get("restart") == "unless-stopped", name
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        assert svc.get("expose"), f"{name} exposes no port"
    for name in TIDEMQ:
        svc = services[name]
        assert svc["command"] == ["python", "-m", f"services.{name}"]
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (REPO / "services" / name).is_dir()
        env = env_of(svc)
        prefix = ENV_PREFIX[name]
        assert all(k.startswith(prefix) for k in env), name
        assert env[f"{prefix}HOST"] == "0.0.0.0"  # reachable from the other containers
        assert [env[f"{prefix}PORT"]] == svc["expose"]
    volumes = {v.split(":")[0]: v.split(":")[1] for s in services.values()
               for v in s.get("volumes", [])}
    assert volumes["broker-store"] == env_of(services["broker"])["TIDEMQ_BROKER_DATA_DIR"]
    assert volumes["redis-data"] == "/data"
    assert set(compose["volumes"]) >= {"broker-store", "redis-data", "metrics-data"}


def test_one_shared_token() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    tokens = {svc["environment"][k] for svc in raw.values()
              for k in svc.get("environment", {}) if k.endswith("_TOKEN")}
    assert tokens == {"${TIDEMQ_TOKEN:-change-me-tidemq-token}"}
    with_token = {n for n, svc in raw.items()
                  if any(k.endswith("_TOKEN") for k in svc.get("environment", {}))}
    assert with_token == {"nameserver", "broker", "checker", "scheduler", "metrics"}


def test_prometheus_scrapes_every_tidemq_service() -> None:
    config = DEPLOY / "prometheus" / "prometheus.yml"
    promtool("check", "config", str(config))
    scrape = yaml.safe_load(config.read_text())["scrape_configs"]
    targets = {t for job in scrape for sc in job["static_configs"] for t in sc["targets"]}
    services = load_compose()["services"]
    for name in TIDEMQ:
        assert f"{name}:{services[name]['expose'][0]}" in targets, name
    mounts = services["prometheus"]["volumes"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in mounts


def test_dockerfile_builds_one_image_with_java() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.startswith("#") and "\nFROM python:3.11" in text
    assert "openjdk-17-jre-headless" in text  # Spark needs a JRE
    assert "COPY services/ services/" in text and "pip install ./sdk ." in text
    assert "\nUSER tidemq" in text
