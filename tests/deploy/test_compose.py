"""docker-compose.yml, deploy/images and the Prometheus config, validated offline (make
compose-test runs them for real)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.topology import COMPOSE, env_of, load_compose
from tests.support.compose import preflight
from tests.support.metrics import promtool
from tests.support.procs import REPO
from tidemq_server.cli.plan import ENV_PREFIX, SERVICE_ORDER

DEPLOY = REPO / "deploy"
GROUPS = ("a", "b")  # broker-a, broker-b
NAMESERVERS = {"nameserver-1": "9876", "nameserver-2": "9877"}
# compose service → the tidemq service it runs
TIDEMQ = {**dict.fromkeys(NAMESERVERS, "nameserver"),
          **{f"{kind}-{g}": kind for kind in ("broker", "checker", "scheduler") for g in GROUPS},
          "metrics": "metrics", "console": "console"}
NAMESERVER_LIST = "https://nameserver-1:9876,https://nameserver-2:9877"
INIT = "init-secrets"  # the one-shot step making the CA and certificate into the secrets volume
SHARED_ENV = {"TIDEMQ_TLS_CA"}  # read by every client in a process, without a service prefix


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
    assert set(services) == set(TIDEMQ) | {"redis", "etcd", "prometheus", "grafana", INIT}
    assert set(TIDEMQ.values()) == set(SERVICE_ORDER)
    for name, svc in services.items():
        if name == INIT:  # one-shot: runs to completion, exposes nothing
            assert svc.get("restart") == "no" and not svc.get("expose")
            continue
        assert svc.get("restart") == "unless-stopped", name
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        assert svc.get("expose"), f"{name} exposes no port"
    for name, kind in TIDEMQ.items():
        svc = services[name]
        assert svc["command"] == ["python", "-m", f"tidemq_server.{kind}"]
        assert svc["build"]["dockerfile"] == "deploy/images/tidemq/Dockerfile"
        assert (REPO / "services" / kind).is_dir()
        env = env_of(svc)
        prefix = ENV_PREFIX[kind]
        assert all(k.startswith(prefix) or k in SHARED_ENV for k in env), name
        assert env[f"{prefix}HOST"] == "0.0.0.0"  # reachable from the other containers
        assert [env[f"{prefix}PORT"]] == svc["expose"]
        assert env[f"{prefix}PORT"] in " ".join(svc["healthcheck"]["test"]), name
    volumes = {v.split(":")[0]: v.split(":")[1] for s in services.values()
               for v in s.get("volumes", [])}
    for group, store in (("a", "broker-store"), ("b", "broker-b-store")):
        broker = env_of(services[f"broker-{group}"])
        assert volumes[store] == broker["TIDEMQ_BROKER_DATA_DIR"]
    assert volumes["redis-data"] == "/data"
    assert volumes["etcd-data"] == "/etcd-data"
    etcd = services["etcd"]["command"]
    assert etcd[etcd.index("--data-dir") + 1] == "/etcd-data"
    for group in GROUPS:  # every broker knows where etcd is (failover once replicated)
        assert env_of(services[f"broker-{group}"])["TIDEMQ_BROKER_ETCD_ENDPOINTS"] == (
            "http://etcd:2379")
    assert set(compose["volumes"]) >= {"broker-store", "broker-b-store", "scheduler-data",
                                       "scheduler-b-data", "redis-data", "metrics-data"}


def test_two_groups_behind_two_nameservers() -> None:
    services = load_compose()["services"]
    for name, port in NAMESERVERS.items():
        env = env_of(services[name])
        assert env["TIDEMQ_NAMESRV_PORT"] == port
        assert env["TIDEMQ_NAMESRV_PEERS"] == NAMESERVER_LIST
    ports = set()
    for i, group in enumerate(GROUPS):
        broker = env_of(services[f"broker-{group}"])
        assert broker["TIDEMQ_BROKER_BROKER_NAME"] == f"broker-{group}"
        assert broker["TIDEMQ_BROKER_NAMESERVERS"] == NAMESERVER_LIST  # registers with both
        assert broker["TIDEMQ_BROKER_PORT"] == str(10911 + 1000 * i)  # as `tidemq up` lays out
        # clients on the host get the published port; the other services the container
        assert broker["TIDEMQ_BROKER_ADVERTISED_ADDRESS"] == (
            f"https://127.0.0.1:{broker['TIDEMQ_BROKER_PORT']}")
        assert broker["TIDEMQ_BROKER_INTERNAL_ADDRESS"] == (
            f"https://broker-{group}:{broker['TIDEMQ_BROKER_PORT']}")
        scheduler = env_of(services[f"scheduler-{group}"])
        assert broker["TIDEMQ_BROKER_SCHEDULER_URL"] == (
            f"https://scheduler-{group}:{scheduler['TIDEMQ_SCHEDULER_PORT']}")
        for kind, prefix in (("checker", "TIDEMQ_CHECKER_"), ("scheduler", "TIDEMQ_SCHEDULER_")):
            svc = services[f"{kind}-{group}"]
            env = env_of(svc)
            assert env[prefix + "BROKER_NAME"] == f"broker-{group}"  # found by name, not URL
            assert env[prefix + "NAMESERVERS"] == NAMESERVER_LIST
            assert prefix + "BROKER_URL" not in env
            assert f"broker-{group}" in svc["depends_on"]
        assert set(services[f"broker-{group}"]["depends_on"]) == {"redis", INIT, *NAMESERVERS}
        ports |= {broker["TIDEMQ_BROKER_PORT"], scheduler["TIDEMQ_SCHEDULER_PORT"]}
    assert len(ports) == 2 * len(GROUPS)
    assert {env_of(services[f"scheduler-{g}"])["TIDEMQ_SCHEDULER_DATA_DIR"]
            for g in GROUPS} == {"/data/scheduler-a", "/data/scheduler-b"}
    metrics = env_of(services["metrics"])
    assert metrics["TIDEMQ_METRICS_NAMESERVERS"] == NAMESERVER_LIST  # every group's events
    assert "TIDEMQ_METRICS_BROKER_URL" not in metrics
    published = [p for svc in services.values() for p in svc.get("ports", [])]
    assert all(p.startswith("127.0.0.1:") for p in published)
    assert len({p.split(":")[1] for p in published}) == len(published)  # no host port twice


def test_one_shared_token() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    tokens = {svc["environment"][k] for svc in raw.values()
              for k in svc.get("environment", {}) if k.endswith("_TOKEN")}
    assert tokens == {"${TIDEMQ_TOKEN:-change-me-tidemq-token}"}
    with_token = {n for n, svc in raw.items()
                  if any(k.endswith("_TOKEN") for k in svc.get("environment", {}))}
    assert with_token == set(TIDEMQ)


def test_tls_on_every_tidemq_port_from_the_init_step() -> None:
    services = load_compose()["services"]
    init = services[INIT]
    assert init["command"][:6] == ["python", "-m", "tidemq_server.cli.init_secrets", "--dir",
                                   "/secrets", "--acl"]
    named = set(init["command"][7::2])  # every --name NAME
    assert init["command"][6::2] == ["--name"] * len(named)
    assert named == set(TIDEMQ)  # the certificate names every service as the others reach it
    assert "secrets:/secrets" in init["volumes"]
    for name, kind in TIDEMQ.items():
        svc = services[name]
        env = env_of(svc)
        prefix = ENV_PREFIX[kind]
        assert env[f"{prefix}TLS_CERT"] == "/secrets/server.pem", name
        assert env[f"{prefix}TLS_KEY"] == "/secrets/server.key", name
        assert env["TIDEMQ_TLS_CA"] == "/secrets/ca.pem", name
        assert "secrets:/secrets:ro" in svc["volumes"], name
        assert svc["depends_on"][INIT] == {"condition": "service_completed_successfully"}
        # etcd (replicated groups only) stays plain inside the compose network, like Redis
        urls = [u for k, v in env.items() for u in v.split(",") if "://" in u
                and not u.startswith("redis://") and not k.endswith("ETCD_ENDPOINTS")]
        assert urls and all(u.startswith("https://") for u in urls), (name, urls)
        check = " ".join(svc["healthcheck"]["test"])
        assert "https://127.0.0.1:" in check and "cafile='/secrets/ca.pem'" in check, name
    assert "secrets:/secrets:ro" in services["prometheus"]["volumes"]


def test_accounts_on_every_tidemq_service_with_the_init_steps_file() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    init_env = raw[INIT]["environment"]
    account = (init_env["TIDEMQ_SERVICES_ACCESS_KEY"], init_env["TIDEMQ_SERVICES_SECRET_KEY"])
    assert account[1].startswith("${TIDEMQ_SERVICES_SECRET_KEY:-")  # set your own, as the token
    for name, kind in TIDEMQ.items():
        env = raw[name]["environment"]
        prefix = ENV_PREFIX[kind]
        assert env[f"{prefix}ACL_FILE"] == "/secrets/acl.yaml", name
        assert (env[f"{prefix}ACCESS_KEY"], env[f"{prefix}SECRET_KEY"]) == account, name


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
def test_prometheus_scrapes_every_tidemq_service() -> None:
    config = DEPLOY / "prometheus" / "prometheus.yml"
    promtool("check", "config", str(config))
    scrape = yaml.safe_load(config.read_text())["scrape_configs"]
    targets = {t for job in scrape for sc in job["static_configs"] for t in sc["targets"]}
    services = load_compose()["services"]
    for name in TIDEMQ:
        assert f"{name}:{services[name]['expose'][0]}" in targets, name
    jobs = {job["job_name"] for job in scrape}
    assert {f"tidemq-{kind}" for kind in TIDEMQ.values()} <= jobs  # one job per kind
    for job in scrape:  # every tidemq port speaks https, signed by the compose CA
        if job["job_name"].startswith("tidemq-"):
            assert job["scheme"] == "https", job["job_name"]
            assert job["tls_config"]["ca_file"] == "/secrets/ca.pem", job["job_name"]
    mounts = services["prometheus"]["volumes"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in mounts


def test_every_image_but_grafana_is_built_from_one_debian_base() -> None:
    services = load_compose()["services"]
    images = {name: svc["image"] for name, svc in services.items()}
    assert {images[name] for name in TIDEMQ} == {"tidemq:local"}
    for name in ("redis", "etcd", "prometheus"):
        assert images[name] == f"tidemq-{name}:local"
        assert services[name]["build"] == {"context": f"deploy/images/{name}", "network": "host"}
    assert images["grafana"].startswith("grafana/grafana:")  # Debian has no package
    for dockerfile in (DEPLOY / "images").glob("*/Dockerfile"):
        froms = [line.split()[1] for line in dockerfile.read_text().splitlines()
                 if line.startswith("FROM ")]
        assert froms and set(froms) == {"debian:bookworm-slim"}, dockerfile


def test_the_tidemq_image_keeps_no_build_certificate_and_runs_as_tidemq() -> None:
    text = (DEPLOY / "images" / "tidemq" / "Dockerfile").read_text()
    build, run = text.split("\nFROM debian:bookworm-slim\n")  # the build stage, the image
    assert "ARG EXTRA_CA_CERTS" in build and "EXTRA_CA_CERTS" not in run
    assert "openjdk-17-jre-headless" in run  # Spark needs a JRE
    assert "COPY --from=build /opt/tidemq /opt/tidemq" in run
    assert 'ENTRYPOINT ["tidemq-entrypoint"]' in run
    entrypoint = (DEPLOY / "images" / "tidemq" / "entrypoint.sh").read_text()
    assert "_DATA_DIR=" in entrypoint and "setpriv --reuid=tidemq" in entrypoint


def test_the_tidemq_image_compiles_the_record_core_in_its_build_stage_only() -> None:
    """gcc and the headers build the compiled record core (setup.py) and the build fails
    without it; the image that runs carries the extension, not the compiler."""
    text = (DEPLOY / "images" / "tidemq" / "Dockerfile").read_text()
    build, run = text.split("\nFROM debian:bookworm-slim\n")
    for need in ("gcc", "python3-dev", "zlib1g-dev", "cython>=3.0", "COMPILED"):
        assert need in build, need
    assert "gcc" not in run and "-dev" not in run


def test_every_published_port_moves_with_a_variable() -> None:
    ports = preflight().load()
    assert {p.service for p in ports} == {"nameserver-1", "nameserver-2", "broker-a", "broker-b",
                                          "metrics", "console", "prometheus", "grafana"}
    assert len({p.variable for p in ports}) == len(ports)
    assert all(p.ip == "127.0.0.1" for p in ports)


def test_every_data_directory_is_a_mounted_volume() -> None:
    # the image's entrypoint creates and owns the path of each *_DATA_DIR at start
    for name, svc in load_compose()["services"].items():
        mounts = {v.split(":")[1] for v in svc.get("volumes", [])}
        for key, value in env_of(svc).items():
            if key.endswith("_DATA_DIR"):
                assert value in mounts, (name, key, value)
