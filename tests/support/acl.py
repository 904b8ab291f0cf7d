"""A cluster with accounts on (tests/system/test_acl.py, tests/broker/grpc/test_acl_*.py).

``acl_cluster`` starts a nameserver, a broker (REST and gRPC), a checker and a scheduler, all
reading one ACL file and signing their own calls with the ``services`` account (cluster admin
only). ``USERS`` are the accounts the tests act as; ``AclCluster.client(user)`` is an httpx
client signing as that user (``None``: unsigned).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.broker import TOKEN, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port, wait_port
from tidemq_server.common.auth.client import SigningAuth

#: name → (access key, secret key, rules)
USERS: dict[str, tuple[str, str, list[dict[str, Any]]]] = {
    "admin": ("AK_ADMIN", "sk-admin", [{"resource": "*", "actions": ["all"]}]),
    "services": ("AK_SVC", "sk-svc", [{"resource": "cluster", "actions": ["admin"]}]),
    "producer": ("AK_PROD", "sk-prod", [
        {"resource": "topic:orders-*", "actions": ["pub"]},
        {"resource": "producer_group:pg-orders", "actions": ["pub"]}]),
    "consumer": ("AK_CONS", "sk-cons", [
        {"resource": "topic:orders-*", "actions": ["sub"]},
        {"resource": "group:billing", "actions": ["sub"]},
        {"resource": "topic:orders-secret", "actions": ["all"], "decision": "deny"}]),
    "nobody": ("AK_NONE", "sk-none", []),
}


def acl_document(users: dict[str, tuple[str, str, list[dict[str, Any]]]] | None = None,
                 ) -> dict[str, Any]:
    chosen = USERS if users is None else users
    return {"default": "deny", "users": [
        {"name": name, "access_key": ak, "secret_key": sk, "rules": rules}
        for name, (ak, sk, rules) in chosen.items()]}


def write_acl(path: Path, users: dict[str, tuple[str, str, list[dict[str, Any]]]] | None = None,
              ) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(acl_document(users)))
    tmp.replace(path)


def auth_of(user: str) -> SigningAuth:
    ak, sk, _ = USERS[user]
    return SigningAuth(ak, sk)


@dataclass
class AclCluster:
    acl_file: Path
    broker_url: str
    nameserver_url: str
    grpc_endpoint: str
    work: Path
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    clients: dict[str | None, httpx.Client] = field(default_factory=dict)

    def client(self, user: str | None) -> httpx.Client:
        """An httpx client signing as ``user`` (None: unsigned), one per user."""
        if user not in self.clients:
            self.clients[user] = httpx.Client(timeout=10.0, auth=auth_of(user) if user else None)
        return self.clients[user]

    def close(self) -> None:
        for http in self.clients.values():
            http.close()


def _account_env(prefix: str, acl_file: Path) -> dict[str, str]:
    ak, sk, _ = USERS["services"]
    return {f"{prefix}ACL_FILE": str(acl_file), f"{prefix}ACCESS_KEY": ak,
            f"{prefix}SECRET_KEY": sk}


@contextmanager
def acl_cluster(work: Path, redis: RedisServer, grpc: bool = True) -> Iterator[AclCluster]:
    acl_file = work / "acl.yaml"
    write_acl(acl_file)
    name = unique("cluster")
    ns_port, broker_port = free_port(), free_port()
    grpc_port = free_port() if grpc else 0
    ports = {"checker": free_port(), "scheduler": free_port()}
    procs: dict[str, ServiceProcess] = {}
    cluster: AclCluster | None = None
    try:
        procs["nameserver"] = ServiceProcess("nameserver", ns_port, {
            "TIDEMQ_NAMESRV_PORT": str(ns_port), "TIDEMQ_NAMESRV_TOKEN": TOKEN,
            **_account_env("TIDEMQ_NAMESRV_", acl_file)}, work).start()
        procs["broker"] = ServiceProcess("broker", broker_port, {
            "TIDEMQ_BROKER_PORT": str(broker_port), "TIDEMQ_BROKER_GRPC_PORT": str(grpc_port),
            "TIDEMQ_BROKER_DATA_DIR": str(work / "broker"), "TIDEMQ_BROKER_CLUSTER": name,
            "TIDEMQ_BROKER_REDIS_URL": redis.url, "TIDEMQ_BROKER_TOKEN": TOKEN,
            "TIDEMQ_BROKER_NAMESERVERS": procs["nameserver"].url,
            "TIDEMQ_BROKER_FLUSH_INTERVAL_MS": "50",
            "TIDEMQ_BROKER_SEGMENT_BYTES": str(64 * 1024 * 1024),
            "TIDEMQ_BROKER_SCHEDULER_URL": f"http://127.0.0.1:{ports['scheduler']}",
            **_account_env("TIDEMQ_BROKER_", acl_file)}, work).start()
        if grpc:
            wait_port(grpc_port)
        for sidecar, extra in (("checker", {"CHECK_INTERVAL_MS": "500",
                                            "TRANSACTION_TIMEOUT_MS": "1000"}),
                               ("scheduler", {})):
            prefix = f"TIDEMQ_{sidecar.upper()}_"
            env = {f"{prefix}{k}": v for k, v in {
                "PORT": str(ports[sidecar]), "CLUSTER": name, "TOKEN": TOKEN,
                "BROKER_URL": procs["broker"].url, "REDIS_URL": redis.url,
                "DATA_DIR": str(work / sidecar), **extra}.items()}
            procs[sidecar] = ServiceProcess(sidecar, ports[sidecar],
                                            {**env, **_account_env(prefix, acl_file)},
                                            work).start()
        cluster = AclCluster(acl_file, procs["broker"].url, procs["nameserver"].url,
                             f"127.0.0.1:{grpc_port}", work, procs)
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        for proc in reversed(procs.values()):
            proc.stop()
