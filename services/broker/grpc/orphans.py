"""Transaction checks for RocketMQ 5 producers: RecoverOrphanedTransactionCommand on Telemetry.

A producer publishing topic T belongs to producer group T (RocketMQ 5's proxy names the group
after the topic; half messages sent over gRPC carry it). While its Telemetry stream is open,
one pump per group long-polls the broker's check channel (``TransactionService.poll_checks``,
the same call as ``GET /v1/producers/{group}/checks``) as that producer, and pushes every check
it is handed down the stream. The channel gives a check to one live producer of the group only,
so a check reaches one client whether it polls over REST or over gRPC. The client's checker
answers with an EndTransaction marked SOURCE_SERVER_CHECK.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tidemq_server.broker.grpc.door import Door
from tidemq_server.broker.grpc.messages import from_wire
from tidemq_server.broker.grpc.proto import service_pb
from tidemq_server.broker.grpc.sessions import Session

log = logging.getLogger(__name__)

POLL_WAIT_MS = 20_000  # one long poll of the check channel
POLL_MAX = 64  # checks taken per poll
IDLE_PAUSE_S = 1.0  # after a poll that returned empty at once (channel closing, not live yet)


def restart(door: Door, session: Session) -> None:
    """Run one check pump per topic the producer session publishes (after its settings)."""
    service = getattr(door.broker, "transactions", None)
    outbox = session.outbox
    if service is None or not session.is_producer or outbox is None:
        stop(session)
        return
    running = {t.get_name(): t for t in session.pumps if not t.done()}
    wanted = {f"grpc-checks-{session.client_id}-{topic}": topic for topic in session.topics}
    if running.keys() == wanted.keys():
        return  # the same topics: settings are re-sent every few minutes
    stop(session)
    session.pumps = [asyncio.create_task(_pump(door, service, session, topic, outbox), name=name)
                     for name, topic in wanted.items()]


def stop(session: Session) -> None:
    for task in session.pumps:
        task.cancel()
    session.pumps = []


def command(check: dict[str, Any]) -> Any:
    """The Telemetry command asking a producer to resolve one transaction."""
    recover = service_pb.RecoverOrphanedTransactionCommand(
        transaction_id=check["transaction_id"], message=from_wire(check["message"],
                                                                  check["topic"]))
    return service_pb.TelemetryCommand(recover_orphaned_transaction_command=recover)


async def _pump(door: Door, service: Any, session: Session, group: str,
                outbox: asyncio.Queue[Any]) -> None:
    while session.outbox is outbox and not door.closing:
        began = time.monotonic()
        try:
            checks = await service.poll_checks(group, session.client_id, POLL_MAX,
                                               POLL_WAIT_MS, True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("transaction checks of group %s for gRPC client %s: poll failed (%s); "
                        "retrying", group, session.client_id, exc)
            checks = []
        for check in checks:
            outbox.put_nowait(command(check))
            log.info("transaction %s (group %s, check %d) sent to gRPC producer %s",
                     check["transaction_id"], group, check["check_times"], session.client_id)
        if not checks and time.monotonic() - began < IDLE_PAUSE_S / 10:
            await asyncio.sleep(IDLE_PAUSE_S)
