"""The metrics job on a real Spark standalone cluster, both ways the docs give: spark-submit of
``services/metrics/job.py`` (with the ``--py-files`` zip) and the sidecar with a ``spark://``
master. A master and one worker are started from the installed pyspark (``spark-class``); the
master must have run both applications, and the check/discard counts of both runs must equal a
``local[*]`` run's over the same events. A serve-only sidecar over the spark-submit output then
reports that job: its master and application id, up, not ``local[*]``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyspark
import pytest

from tests.metrics.test_job import expected, run_once, without_batch
from tests.support.broker import BrokerHandle, unique
from tests.support.metrics import parse_exposition, put_events, scenario
from tests.support.procs import REPO, ServiceProcess, free_port, stop_process, wait_port
from tests.support.wait import wait_until
from tidemq_server.metrics.package import build

pytestmark = pytest.mark.integration

SPARK_BIN = Path(pyspark.__file__).resolve().parent / "bin"
#: the JVMs of a master, a worker, a driver and an executor on a 2-core test machine
JVM_ENV = {"SPARK_DAEMON_MEMORY": "256m", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_LOCAL_IP": "127.0.0.1"}  # loopback only, never the host's other interfaces


class Cluster:
    def __init__(self, master_port: int, ui_port: int) -> None:
        self.url = f"spark://127.0.0.1:{master_port}"
        self.ui = f"http://127.0.0.1:{ui_port}"

    def apps(self) -> list[dict[str, Any]]:
        """Every application the master knows: running and completed."""
        state = httpx.get(f"{self.ui}/json/", timeout=5).json()
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def wait_workers(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                alive = [w for w in httpx.get(f"{self.ui}/json/", timeout=5).json()["workers"]
                         if w.get("state") == "ALIVE"]
                if alive:
                    return
            except (httpx.HTTPError, ValueError):  # the web UI starts after the RPC port
                pass
            assert time.monotonic() < deadline, "no worker registered with the master"
            time.sleep(0.2)


def spark_env() -> dict[str, str]:
    return {**os.environ, **JVM_ENV, "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", ""))
                                          if p)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if shutil.which("java") is None:
        pytest.fail("java is not installed: run scripts/install-system-deps.sh")
    work = tmp_path_factory.mktemp("spark-cluster")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    found = Cluster(port, ui)
    env = spark_env()
    logs = [open(work / name, "wb") for name in ("master.log", "worker.log")]
    master = subprocess.Popen(
        [str(SPARK_BIN / "spark-class"), "org.apache.spark.deploy.master.Master",
         "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
        env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    worker = None
    try:
        wait_port(port, timeout=120)
        worker = subprocess.Popen(
            [str(SPARK_BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker",
             "--host", "127.0.0.1", "--cores", "2", "--memory", "1g",
             "--webui-port", str(worker_ui), "--work-dir", str(work / "worker"), found.url],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT)
        found.wait_workers()
        yield found
    finally:
        stop_process(worker)
        stop_process(master)
        for log in logs:
            log.close()


def counts(text: str) -> dict[Any, float]:
    return without_batch(parse_exposition(text))


def test_spark_submit_and_the_sidecar_run_on_the_standalone_master(
        cluster: Cluster, spark: Any, events_broker: BrokerHandle, token: str,
        tmp_path: Path) -> None:
    topic = events_broker.create_topic(unique("Events"), queues=2)
    bodies = scenario(group=unique("shop"))
    put_events(events_broker.url, token, topic, bodies, queues=2)
    local_text, _ = run_once(spark, events_broker, token, topic, tmp_path / "local",
                             max_events=10_000)
    assert counts(local_text) == without_batch(expected(bodies))  # the local[*] reference

    # 1. spark-submit, as services/metrics/README.md documents it
    zip_path = build(tmp_path / "tidemq-metrics.zip")
    out = tmp_path / "submitted"
    submit = subprocess.run(
        [str(SPARK_BIN / "spark-submit"), "--master", cluster.url,
         "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=512m",
         "--conf", f"spark.pyspark.python={sys.executable}",
         "--py-files", str(zip_path), str(REPO / "services" / "metrics" / "job.py"),
         "--broker-url", events_broker.url, "--token", token, "--topic", topic,
         "--output", str(out / "metrics.prom"), "--checkpoint", str(out / "checkpoint"),
         "--once"],
        env={k: v for k, v in spark_env().items() if k != "TIDEMQ_METRICS_MASTER"},
        capture_output=True, text=True, timeout=280, cwd=tmp_path)
    log = submit.stdout + submit.stderr
    assert submit.returncode == 0, log[-4000:]
    assert f"master {cluster.url}" in log, log[-4000:]  # not local[*]
    print("\n".join(line for line in log.splitlines()  # the job's own lines (pytest -s)
                    if any(w in line for w in ("spark session ready", "query tidemq", "batch ",
                                               "available-now run"))))
    submitted = [a for a in cluster.apps() if a["name"] == "tidemq-metrics"]
    assert submitted, cluster.apps()
    assert counts((out / "metrics.prom").read_text()) == counts(local_text)

    # 2. the sidecar with a spark:// master (TIDEMQ_METRICS_MASTER), one available-now run
    port = free_port()
    sidecar = ServiceProcess("metrics", port, {
        "TIDEMQ_METRICS_PORT": str(port), "TIDEMQ_METRICS_BROKER_URL": events_broker.url,
        "TIDEMQ_METRICS_TOKEN": token, "TIDEMQ_METRICS_DATA_DIR": str(tmp_path / "sidecar"),
        "TIDEMQ_METRICS_MASTER": cluster.url, "TIDEMQ_METRICS_MODE": "once",
        "TIDEMQ_METRICS_TOPIC": topic,
        "TIDEMQ_METRICS_SPARK_CONF": "spark.executor.memory=512m,spark.driver.memory=512m",
        "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }, tmp_path / "sidecar-logs").start()
    try:

        def done() -> dict[str, Any] | None:
            status: dict[str, Any] = httpx.get(f"{sidecar.url}/v1/status").json()
            assert status["state"] not in ("restarting", "stopped"), (status, sidecar.logs())
            return status if status["state"] == "done" else None

        status = wait_until(done, timeout=240, every=0.5, what="the available-now run done")
        assert status["master"] == cluster.url and status["up"] is True
        assert len([a for a in cluster.apps() if a["name"] == "tidemq-metrics"]) == 2
        print("master's applications:", [(a["id"], a["name"], a.get("state"))
                                         for a in cluster.apps()])
        served = httpx.get(f"{sidecar.url}/metrics").text
        assert {k: v for k, v in counts(served).items()
                if k[0].startswith("tidemq_transaction_")} == {
            k: v for k, v in counts(local_text).items() if k[0].startswith("tidemq_transaction_")}
    finally:
        sidecar.stop()

    # 3. serve-only over spark-submit's output: the job that wrote it, not local[*]
    port = free_port()
    serve = ServiceProcess("metrics", port, {
        "TIDEMQ_METRICS_PORT": str(port), "TIDEMQ_METRICS_RUN_JOB": "false",
        "TIDEMQ_METRICS_DATA_DIR": str(out), "TIDEMQ_METRICS_STALE_AFTER_S": "900",
    }, tmp_path / "serve-logs").start()
    try:
        status = httpx.get(f"{serve.url}/v1/status").json()
        assert status["state"] == "external" and status["up"] is True, status
        assert status["master"] == cluster.url and status["mode"] == "once"
        assert status["app_id"] in {a["id"] for a in cluster.apps()}
        assert status["job_finished_age_s"] is not None
        samples = parse_exposition(httpx.get(f"{serve.url}/metrics").text)
        assert samples[("tidemq_metrics_job_up", frozenset())] == 1
    finally:
        serve.stop()
