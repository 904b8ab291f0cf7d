"""The workload's gRPC share: plain sends through the official Apache RocketMQ 5 Python client
(``rocketmq-python-client``) to the brokers' gRPC doors, as an unmodified RocketMQ application
sends. Its operations go into the history with ``client="grpc"`` and are judged like the
others (stored once, read by every consumer group, never lost once acknowledged); a send that
raised is recorded ``info`` (the client's own retries are its business, not counted as the
SDK's ``app_errors``).

- The client gives every message its id inside ``send``, on the ``Message`` itself before the
  first attempt, so a send that raised is recorded with the id it may have stored.
- Every send carries a message group: the client hashes it to one queue, so its retries stay on
  that queue's broker group, whose dedup keeps them single. Without one the client retries on
  the next queue of its route — possibly another group — with the same id: a second copy that
  would be the client's at-least-once, not tidemq's.
- The client is synchronous (its own threads): it runs on a thread of its own; each operation
  is handed to the workload's event loop to be recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import TYPE_CHECKING

from bench._faults.history import INFO, OK, Op, now_ms

if TYPE_CHECKING:
    from bench._faults.workload import Workload

GRPC = "grpc"
MESSAGE_GROUPS = 8  # message groups the share spreads over (each pinned to one queue)
REQUEST_TIMEOUT_S = 3  # one request of the official client (s)

log = logging.getLogger(__name__)


class GrpcShare:
    def __init__(self, wl: Workload, endpoints: str) -> None:
        self.wl = wl
        self.endpoints = endpoints  # "host:port;host:port" (the client's own form)
        self.done = threading.Event()

    async def writer(self) -> None:
        """Send until the workload's writers stop."""
        loop = asyncio.get_running_loop()
        thread = asyncio.ensure_future(asyncio.to_thread(self._run, loop))
        stop = asyncio.ensure_future(self.wl.stop.wait())
        await asyncio.wait([thread, stop], return_when=asyncio.FIRST_COMPLETED)
        self.done.set()
        stop.cancel()
        try:
            await thread
        except Exception:  # the client could not start: the minimum of grpc_send says so
            log.exception("the gRPC share stopped")

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        from rocketmq import ClientConfiguration, Credentials, Message, Producer

        cfg = self.wl.cfg
        producer = Producer(ClientConfiguration(self.endpoints, Credentials(),
                                                request_timeout=REQUEST_TIMEOUT_S), (cfg.topic,))
        producer.startup()
        try:
            i = 0
            while not self.done.is_set():
                i += 1
                msg = Message()
                msg.topic = cfg.topic
                msg.body = json.dumps({"grpc": i}).encode()
                msg.message_group = f"grpc-{i % MESSAGE_GROUPS}"
                t0 = now_ms()
                try:
                    receipt = producer.send(msg)
                except Exception as exc:
                    op = Op("send", INFO, t0, now_ms(), id=str(msg.message_id or ""),
                            topic=cfg.topic, error=repr(exc)[:200], client=GRPC)
                else:
                    op = Op("send", OK, t0, now_ms(), id=str(receipt.message_id),
                            topic=cfg.topic, client=GRPC)
                if op.id:
                    loop.call_soon_threadsafe(self.wl.rec.add, op)
                time.sleep(cfg.pace_s)
        finally:
            producer.shutdown()
