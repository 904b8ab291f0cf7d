"""Every code block of README.md runs as printed against a real system.

The system is what ``tidemq up`` starts (``tidemq_server.cli.plan.plan_services``: nameserver,
broker, checker, scheduler; the Spark sidecar is left out) on free ports, with the session's
redis-server. Before running a block, the default addresses it names (``127.0.0.1:10911``, ...)
are replaced by the ports actually used — nothing else in the block changes. Blocks run in README
order, each in the same working directory:

- ``python`` blocks as scripts, with this interpreter;
- ``bash`` blocks with ``set -euo pipefail`` and ``curl`` made to fail on an error status
  (``--fail-with-body``), so an example that answers 4xx/5xx fails here instead of printing an
  error a reader would have to spot.

A block may opt out only with ``<!-- test_readme: not run (reason) -->`` on the line before it.
Two settings are shortened so the check-back example takes seconds, not the default ~40 s: the
checker scans every 500 ms and checks a message 1 s after it was stored. The outbox example's
PostgreSQL (``127.0.0.1:5432``, database and role ``shop``) is the session's test server
(tests/support/postgres.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.support.postgres import PostgresServer
from tests.support.procs import REPO, RedisServer, ServiceProcess, free_port
from tidemq_server.cli.plan import UpOptions, plan_services

pytestmark = pytest.mark.integration

README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)
SKIP = re.compile(r"^<!-- test_readme: not run \((.+)\) -->$")
ADDRESS = re.compile(r"127\.0\.0\.1:(\d+)")
RUNNABLE = {"bash", "python"}
BLOCK_TIMEOUT_S = 180.0
BASH_PRELUDE = """set -euo pipefail
curl() { command curl --silent --show-error --fail-with-body "$@"; echo; }
"""
POSTGRES_PORT = 5432  # the default port the outbox example names
FAST_CHECKS = {"TIDEMQ_CHECKER_CHECK_INTERVAL_MS": "500",
               "TIDEMQ_CHECKER_TRANSACTION_TIMEOUT_MS": "1000"}


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence
    skipped: str | None  # the reason given in the opt-out comment


def readme_blocks() -> list[Block]:
    text = README.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.match(before)
        blocks.append(Block(match.group(1), match.group(2), line,
                            skip.group(1) if skip else None))
    return blocks


@dataclass
class System:
    urls: dict[int, str]  # default port → the running service's address
    workdir: Path
    shop_db: str  # the outbox example's PostgreSQL database (asyncpg URL)

    @property
    def broker(self) -> str:
        return f"http://{self.urls[10911]}"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
           postgres_server: PostgresServer) -> Iterator[System]:
    root = tmp_path_factory.mktemp("readme")
    defaults = UpOptions()
    opts = UpOptions(data_dir=root / "data", cluster=f"readme-{uuid.uuid4().hex[:8]}",
                     nameserver_port=free_port(), broker_port=free_port(),
                     checker_port=free_port(), scheduler_port=free_port(),
                     broker_grpc_port=0, metrics=False)
    specs = plan_services(opts, redis_url=redis_server.url, token=uuid.uuid4().hex)
    assert [s.name for s in specs] == ["nameserver", "broker", "checker", "scheduler",
                                       "console"]
    started: list[ServiceProcess] = []
    urls = {POSTGRES_PORT: f"127.0.0.1:{postgres_server.port}"}
    shop = postgres_server.database("shop", owner="shop")
    try:
        for spec in specs:
            env = dict(spec.env)
            if spec.name == "checker":
                env.update(FAST_CHECKS)
            started.append(ServiceProcess(spec.name, spec.port, env, root / "logs").start())
            default = int(getattr(defaults, f"{spec.name}_port"))
            urls[default] = f"127.0.0.1:{spec.port}"
        work = root / "work"
        work.mkdir()
        yield System(urls, work, postgres_server.url(shop, driver="postgresql"))
    finally:
        for proc in reversed(started):
            proc.stop()


def localize(block: Block, system: System) -> str:
    """The block with each default address replaced by the running service's."""
    def replace(match: re.Match[str]) -> str:
        port = int(match.group(1))
        assert port in system.urls, (f"README.md:{block.line} names 127.0.0.1:{port}, which is "
                                     "not a service this test starts")
        return system.urls[port]
    return ADDRESS.sub(replace, block.code)


def run(block: Block, system: System, index: int) -> subprocess.CompletedProcess[str]:
    code = localize(block, system)
    if block.lang == "python":
        script = system.workdir / f"block{index}.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    else:
        script = system.workdir / f"block{index}.sh"
        script.write_text(BASH_PRELUDE + code)
        argv = ["bash", str(script)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(argv, cwd=system.workdir, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S, check=False)


def test_every_block_is_run_or_says_why_not() -> None:
    blocks = readme_blocks()
    assert blocks, "README.md has no code blocks"
    for block in blocks:
        assert block.lang in RUNNABLE or block.skipped, (
            f"README.md:{block.line}: a ```{block.lang} block is neither bash nor python; mark "
            "it with <!-- test_readme: not run (reason) --> if it cannot run")
    assert sum(b.skipped is None for b in blocks) >= 5


def test_readme_blocks_run_as_printed(system: System) -> None:
    ran = 0
    for index, block in enumerate(readme_blocks()):
        if block.skipped:
            continue
        done = run(block, system, index)
        assert done.returncode == 0, (
            f"README.md:{block.line} ({block.lang}) exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
        ran += 1
    assert ran >= 5
    with httpx.Client(base_url=system.broker, timeout=10.0) as http:
        # the check-back example answered its check: nothing of orders-tx is left open
        for group in ("orders-tx", "shop-orders"):
            pending = http.get("/v1/transactions", params={"producer_group": group}).json()
            assert pending["transactions"] == [], (group, pending)
        assert http.get("/v1/messages/order-43").json()["state"] == "committed"
        assert http.get("/v1/messages/pay-check-43").json()["state"] == "cancelled"
    # the outbox example: one order committed with its outbox row, the failed one rolled back
    assert asyncio.run(count_rows(system.shop_db, "orders", "tidemq_outbox")) == [1, 1]


async def count_rows(url: str, *tables: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        return [int(await conn.fetchval(f"select count(*) from {t}")) for t in tables]
    finally:
        await conn.close()
