"""The workload, run on the client host (its own namespace): ``python -m bench._faults.workload
CONFIG.json``. It records every operation in the history file as it completes.

Writers send plain messages (round robin over the broker groups; one request in five a batch of
4-16 messages), messages with a sharding key
(each key owned by one writer, so its sends are sequential: ``seq`` is their order), delayed
messages (some cancelled a little later) and transactions (committed, rolled back, or left
UNKNOWN and answered by check-back with what the local transaction decided). Two consumer groups
pull every queue of every group, commit their offsets now and then and read them back.

The client is raw HTTP, like a simple SDK: the route comes from the nameservers, a send goes to
the group's primary, and on an error or a timeout it is resent with the same message id (the
broker de-duplicates) until its deadline; what never got an answer is recorded ``info``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
import uuid
import zlib
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._faults.grpc_share import GrpcShare
from bench._faults.history import FAIL, INFO, OK, Op, now_ms, write_ops
from bench._faults.sdk_share import SdkShare

PRODUCER_GROUP = "faults-tx"
CONSUMER_GROUPS = ("cg1", "cg2")
RETRY_PAUSE_S = 0.25  # between two attempts of one operation (s)
REQUEST_TIMEOUT_S = 3.0  # one HTTP request (s)
BATCH = (4, 17)  # a batch send carries this many messages (range: low, high exclusive)
TIMER_SLACK_S = 12.0  # the drain reads on this long past the last timer's due time (s)
# a request unanswered this long makes the writer ask the nameservers whether its group has
# another primary, then again as often (s): tidemq's MOVED_CHECK_S
MOVED_CHECK_S = 0.5


class Moved(Exception):
    """The request's group has another primary now (its answer never came)."""


@dataclass
class Config:
    nameservers: list[str]
    groups: list[str]  # the broker groups (a sharding key stays in one)
    topic: str
    out: str
    duration_s: float  # operations are started for this long at most
    drain_s: float  # then consumers keep reading this long
    writers: int = 4
    op_deadline_s: float = 8.0  # an operation is retried until this (s)
    delay_max_ms: int = 6_000
    long_delay_max_ms: int = 0  # one delayed message in ten waits up to this long (0 = none)
    seed: int = 0
    pace_s: float = 0.05  # pause of a writer between operations (s)
    stop_file: str = ""  # operations stop once this file exists (the controller's word)
    sdk_writers: int = 2  # writers using the tidemq SDK (bench/_faults/sdk_share.py)
    timer_wait_max_s: float = 120.0  # the drain waits for due timers at most this long (s)
    grpc_endpoints: str = ""  # the brokers' gRPC doors ("host:port;..."; "" = no gRPC share)


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending: list[Op] = []

    def add(self, op: Op) -> None:
        self.pending.append(op)
        if len(self.pending) >= 64:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            write_ops(self.path, self.pending)
            self.pending = []


