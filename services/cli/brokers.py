"""`tidemq broker restart NAME`: a rolling restart of one broker group, a member at a time.

The members come from the nameserver (``GET /v1/cluster``): the replicas first (by broker id),
the primary last, so the group changes its primary once. For each member, in turn:

1. it must answer ``GET /internal/v1/replication/status`` (a member already down is reported,
   never restarted blindly);
2. ``POST /internal/v1/replication/restart`` naming the process just seen (``pid``), so a
   repeated request never stops its successor: it stops cleanly, as on SIGTERM (a primary shuts
   its write fence and gives its etcd lease back at once, so a successor is elected while it
   drains), and its supervisor starts it again: `tidemq up`, compose's ``restart:`` policy or
   systemd; nothing here starts processes;
3. wait until the member answers from a new process (another ``pid``) and, in a replicated
   group, until the group has a primary with every member in sync again: only then is the next
   member restarted, so at most one copy is ever missing.

A wait longer than ``--timeout`` ends the command (``TIMEOUT``, exit status 5) with the member
it waited for; the members not restarted yet are left alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Any, TypeVar

import httpx
import typer

from tidemq_server.cli.rest import (
    CliError,
    JsonOption,
    call,
    cluster_view,
    console,
    endpoints,
    print_json,
    reports_errors,
)

T = TypeVar("T")

STATUS_PATH = "/internal/v1/replication/status"
RESTART_PATH = "/internal/v1/replication/restart"
POLL_S = 0.1  # how often a restarting member and its group are asked (s)
PROBE_TIMEOUT_S = 2.0  # one status request (s)
MEMBER_TIMEOUT_S = 120.0  # default --timeout: one member back and caught up (s)

broker_app = typer.Typer(help="Broker groups: a rolling restart, one member at a time.",
                         no_args_is_help=True)


@dataclass(frozen=True, slots=True)
class Member:
    broker_id: int
    address: str
    role: str


@dataclass(slots=True)
class Restarted:
    broker_id: int
    role: str  # the role it had before its restart
    old_pid: int
    new_pid: int
    seconds: float  # from the restart request until it was back and the group in sync


def members_of(answer: dict[str, Any], name: str) -> list[Member]:
    """The members of group ``name`` in a ``/v1/cluster`` answer, in restart order: replicas
    by broker id, then the primary."""
    found: dict[int, Member] = {}
    for b in answer.get("brokers", []):
        if b.get("broker_name") != name or not b.get("address"):
            continue
        member = Member(int(b.get("broker_id", 0)), str(b["address"]).rstrip("/"),
                        str(b.get("role", "primary")))
        found[member.broker_id] = member
    return sorted(found.values(), key=lambda m: (m.role == "primary", m.broker_id))


def _status(client: httpx.Client, member: Member) -> dict[str, Any] | None:
    try:
        resp = client.get(member.address + STATUS_PATH, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    answer: dict[str, Any] = resp.json() if resp.status_code == 200 else {}
    return answer or None


def _wait(check: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise CliError(f"TIMEOUT: {what} took longer than {timeout_s:g} s")
        time.sleep(POLL_S)


def _in_sync(client: httpx.Client, members: list[Member]) -> bool:
    """A primary (not deposed) holds every member in sync."""
    for m in members:
        st = _status(client, m)
        if st and st.get("role") == "primary" and not st.get("deposed"):
            return int(st.get("in_sync_copies", 0)) >= len(members)
    return False


def restart_member(client: httpx.Client, members: list[Member], member: Member,
                   timeout_s: float) -> Restarted:
    """Steps 1-3 of the module docstring for one member."""
    who = f"broker #{member.broker_id} ({member.role}) at {member.address}"
    before = _status(client, member)
    if before is None:
        raise CliError(f"UNAVAILABLE: {who} does not answer: bring it back before a rolling "
                       "restart")
    if "pid" not in before:
        raise CliError(f"FAILED: {who} does not say its process id: it runs a tidemq older than "
                       "this command; restart it by hand (docs/operations.md)")
    old_pid = int(before["pid"])
    started = time.monotonic()
    call(client, "POST", member.address + RESTART_PATH, json={"pid": old_pid})

    def back() -> dict[str, Any] | None:
        st = _status(client, member)
        return st if st is not None and int(st.get("pid", old_pid)) != old_pid else None

    after = _wait(back, timeout_s, f"{who} coming back (is it supervised: `tidemq up`, "
                  "compose's restart policy, systemd?)")
    if before.get("enabled"):
        _wait(lambda: _in_sync(client, members), timeout_s,
              f"every member of the group in sync again after restarting {who}")
    return Restarted(member.broker_id, member.role, old_pid, int(after.get("pid", 0)),
                     time.monotonic() - started)


@broker_app.command("restart")
@reports_errors
def restart(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The broker group (its broker_name).")],
    timeout: Annotated[float, typer.Option(
        min=1.0, help="Longest wait for one member to come back and the group to be in sync "
                      "again (seconds).")] = MEMBER_TIMEOUT_S,
    json_out: JsonOption = False,
) -> None:
    """Restart every broker of a group, one at a time: replicas first, the primary last, each
    after the group is back in sync. Each member stops cleanly (a primary hands its lead over
    at once) and its supervisor (`tidemq up`, compose, systemd) starts it again."""
    ep = endpoints(ctx)
    with ep.client() as client:
        url, answer = cluster_view(client, ep)
        members = members_of(answer, name)
        if not members:
            raise CliError(f"BROKER_NOT_FOUND: no broker of group {name!r} is registered with "
                           f"{url}")
        done: list[Restarted] = []
        for member in members:
            r = restart_member(client, members, member, timeout)
            done.append(r)
            if not json_out:
                console.print(f"{name} #{r.broker_id} ({r.role}) restarted: pid {r.old_pid} -> "
                              f"{r.new_pid}, back and in sync in {r.seconds:.1f} s")
    if json_out:
        print_json({"broker_name": name, "restarted": [asdict(r) for r in done]})
    else:
        console.print(f"{name}: {len(done)} member(s) restarted")
