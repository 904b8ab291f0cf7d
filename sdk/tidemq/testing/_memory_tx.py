"""Transactions of the in-memory broker: half messages, ends, check-backs (docs/api.md,
"Transactions"; DESIGN.md §4).

A half message is kept aside, invisible, until its end: ``commit`` stores it in its topic (a
delay on it counts from the commit), ``rollback`` drops it, ``unknown`` leaves it half. A half
message is checked once the broker's clock passes its immunity (``check_immunity_s``, else
``transaction_timeout_s``) and again ``transaction_timeout_s`` after each check: the check goes
to a producer of its group polling ``GET /v1/producers/{group}/checks`` (heartbeated within
the last 30 s of real time). A half message that had ``MAX_CHECKS`` checks is discarded.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from tidemq.protocol import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    RESERVED_PROPERTIES,
    TRANSACTION_ID,
    ErrorCode,
    OutgoingMessage,
    ProtocolError,
)
from tidemq.testing._memory_store import MEMBER_EXPIRY_S, MemoryStore, Stored

DEFAULT_TRANSACTION_TIMEOUT_S = 6.0  # first check of a half message without its own immunity
MAX_CHECKS = 15  # checks of one half message; after these it is discarded
ACTIONS = {"commit": "committed", "rollback": "rolled_back", "unknown": "half"}


@dataclass(slots=True)
class Half:
    transaction_id: str
    group: str
    copy: Stored  # as it will be stored on commit
    delay: OutgoingMessage  # as sent: its delay counts from the commit
    next_check_ms: int
    state: str = "half"
    check_times: int = 0
    ended_by: str | None = None  # the action that ended it

    def listing(self) -> dict[str, Any]:
        return {"transaction_id": self.transaction_id, "message_id": self.copy.message_id,
                "topic": self.copy.topic, "producer_group": self.group,
                "check_times": self.check_times, "born_timestamp_ms": self.copy.born_ms,
                "state": self.state}


class MemoryTransactions:
    def __init__(self, store: MemoryStore, *, transaction_timeout_s: float) -> None:
        self.store = store
        self.timeout_ms = round(transaction_timeout_s * 1000)
        self.halves: dict[str, Half] = {}
        self.by_message: dict[tuple[str, str], str] = {}  # (topic, message id) → transaction
        self.producers: dict[str, dict[str, float]] = {}  # group → client id → last beat (s)
        self._ids = itertools.count(1)

    def prepare(self, group: str, topic_name: str, messages: list[OutgoingMessage],
                immunity_s: float | None) -> list[tuple[str, str, bool]]:
        """Store half messages; per message (transaction id, message id, was it new). A
        message id seen before in this topic keeps its first transaction id. A message whose
        properties name a ``TRANSACTION_ID`` (the SDK's half batches) keeps that id."""
        if not group:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "producer_group is required")
        topic = self.store.writable(topic_name)
        now = self.store.clock.now_ms
        plans = [(m, self.store.queue_for(topic, m), self.store.due_of(m, now))
                 for m in messages]  # checked first: a bad delay refuses the whole request
        out = []
        for msg, queue_id, _ in plans:
            props = dict(msg.properties)
            txid = props.get(TRANSACTION_ID) or f"mem-tx-{next(self._ids):016x}"
            own = props.get(CHECK_IMMUNITY_TIME_IN_SECONDS)
            immunity = float(own) if own is not None else immunity_s
            mid = msg.message_id or f"mem-{txid}"
            first = self.by_message.get((topic.name, mid))
            if first is not None:
                out.append((first, mid, False))
                continue
            if txid in self.halves:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"transaction id {txid!r} is in use already")
            keys = [k for k in msg.keys if k != txid]
            user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}
            copy = Stored(mid, topic.name, queue_id, 0, msg.body, msg.tag, keys, user, now, now)
            first_check = now + (round(immunity * 1000) if immunity is not None
                                 else self.timeout_ms)
            self.halves[txid] = Half(txid, group, copy, msg, first_check)
            self.by_message[(topic.name, mid)] = txid
            self.store.states[mid] = ("half", copy)
            out.append((txid, mid, True))
        return out

    def end(self, group: str, txid: str, action: str) -> str:
        """End a transaction; its state (``committed``, ``rolled_back`` or ``half``)."""
        if action not in ACTIONS:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"action must be commit, rollback or "
                                f"unknown, got {action!r}")
        half = self.halves.get(txid)
        if half is None:
            raise ProtocolError(ErrorCode.TRANSACTION_NOT_FOUND, f"no transaction {txid!r}")
        if group and group != half.group:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"transaction {txid!r} belongs to "
                                f"producer group {half.group!r}, not {group!r}")
        if half.state != "half":
            if half.ended_by == action:
                return half.state
            raise ProtocolError(ErrorCode.TRANSACTION_ALREADY_ENDED, f"transaction {txid!r} is "
                                f"{half.state} already; it cannot {action} now")
        if action == "unknown":
            return "half"
        half.state, half.ended_by = ACTIONS[action], action
        mid = half.copy.message_id
        if action == "commit":
            # a delay counts from the commit (a deliver_at_ms in the past: at once)
            due = self.store.due_of(half.delay, self.store.clock.now_ms)
            self.store.store(half.copy, due)
            if due is None:
                self.store.states[mid] = ("committed", half.copy)
        else:
            self.store.states[mid] = ("rolled_back", half.copy)
        return half.state

    def end_many(self, group: str, ends: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results = []
        for e in ends:
            txid = str(e.get("transaction_id"))
            try:
                results.append({"transaction_id": txid,
                                "state": self.end(group, txid, str(e.get("action")))})
            except ProtocolError as exc:
                results.append({"transaction_id": txid, **exc.to_wire()})
        return results

    # -- check-backs -------------------------------------------------------------------------

    def heartbeat(self, group: str, client_id: str) -> None:
        self.producers.setdefault(group, {})[client_id] = time.monotonic()

    def leave(self, group: str, client_id: str) -> None:
        self.producers.get(group, {}).pop(client_id, None)

    def checks(self, group: str, client_id: str, limit: int) -> list[dict[str, Any]]:
        """The due checks of ``group``, handed to this producer (each counts a check and is
        not due again for ``transaction_timeout_s``); discards what had ``MAX_CHECKS``."""
        beat = self.producers.get(group, {}).get(client_id)
        if beat is None or time.monotonic() - beat > MEMBER_EXPIRY_S:
            return []
        now = self.store.clock.now_ms
        out: list[dict[str, Any]] = []
        for half in self.halves.values():
            if half.group != group or half.state != "half" or half.next_check_ms > now:
                continue
            if half.check_times >= MAX_CHECKS:
                half.state = "discarded"
                self.store.states[half.copy.message_id] = ("discarded", half.copy)
                continue
            if len(out) >= limit:
                break
            half.check_times += 1
            half.next_check_ms = now + self.timeout_ms
            out.append({"transaction_id": half.transaction_id,
                        "message_id": half.copy.message_id, "topic": half.copy.topic,
                        "check_times": half.check_times, "message": half.copy.wire()})
        return out

    def pending(self, group: str | None) -> list[dict[str, Any]]:
        return [h.listing() for h in self.halves.values()
                if h.state == "half" and (group is None or h.group == group)]

    def get(self, txid: str) -> dict[str, Any]:
        half = self.halves.get(txid)
        if half is None:
            raise ProtocolError(ErrorCode.TRANSACTION_NOT_FOUND, f"no transaction {txid!r}")
        return {**half.listing(), "resolution": None}