class Routes:
    """The topic's route per broker group, from any nameserver that answers."""

    def __init__(self, http: httpx.AsyncClient, nameservers: list[str], topic: str) -> None:
        self.http = http
        self.nameservers = nameservers
        self.topic = topic
        self.groups: dict[str, dict[str, Any]] = {}
        self._fetched = 0.0

    async def refresh(self, force: bool = False) -> dict[str, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        if not force and self.groups and loop.time() - self._fetched < 2.0:
            return self.groups
        for ns in random.sample(self.nameservers, len(self.nameservers)):
            try:
                resp = await self.http.get(f"{ns}/v1/routes/{self.topic}", timeout=1.5)
            except httpx.HTTPError:
                continue
            if resp.status_code == 200:
                self.groups = {q["broker_name"]: q for q in resp.json()["queues"]}
                self._fetched = loop.time()
                break
        return self.groups


class Workload:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rec = Recorder(Path(cfg.out))
        self.http = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S,
                                      limits=httpx.Limits(max_connections=64))
        self.routes = Routes(self.http, cfg.nameservers, cfg.topic)
        self.rng = random.Random(cfg.seed)
        self.intents: dict[str, str] = {}  # transaction message id → commit / rollback
        self.timers: dict[str, int] = {}  # acknowledged, not cancelled timer → due (ms)
        self.attempts = 0  # requests the last ``attempt`` made
        self.stop = asyncio.Event()
        self.reading = asyncio.Event()  # set once the consumers should stop
        self._rr = 0

    # --- one operation against a group's primary, retried with the same id ----------------
    async def attempt(self, group: str | None, method: str, path: str, body: Any
                      ) -> tuple[str, dict[str, Any], str, str, str]:
        """(type, answer, group, address, last error) of a request retried until the
        operation's deadline; ``group`` None: round robin over the groups. How many requests
        it took is left in ``self.attempts``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.op_deadline_s
        error = "no route"
        force = False
        self.attempts = 0
        while loop.time() < deadline:
            groups = await self.routes.refresh(force)
            if group is None and groups:
                names = sorted(groups)
                self._rr += 1
                group = names[self._rr % len(names)]
            route = groups.get(group or "")
            if route is None or "w" not in route["perm"]:
                error, force = f"no writable route to {group}", True
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            address = route["address"]
            self.attempts += 1
            try:
                resp = await self._unless_moved(group or "", address,
                                                self.http.request(method, address + path,
                                                                  json=body))
            except httpx.HTTPError as exc:
                error, force = f"{type(exc).__name__} from {address}", True
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            except Moved as exc:  # as a timeout: resent with the same id, to the new primary
                error, force = str(exc), False
                continue
            if resp.status_code == 200:
                return OK, resp.json(), group or "", address, ""
            answer = _json(resp)
            error = f"{resp.status_code} {answer.get('code', '')} from {address}"
            if 400 <= resp.status_code < 500 and resp.status_code != 408:
                return FAIL, answer, group or "", address, error
            force = True
            await asyncio.sleep(RETRY_PAUSE_S)
        return INFO, {}, group or "", "", error

    async def _unless_moved(self, group: str, address: str,
                            request: Coroutine[Any, Any, httpx.Response]) -> httpx.Response:
        """``request`` to ``address``, the group's primary, given up (``Moved``) once the
        nameservers name another primary while it is unanswered ``MOVED_CHECK_S`` or more, as
        tidemq's services and SDK do: a paused primary, or one cut off from this client,
        answers nothing until it is healed, and a failover measured through this client must
        not last this client's request timeout."""
        task = asyncio.ensure_future(request)
        try:
            done, _ = await asyncio.wait({task}, timeout=MOVED_CHECK_S)
            while not done:
                route = (await self.routes.refresh(force=True)).get(group)
                if route is not None and route["address"] != address and not task.done():
                    raise Moved(f"no answer from {address}; {group}'s primary is "
                                f"{route['address']} now")
                done, _ = await asyncio.wait({task}, timeout=MOVED_CHECK_S)
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    # --- writers --------------------------------------------------------------------------
    async def writer(self, w: int) -> None:
        seqs: dict[str, int] = {}
        while not self.stop.is_set():
            roll = self.rng.random()
            if roll < 0.2:
                await self.send_batch(self.rng.randrange(*BATCH))
            elif roll < 0.45:
                await self.send(None, None, 0)
            elif roll < 0.65:
                key = f"w{w}-k{self.rng.randrange(3)}"
                seqs[key] = seqs.get(key, 0) + 1
                await self.send(None, key, seqs[key])
            elif roll < 0.82:
                await self.delay()
            else:
                await self.transaction()
            await asyncio.sleep(self.cfg.pace_s)

    async def send(self, group: str | None, key: str | None, seq: int) -> None:
        mid = f"s-{uuid.uuid4().hex[:12]}"
        msg: dict[str, Any] = {"message_id": mid, "body": json.dumps({"key": key, "seq": seq})}
        if key is not None:
            msg["sharding_key"] = key
            group = self.cfg.groups[zlib.crc32(key.encode()) % len(self.cfg.groups)]
        t0 = now_ms()
        kind, answer, group, address, err = await self.attempt(
            group, "POST", f"/v1/topics/{self.cfg.topic}/messages", {"messages": [msg]})
        res = answer.get("results", [{}])[0] if kind == OK else {}
        self.rec.add(Op("send", kind, t0, now_ms(), id=mid, topic=self.cfg.topic, key=key,
                        seq=seq, group=group, address=address, queue=res.get("queue_id", -1),
                        offset=res.get("queue_offset", -1), error=err, attempts=self.attempts))

    async def send_batch(self, n: int) -> None:
        """One request carrying ``n`` messages (one op each: acknowledged as a whole)."""
        mids = [f"s-{uuid.uuid4().hex[:12]}" for _ in range(n)]
        msgs = [{"message_id": mid, "body": json.dumps({"batch": n})} for mid in mids]
        t0 = now_ms()
        kind, answer, group, address, err = await self.attempt(
            None, "POST", f"/v1/topics/{self.cfg.topic}/messages", {"messages": msgs})
        results = answer.get("results", []) if kind == OK else []
        t1, attempts = now_ms(), self.attempts
        for i, mid in enumerate(mids):
            res = results[i] if i < len(results) else {}
            self.rec.add(Op("send", kind, t0, t1, id=mid, topic=self.cfg.topic, group=group,
                            address=address, queue=res.get("queue_id", -1),
                            offset=res.get("queue_offset", -1), error=err, attempts=attempts,
                            batch=n))

    async def delay(self) -> None:
        mid = f"d-{uuid.uuid4().hex[:12]}"
        delay = self.rng.randrange(1000, self.cfg.delay_max_ms)
        if self.cfg.long_delay_max_ms and self.rng.random() < 0.1:  # a minute or so
            delay = self.rng.randrange(self.cfg.delay_max_ms, self.cfg.long_delay_max_ms)
        t0 = now_ms()
        msg: dict[str, Any] = {"message_id": mid, "body": json.dumps({"delay": delay})}
        if self.rng.random() < 0.5:
            msg["deliver_at_ms"] = due = t0 + delay
        else:
            msg["delay_ms"], due = delay, t0 + delay  # the broker gets it at t0 or later
        kind, answer, group, address, err = await self.attempt(
            None, "POST", f"/v1/topics/{self.cfg.topic}/messages", {"messages": [msg]})
        res = answer.get("results", [{}])[0] if kind == OK else {}
        at = int(res.get("deliver_at_ms") or 0)
        self.rec.add(Op("delay", kind, t0, now_ms(), id=mid, topic=self.cfg.topic, due_ms=due,
                        group=group, address=address, error=err, deliver_at_ms=at,
                        attempts=self.attempts))
        if kind == OK:
            self.timers[mid] = at or due
        if kind != FAIL and self.rng.random() < 0.25:
            asyncio.get_running_loop().create_task(self.cancel(mid, group, delay))

    async def cancel(self, mid: str, group: str, delay: int) -> None:
        await asyncio.sleep(self.rng.uniform(0.1, 0.6) * delay / 1000)
        t0 = now_ms()
        kind, _, _, address, err = await self.attempt(group, "DELETE",
                                                      f"/v1/messages/{mid}/schedule", None)
        self.rec.add(Op("cancel", kind, t0, now_ms(), id=mid, group=group, address=address,
                        error=err, attempts=self.attempts))
        if kind != FAIL:
            self.timers.pop(mid, None)  # (maybe) cancelled: not waited for

    async def transaction(self) -> None:
        mid = f"t-{uuid.uuid4().hex[:12]}"
        intent = "commit" if self.rng.random() < 0.6 else "rollback"
        end = intent if self.rng.random() < 0.6 else "unknown"
        self.intents[mid] = intent
        t0 = now_ms()
        kind, answer, group, address, err = await self.attempt(
            None, "POST", "/v1/transactions",
            {"producer_group": PRODUCER_GROUP, "topic": self.cfg.topic, "check_immunity_s": 2,
             "message": {"message_id": mid, "body": json.dumps({"intent": intent})}})
        self.rec.add(Op("txn", kind, t0, now_ms(), id=mid, topic=self.cfg.topic, intent=intent,
                        end=end, group=group, address=address, error=err,
                        attempts=self.attempts))
        if kind == OK:  # the end may fail too: the check-back answers with the intent
            await self.attempt(group, "POST", f"/v1/transactions/{answer['transaction_id']}/end",
                               {"producer_group": PRODUCER_GROUP, "action": end})

    # --- the check-back answerer: every group's primary -----------------------------------
    async def answer_checks(self) -> None:
        client = f"faults-{uuid.uuid4().hex[:6]}"
        while not self.reading.is_set():
            groups = await self.routes.refresh()
            polls = [self._checks(r["address"], client) for r in groups.values()]
            await asyncio.gather(*polls) if polls else await asyncio.sleep(0.5)

    async def _checks(self, address: str, client: str) -> None:
        try:
            await self.http.post(f"{address}/v1/producers/{PRODUCER_GROUP}/heartbeat",
                                 json={"client_id": client})
            resp = await self.http.get(f"{address}/v1/producers/{PRODUCER_GROUP}/checks",
                                       params={"client_id": client, "wait_ms": 1000})
            for check in resp.json().get("checks", []) if resp.status_code == 200 else []:
                action = self.intents.get(check["message_id"], "rollback")
                await self.http.post(f"{address}/v1/transactions/{check['transaction_id']}/end",
                                     json={"producer_group": PRODUCER_GROUP, "action": action,
                                           "from_check": True})
        except (httpx.HTTPError, ValueError):
            await asyncio.sleep(0.3)

    # --- consumers ------------------------------------------------------------------------
    async def consumer(self, cgroup: str) -> None:
        positions: dict[tuple[str, int], int] = {}
        loop = asyncio.get_running_loop()
        last_commit = last_fetch = loop.time()
        while not self.reading.is_set():
            groups = await self.routes.refresh()
            for group, route in sorted(groups.items()):
                for q in range(route["queues"]):
                    await self._pull(cgroup, group, route["address"], q, positions)
            if loop.time() - last_commit > 1.0:
                last_commit = loop.time()
                await self._commit(cgroup, groups, positions)
            if loop.time() - last_fetch > 3.0:
                last_fetch = loop.time()
                await self._fetch(cgroup, groups, positions)
            await asyncio.sleep(0.1)
        self.rec.flush()

    async def _pull(self, cgroup: str, group: str, address: str, q: int,
                    positions: dict[tuple[str, int], int]) -> None:
        at = positions.get((group, q), 0)
        try:
            resp = await self.http.get(
                f"{address}/v1/topics/{self.cfg.topic}/queues/{q}/messages",
                params={"offset": at, "max": 256, "wait_ms": 0}, timeout=2.0)
        except httpx.HTTPError:
            return
        if resp.status_code != 200:
            return
        answer = resp.json()
        t = now_ms()
        for m in answer["messages"]:
            self.rec.add(Op("read", OK, t, t, id=m["message_id"], topic=self.cfg.topic,
                            cgroup=cgroup, group=group, queue=q, offset=m["queue_offset"],
                            store_ms=int(m.get("store_timestamp_ms") or 0)))
        positions[(group, q)] = answer["next_offset"]

    async def _commit(self, cgroup: str, groups: dict[str, dict[str, Any]],
                      positions: dict[tuple[str, int], int]) -> None:
        for group, route in groups.items():
            mine = [(q, o) for (g, q), o in positions.items() if g == group]
            if not mine or "w" not in route["perm"]:
                continue
            t0 = now_ms()
            try:
                resp = await self.http.put(
                    f"{route['address']}/v1/groups/{cgroup}/offsets",
                    json={"offsets": [{"topic": self.cfg.topic, "queue_id": q, "offset": o}
                                      for q, o in mine], "advance_only": True})
                kind = OK if resp.status_code == 200 else (
                    FAIL if resp.status_code < 500 else INFO)
            except httpx.HTTPError:
                kind = INFO
            for q, o in mine:
                self.rec.add(Op("commit_offset", kind, t0, now_ms(), cgroup=cgroup,
                                group=group, topic=self.cfg.topic, queue=q, offset=o))

    async def _fetch(self, cgroup: str, groups: dict[str, dict[str, Any]],
                     positions: dict[tuple[str, int], int]) -> None:
        """Read the committed offsets back, and go on from them (as a restarted consumer)."""
        for group, route in groups.items():
            t0 = now_ms()
            try:
                resp = await self.http.get(f"{route['address']}/v1/groups/{cgroup}/offsets",
                                           params={"topic": self.cfg.topic})
            except httpx.HTTPError:
                continue
            if resp.status_code != 200:
                continue
            for o in resp.json()["offsets"]:
                self.rec.add(Op("fetch_offset", OK, t0, now_ms(), cgroup=cgroup, group=group,
                                topic=self.cfg.topic, queue=o["queue_id"], offset=o["offset"]))
                positions[(group, o["queue_id"])] = o["offset"]

    # --- the run --------------------------------------------------------------------------
    async def run(self) -> None:
        await self.routes.refresh(force=True)
        consumers = [asyncio.create_task(self.consumer(g)) for g in CONSUMER_GROUPS]
        checks = asyncio.create_task(self.answer_checks())
        sdk = SdkShare(self)
        if self.cfg.sdk_writers:  # the SDK share's consumer groups read from the start too
            consumers += [asyncio.create_task(sdk.push_reader()),
                          asyncio.create_task(sdk.simple_reader())]
        writers = [asyncio.create_task(self.writer(w)) for w in range(self.cfg.writers)]
        writers += [asyncio.create_task(sdk.writer(w)) for w in range(self.cfg.sdk_writers)]
        if self.cfg.grpc_endpoints:  # the official RocketMQ 5 client (bench/_faults/grpc_share.py)
            writers.append(asyncio.create_task(GrpcShare(self, self.cfg.grpc_endpoints).writer()))
        loop = asyncio.get_running_loop()
        until = loop.time() + self.cfg.duration_s
        stop = Path(self.cfg.stop_file) if self.cfg.stop_file else None
        while loop.time() < until and not (stop is not None and stop.exists()):  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        self.stop.set()
        await asyncio.gather(*writers)
        await sdk.close_producer()
        self.rec.flush()
        # read on for the drain, and until every timer acknowledged (and not cancelled) is
        # due plus the drain's slack, so timers due near the end are judged, not skipped
        latest = max(self.timers.values(), default=0) / 1000 + TIMER_SLACK_S
        until = max(loop.time() + self.cfg.drain_s,
                    loop.time() + min(latest - now_ms() / 1000, self.cfg.timer_wait_max_s))
        while loop.time() < until:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        self.reading.set()
        await asyncio.gather(*consumers, checks)
        await sdk.close()  # its transactional producer answered check-backs until now
        self.rec.flush()
        await self.http.aclose()


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        answer = resp.json()
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def main(argv: list[str]) -> None:
    cfg = Config(**json.loads(Path(argv[0]).read_text()))
    # the SDK share's retry decisions, timestamped in workload.log: which answer made a send
    # stay with its group or move to another one (what a duplicate across groups is traced by)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("tidemq.fault").setLevel(logging.DEBUG)
    random.seed(cfg.seed)
    asyncio.run(Workload(cfg).run())


if __name__ == "__main__":
    main(sys.argv[1:])
