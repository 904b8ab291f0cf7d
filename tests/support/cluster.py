"""Every tidemq service at once, as real processes: nameserver, broker, scheduler, checker and
the metrics sidecar's HTTP app (``run_job`` off: no Spark), sharing one token and cluster name.

For tests that look at all services alike (their OpenAPI documents, /docs): import the
``all_services`` fixture into the test module. Long polls are cut to ``LONG_POLL_MS`` so that a
generated request with a large ``wait_ms`` cannot stall a test.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port

LONG_POLL_MS = 100  # the broker's longest held pull, receive or check poll in these tests (ms)


@dataclass
class Cluster:
    broker: BrokerHandle
    nameserver: ServiceProcess
    scheduler: ServiceProcess
    checker: ServiceProcess
    sidecar: ServiceProcess

    def urls(self) -> dict[str, str]:
        """Service name → base URL."""
        return {"broker": self.broker.url, "nameserver": self.nameserver.url,
                "scheduler": self.scheduler.url, "checker": self.checker.url,
                "metrics": self.sidecar.url}


def _service(stack: ExitStack, name: str, prefix: str, workdir: Path,
             env: dict[str, str], port: int | None = None,
             acl: dict[str, str] | None = None) -> ServiceProcess:
    port = port or free_port()
    full = {f"TIDEMQ_{prefix}_PORT": str(port), f"TIDEMQ_{prefix}_TOKEN": TOKEN,
            f"TIDEMQ_{prefix}_LOG_LEVEL": "warning", **env,
            **{f"TIDEMQ_{prefix}_{k.upper()}": v for k, v in (acl or {}).items()}}
    proc = ServiceProcess(name, port, full, workdir).start()
    stack.callback(proc.stop)
    return proc


@contextmanager
def run_cluster(workdir: Path, redis_url: str,
                acl: dict[str, str] | None = None) -> Iterator[Cluster]:
    """``acl``: settings every service gets (``acl_file``, ``access_key``, ``secret_key``)."""
    cluster_name = unique("cluster")
    acl = acl or {}
    with ExitStack() as stack:
        nameserver = _service(stack, "nameserver", "NAMESRV", workdir, {}, acl=acl)
        scheduler_port = free_port()
        broker = stack.enter_context(run_broker(
            workdir, redis_url, cluster=cluster_name, nameservers=nameserver.url,
            scheduler_url=f"http://127.0.0.1:{scheduler_port}", long_poll_max_ms=LONG_POLL_MS,
            **acl))
        scheduler = _service(stack, "scheduler", "SCHEDULER", workdir, {
            "TIDEMQ_SCHEDULER_BROKER_URL": broker.url, "TIDEMQ_SCHEDULER_REDIS_URL": redis_url,
            "TIDEMQ_SCHEDULER_CLUSTER": cluster_name, "TIDEMQ_SCHEDULER_TEST_CLOCK": "true",
            "TIDEMQ_SCHEDULER_DATA_DIR": str(workdir / f"scheduler-{scheduler_port}"),
        }, scheduler_port, acl=acl)
        checker = _service(stack, "checker", "CHECKER", workdir, {
            "TIDEMQ_CHECKER_BROKER_URL": broker.url, "TIDEMQ_CHECKER_REDIS_URL": redis_url,
            "TIDEMQ_CHECKER_CLUSTER": cluster_name,
        }, acl=acl)
        sidecar = _service(stack, "metrics", "METRICS", workdir, {
            "TIDEMQ_METRICS_BROKER_URL": broker.url, "TIDEMQ_METRICS_RUN_JOB": "false",
            "TIDEMQ_METRICS_CLUSTER": cluster_name,
            "TIDEMQ_METRICS_DATA_DIR": str(workdir / "metrics"),
        }, acl=acl)
        yield Cluster(broker, nameserver, scheduler, checker, sidecar)


@pytest.fixture(scope="module")
def all_services(tmp_path_factory: pytest.TempPathFactory,
                 redis_server: RedisServer) -> Iterator[Cluster]:
    """Every service, shared by the tests of a module; a topic with one message is seeded."""
    with run_cluster(tmp_path_factory.mktemp("cluster"), redis_server.url) as running:
        topic = running.broker.create_topic(queues=2)
        running.broker.send(topic, {"body": "seed", "tag": "t", "keys": ["k"]})
        yield running
