"""A replica's fetch loop: stream the primary's log from this copy's end, write it at the same
offsets, dispatch it, learn the high-water mark and the metadata version.

Before the first fetch (and after any sign of divergence) the follower compares its epoch
history with the primary's and truncates its log back to where they diverge. A primary that
has deleted the segments this copy still needs answers ``out_of_range``: the follower says so
loudly (log, metric, /healthz) and keeps retrying slowly instead of skipping data.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from tidemq.protocol import CONTENT_MSGPACK, decode_payload

from tidemq_server.broker.replication.chunkwire import FETCH_ACCEPT, is_chunk, parse_chunk
from tidemq_server.broker.replication.epochs import divergence_point, parse_entries
from tidemq_server.broker.replication.fetchclient import FetchAnswer, LeanClient
from tidemq_server.broker.replication.role import BrokerRole
from tidemq_server.broker.store.replicated import ChunkError
from tidemq_server.broker.store.store import MessageStore
from tidemq_server.common.auth.client import service_auth
from tidemq_server.common.constants import TOKEN_HEADER
from tidemq_server.common.tls import client_context

log = logging.getLogger(__name__)

FETCH_PATH = "/internal/v1/replication/fetch"
EPOCHS_PATH = "/internal/v1/replication/epochs"
H_REASON = "x-tidemq-refused"  # why a fetch was refused: not_primary, out_of_range, diverged


@dataclass(slots=True)
class FollowerConfig:
    broker_id: int
    self_address: str
    token: str
    wait_ms: int
    max_bytes: int
    retry_s: float
    durable: bool  # flush=sync: fsync before acknowledging
    lean_client: bool = True  # fetch through fetchclient.LeanClient, not httpx


class Follower:
    def __init__(self, store: MessageStore, role: BrokerRole, config: FollowerConfig,
                 on_hwm: Callable[[int], None],
                 on_meta: Callable[[str, str], Awaitable[None]],
                 on_truncate: Callable[[int], None]) -> None:
        self.store = store
        self.role = role
        self.config = config
        self.on_hwm = on_hwm
        self.on_meta = on_meta  # (primary address, version) when the primary's metadata changed
        self.on_truncate = on_truncate  # (offset) after the log was cut back
        headers = {"accept": CONTENT_MSGPACK}
        if config.token:
            headers[TOKEN_HEADER] = config.token
        # signed as this broker's account when ACL is on; verifies a TLS primary with the CA
        timeout_s = 5.0 + config.wait_ms / 1000
        self._client: LeanClient | httpx.AsyncClient = (
            LeanClient(headers, timeout_s, client_context(), service_auth())
            if config.lean_client else
            httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout_s),
                              verify=client_context(), auth=service_auth()))
        self.primary: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.out_of_range: str | None = None  # why this copy cannot catch up (None: it can)
        self.last_error: str | None = None
        self.primary_end = 0
        self.known_hwm = -1  # the primary's HWM in its last answer (-1: none yet)
        self.meta_version = ""
        self.stats = {"fetches": 0, "fetched_bytes": 0, "fetched_records": 0, "errors": 0,
                      "truncated_bytes": 0}

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def lag_bytes(self) -> int:
        return max(0, self.primary_end - self.store.log.write_offset)

    async def start(self, primary: str) -> None:
        await self.stop()
        self.primary = primary.rstrip("/")
        self.known_hwm = -1
        self._task = asyncio.create_task(self._run(self.primary), name="repl-follow")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    async def close(self) -> None:
        await self.stop()
        await self._client.aclose()

    # --- the loop --------------------------------------------------------------------------
    async def _run(self, primary: str) -> None:
        log.info("following primary %s from offset %d", primary, self.store.log.write_offset)
        reconciled = False
        while True:
            try:
                if not reconciled:
                    await self.reconcile(primary)
                    reconciled = True
                reconciled = await self._fetch_once(primary)
                self.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: say it once, retry; never stop following
                self.stats["errors"] += 1
                text = f"{type(exc).__name__}: {exc}"
                if text != self.last_error:
                    log.warning("replication from %s: %s; retrying every %.1f s", primary, text,
                                self.config.retry_s)
                self.last_error = text
                if isinstance(exc, ChunkError):
                    reconciled = False
                await asyncio.sleep(self.config.retry_s)

    async def reconcile(self, primary: str) -> int:
        """Truncate this log back to where its epoch history and the primary's diverge."""
        resp = await self._client.get(primary + EPOCHS_PATH)
        if resp.status_code != 200:
            raise ValueError(f"epochs from {primary}: HTTP {resp.status_code} {resp.text[:200]}")
        body = decode_payload(resp.content, resp.headers.get("content-type"))
        theirs = parse_entries(body["epochs"])
        mine = self.role.epochs.entries
        my_end = self.store.log.write_offset
        point = divergence_point(mine, my_end, theirs, int(body["log_end"]))
        if point < my_end:
            removed = await self.store.truncate(point)  # on the loop: never beside a writer batch
            self.stats["truncated_bytes"] += removed
            self.on_truncate(point)
            log.warning("replication: truncated the diverged tail [%d, %d) before following %s",
                        point, my_end, primary)
        await asyncio.to_thread(self.role.epochs.truncate, point)
        return point

    async def _fetch_once(self, primary: str) -> bool:
        """One fetch; False when the follower must reconcile before the next."""
        store, cfg = self.store, self.config
        start = store.log.write_offset
        params: dict[str, str | int] = {
            "broker_id": cfg.broker_id, "address": cfg.self_address, "from": start,
            "flushed": min(store.log.synced_offset, start), "epoch": self.role.epoch,
            "wait_ms": cfg.wait_ms, "max_bytes": cfg.max_bytes, "hwm": self.known_hwm}
        resp = await self._client.get(primary + FETCH_PATH, params=params,
                                      headers={"accept": FETCH_ACCEPT})
        if resp.status_code != 200:
            return self._refused(primary, resp)
        ctype = resp.headers.get("content-type")
        # the raw chunk with its fields in headers; msgpack from a primary older than that
        h = (parse_chunk(resp.headers, resp.content) if is_chunk(ctype)
             else decode_payload(resp.content, ctype))
        epoch = int(h["epoch"])
        if epoch < self.role.epoch:
            raise ValueError(f"answer of epoch {epoch} refused: this replica knows epoch "
                             f"{self.role.epoch}")
        if int(h["segment_bytes"]) != store.log.segment_bytes:
            raise ValueError(f"the primary's segment size is {h['segment_bytes']} bytes, this "
                             f"copy's {store.log.segment_bytes}: give every copy the same "
                             "TIDEMQ_BROKER_SEGMENT_BYTES")
        self.role.learn_epoch(epoch)
        if self.out_of_range:
            log.warning("replication: back in range of %s", primary)
            self.out_of_range = None
        data = h["data"]
        if not isinstance(data, bytes):
            raise ValueError("a fetch answer without raw bytes (ask for msgpack)")
        theirs = parse_entries(h["epochs"])
        if self.role.epochs.entries != [e for e in theirs if e.start_offset <= start + len(data)]:
            await asyncio.to_thread(self.role.epochs.adopt, theirs, start + len(data))
        if data:
            n = store.append_replicated(data, start)
            self.stats["fetched_records"] += n
            self.stats["fetched_bytes"] += len(data)
            if cfg.durable:
                await store.sync_log()
        self.stats["fetches"] += 1
        for owner, offset in dict(h.get("floors") or {}).items():
            if store.floors.get(owner) != offset:  # keep what the primary keeps (timers)
                store.set_retention_floor(str(owner), int(offset))
        self.primary_end = int(h["log_end"])
        self.known_hwm = int(h["hwm"])
        self.on_hwm(min(self.known_hwm, store.log.write_offset))
        version = str(h["meta_version"])
        if version != self.meta_version:
            await self.on_meta(primary, version)
            self.meta_version = version
        return True

    def _refused(self, primary: str, resp: httpx.Response | FetchAnswer) -> bool:
        reason = resp.headers.get(H_REASON, "")
        text = resp.text[:300]
        if reason == "diverged":
            log.warning("replication: %s says this copy diverged (%s); comparing epochs", primary,
                        text)
            return False
        if reason == "out_of_range":
            if self.out_of_range is None:
                log.error("REPLICA OUT OF RANGE: %s no longer holds this copy's next offset %d "
                          "(%s). This replica cannot catch up by streaming: rebuild it from "
                          "an empty data directory", primary, self.store.log.write_offset, text)
            self.out_of_range = text
            raise ValueError("out of range")
        raise ValueError(f"fetch from {primary}: HTTP {resp.status_code} {text}")
