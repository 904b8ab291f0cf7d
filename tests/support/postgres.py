"""A real PostgreSQL (Debian's ``postgresql`` package) on a free port, for the outbox tests.

``initdb`` makes a cluster in a fresh temporary directory (trust authentication on loopback,
superuser ``tidemq``), and ``postgres`` serves it on 127.0.0.1 with durability switched off
(``fsync=off``: a test database needs no crash safety). PostgreSQL refuses to run as root: when
the tests run as root, both run as the ``postgres`` user the Debian package creates, in a
directory outside pytest's root-only temp tree. ``database()`` creates an empty database per
test. The server is stopped and its directory removed at the end.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from tests.support.procs import START_TIMEOUT_S, free_port, stop_process

SUPERUSER = "tidemq"


def pg_bin(name: str) -> str:
    """A PostgreSQL program: from PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                        key=lambda p: int(Path(p).parts[-3]))
    if not candidates:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: run "
                           "scripts/install-system-deps.sh (Debian package postgresql)")
    return candidates[-1]


class PostgresServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tidemq-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:  # postgres will not run as root: run it as Debian's postgres
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def url(self, database: str = "postgres", driver: str = "postgresql+asyncpg") -> str:
        return f"{driver}://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        subprocess.run([pg_bin("initdb"), "-D", str(self.data), "-U", SUPERUSER,
                        "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
                       check=True, capture_output=True, cwd=self.root, **self._as)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [pg_bin("postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
                 "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=200"],
                stdout=log, stderr=log, cwd=self.root, **self._as)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._accepts():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("postgres did not start:\n" + self.log_path.read_text()[-3000:])
            time.sleep(0.1)
        return self

    def _accepts(self) -> bool:
        async def probe() -> None:
            conn = await asyncpg.connect(self.url(driver="postgresql"), timeout=2)
            await conn.close()
        try:
            asyncio.run(probe())
            return True
        except (TimeoutError, OSError, asyncpg.PostgresError):
            return False

    def database(self, name: str | None = None, owner: str = SUPERUSER) -> str:
        """A new empty database (a fresh name unless given) owned by ``owner`` (a login role,
        created if missing); its name."""
        name = name or f"t_{uuid.uuid4().hex[:12]}"

        async def create() -> None:
            conn = await asyncpg.connect(self.url(driver="postgresql"))
            try:
                if owner != SUPERUSER and not await conn.fetchval(
                        "select 1 from pg_roles where rolname = $1", owner):
                    await conn.execute(f'create role "{owner}" login')
                await conn.execute(f'create database "{name}" owner "{owner}"')
            finally:
                await conn.close()
        asyncio.run(create())
        return name

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGINT)  # SIGINT: postgres's fast shutdown
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)
