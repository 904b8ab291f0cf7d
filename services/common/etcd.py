"""A small asyncio etcd v3 client over etcd's JSON gateway (``/v3/...``), with httpx.

Only what leader election needs: leases (grant, keep-alive, revoke), range reads of a key or a
prefix, compare-and-swap transactions, and a watch stream. Keys and values are bytes on the
wire as base64 (the gateway's JSON mapping of protobuf ``bytes``); this module takes and gives
``str`` keys and ``bytes`` values. Every endpoint is tried in turn: the first that answers wins
and is asked first next time.

Errors: ``EtcdError`` (every endpoint failed, or etcd answered an error); ``LeaseLost`` (a
keep-alive found the lease gone: expired or revoked).

Why the gateway and not a gRPC client from PyPI: see docs/architecture.md ("etcd client").
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

ETCD_TIMEOUT_S = 2.0  # one request to one endpoint (s)


class EtcdError(Exception):
    """etcd could not be asked, or answered with an error."""


class LeaseLost(EtcdError):
    """The lease is gone (expired or revoked): whatever was bound to it is deleted."""


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(data: str | None) -> bytes:
    return base64.b64decode(data) if data else b""


def prefix_end(prefix: str) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch: ``kind`` "PUT" or "DELETE" (a lease lapsing or revoked
    deletes its keys), at store ``revision``."""

    kind: str
    key: str
    revision: int


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int  # 0 when not bound to a lease


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(key=_unb64(raw.get("key")).decode(), value=_unb64(raw.get("value")),
                    create_revision=int(raw.get("create_revision", 0)),
                    mod_revision=int(raw.get("mod_revision", 0)), lease=int(raw.get("lease", 0)))


# --- transaction pieces (the gateway's JSON for etcdserverpb.Compare / RequestOp) ---------------

def absent(key: str) -> dict[str, Any]:
    """Compare: ``key`` does not exist (its create revision is 0)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def mod_revision_is(key: str, revision: int) -> dict[str, Any]:
    """Compare: ``key`` was last written at ``revision`` (0: it does not exist)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def put(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


class EtcdClient:
    """etcd v3 through its JSON gateway; ``endpoints`` are base URLs like http://127.0.0.1:2379."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = ETCD_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.endpoints = [e.strip().rstrip("/") for e in endpoints if e.strip()]
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        self.endpoints = [e if "://" in e else "http://" + e for e in self.endpoints]
        self._good = 0
        # an https:// endpoint is verified against the process's CA bundle (TIDEMQ_TLS_CA)
        self._http = httpx.AsyncClient(timeout=timeout_s, transport=transport,
                                       verify=client_context())

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        errors = []
        n = len(self.endpoints)
        for i in range(n):
            index = (self._good + i) % n
            base = self.endpoints[index]
            try:
                resp = await self._http.post(base + path, json=body)
            except httpx.HTTPError as exc:
                errors.append(f"{base}: {type(exc).__name__}: {exc}")
                continue
            try:
                answer = resp.json()
            except ValueError:
                answer = {"error": resp.text[:200]}
            if resp.status_code != 200 or "error" in answer:
                message = str(answer.get("error") or answer.get("message") or resp.text[:200])
                if "lease not found" in message:
                    raise LeaseLost(message)
                errors.append(f"{base}: HTTP {resp.status_code}: {message}")
                continue
            self._good = index
            return answer
        raise EtcdError(f"etcd {path} failed: " + "; ".join(errors))

    # --- leases -------------------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; answers its id."""
        answer = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"])

    async def keepalive(self, lease: int) -> int:
        """Renew ``lease`` once; answers its TTL (s). Raises LeaseLost when it is gone."""
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        ttl = int(answer.get("result", {}).get("TTL", 0))
        if ttl <= 0:
            raise LeaseLost(f"lease {lease:x} expired")
        return ttl

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now: every key bound to it is deleted at once."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except LeaseLost:
            pass

    # --- keys ---------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        answer = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        answer = await self._call("/v3/kv/range", {"key": _b64(prefix),
                                                   "range_end": _b64(prefix_end(prefix))})
        return [_kv(raw) for raw in answer.get("kvs") or []]

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write ``key``; answers the store's revision after the write."""
        body = put(key, value, lease)["request_put"]
        answer = await self._call("/v3/kv/put", body)
        return int(answer.get("header", {}).get("revision", 0))

    async def delete(self, key: str) -> None:
        await self._call("/v3/kv/deleterange", {"key": _b64(key)})

    async def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
                  failure: list[dict[str, Any]] | None = None) -> bool:
        """If every ``compare`` holds, run ``success`` (else ``failure``); answers which."""
        answer = await self._call("/v3/kv/txn", {"compare": compare, "success": success,
                                                 "failure": failure or []})
        return bool(answer.get("succeeded", False))

    # --- watch --------------------------------------------------------------------------------

    async def watch_prefix(self, prefix: str) -> AsyncIterator[list[WatchEvent]]:
        """Yield the events of each change under ``prefix`` until the stream ends (then the
        caller reads the keys again and watches anew)."""
        body = {"create_request": {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}}
        base = self.endpoints[self._good]
        timeout = httpx.Timeout(ETCD_TIMEOUT_S, read=None)
        try:
            async with self._http.stream("POST", base + "/v3/watch", json=body,
                                         timeout=timeout) as resp:
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    header = int(result.get("header", {}).get("revision", 0))
                    events = [WatchEvent(str(ev.get("type", "PUT")),
                                         _unb64(ev.get("kv", {}).get("key")).decode(),
                                         int(ev.get("kv", {}).get("mod_revision", 0)) or header)
                              for ev in result.get("events") or []]
                    if events:
                        yield events
        except (httpx.HTTPError, ValueError) as exc:
            raise EtcdError(f"etcd watch on {base} ended: {type(exc).__name__}: {exc}") from exc
