"""Redis topologies for high-availability tests, real ``redis-server`` processes on free
loopback ports (only redis-server is needed: sentinels run as ``redis-server sentinel.conf
--sentinel``).

- ``SentinelGroup``: one master, one replica and three sentinels with a short
  ``down-after-milliseconds`` and ``failover-timeout``, so a SIGKILLed master is replaced within a
  few seconds; ``url`` is the ``redis+sentinel://`` URL services take.
- ``start_cluster_node``: a one-node Redis Cluster owning every slot, which refuses (CROSSSLOT)
  any multi-key command or transaction whose keys are in different slots.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.support.procs import free_port, stop_process, wait_port

MASTER_NAME = "tidemq"
QUORUM = 2  # sentinels that must agree the master is down
DOWN_AFTER_MS = 1000  # a master silent this long is subjectively down (ms)
FAILOVER_TIMEOUT_MS = 3000  # a stuck failover is retried after this (ms)


def _exe() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed: run scripts/install-system-deps.sh")
    return exe


class Node:
    """One redis-server process (data node or sentinel) on its own port and directory."""

    def __init__(self, workdir: Path, args: list[str], port: int) -> None:
        self.workdir = workdir
        self.args = args
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Node:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen([_exe(), *self.args], cwd=self.workdir,
                                         stdout=log, stderr=log)
        wait_port(self.port)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self.proc, sig)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)


class SentinelGroup:
    """Master + replica + three sentinels; ``kill_master`` and ``wait_failover`` drive a
    failover."""

    def __init__(self, workdir: Path, *, replicas: int = 1, sentinels: int = 3,
                 down_after_ms: int = DOWN_AFTER_MS,
                 failover_timeout_ms: int = FAILOVER_TIMEOUT_MS) -> None:
        self.workdir = workdir
        self.replica_count = replicas
        self.sentinel_count = sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.data: dict[int, Node] = {}  # port → data node (master or replica)
        self.sentinels: list[Node] = []

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> SentinelGroup:
        try:
            master = self._data_node(None)
            for _ in range(self.replica_count):
                self._data_node(master.port)
            self.wait_replicas(master.port, self.replica_count)
            for i in range(self.sentinel_count):
                self._sentinel(i, master.port)
            self.wait_sentinels(master.port)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in [*self.sentinels, *self.data.values()]:
            node.stop()

    def _data_node(self, replica_of: int | None, port: int | None = None) -> Node:
        port = port or free_port()
        args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", ".",
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                "--protected-mode", "no"]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        node = Node(self.workdir / f"redis-{port}", args, port).start()
        self.data[port] = node
        return node

    def _sentinel(self, index: int, master_port: int) -> Node:
        port = free_port()
        workdir = self.workdir / f"sentinel-{index}"
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "sentinel.conf"  # sentinels rewrite their config: one file each
        conf.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", "protected-mode no", f"dir {workdir}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
            f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {MASTER_NAME} 1", ""]))
        node = Node(workdir, [str(conf), "--sentinel"], port).start()
        self.sentinels.append(node)
        return node

    # --- what the tests use -------------------------------------------------------------------

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def master_port(self) -> int:
        """The master the first answering sentinel names."""
        for node in self.sentinels:
            try:
                with node.client() as c:
                    addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                return int(addr[1])
            except redis.RedisError:
                continue
        raise RuntimeError("no sentinel answered")

    def master(self) -> Node:
        return self.data[self.master_port()]

    def kill_master(self) -> int:
        """SIGKILL the current master; returns its port."""
        port = self.master_port()
        self.data[port].stop(signal.SIGKILL)
        return port

    def restart(self, port: int) -> Node:
        """Start a killed data node again on its port and directory (its append-only file)."""
        node = self.data[port]
        node.start()
        return node

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Wait until every sentinel names a new master that says it is one; returns its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ports = {self._ask(node) for node in self.sentinels}
                if len(ports) == 1 and old_port not in ports:
                    port = ports.pop()
                    with self.data[port].client() as c:
                        if c.execute_command("ROLE")[0] == "master":
                            return port
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"no failover away from port {old_port} within {timeout}s")

    def wait_replicas(self, master_port: int, count: int, timeout: float = 20.0) -> None:
        """Wait until the master lists ``count`` replicas online."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.data[master_port].client() as c:
                    info = c.info("replication")
                online = [v for k, v in info.items()
                          if k.startswith("slave") and isinstance(v, dict)
                          and v.get("state") == "online"]
                if len(online) >= count:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"master {master_port}: {count} replica(s) not online in {timeout}s")

    def wait_sentinels(self, master_port: int, timeout: float = 20.0) -> None:
        """Wait until every sentinel sees the master, its replicas and the other sentinels."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(self._sees_all(node, master_port) for node in self.sentinels):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"sentinels did not discover each other within {timeout}s")

    def _ask(self, node: Node) -> int:
        with node.client() as c:
            addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        return int(addr[1])

    def _sees_all(self, node: Node, master_port: int) -> bool:
        with node.client() as c:
            state = c.sentinel_master(MASTER_NAME)
        return (int(state["port"]) == master_port
                and int(state["num-slaves"]) >= self.replica_count
                and int(state["num-other-sentinels"]) >= self.sentinel_count - 1)


def start_cluster_node(workdir: Path, timeout: float = 15.0) -> Node:
    """A cluster-enabled redis-server that owns all 16384 slots; its URL is plain redis://."""
    port = free_port()
    # the bus port is named: derived (port + 10000), a free port above 55535 cannot start
    node = Node(workdir, ["--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                          "--cluster-port", str(free_port()),
                          "--cluster-config-file", "nodes.conf", "--save", "",
                          "--appendonly", "no", "--protected-mode", "no"], port).start()
    try:
        with node.client() as c:
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            deadline = time.monotonic() + timeout
            while "cluster_state:ok" not in str(c.execute_command("CLUSTER", "INFO")):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cluster node {port} not ok within {timeout}s")
                time.sleep(0.05)
    except BaseException:
        node.stop()
        raise
    return node
