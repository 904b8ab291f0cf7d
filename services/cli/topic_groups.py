"""Topics across the cluster: create, update and delete a topic on every broker group.

The groups come from a nameserver's ``GET /v1/cluster`` (the first of ``--nameserver`` that
answers): one entry per ``broker_name``, reached at its primary's address. ``--group`` picks some.
Each step first reads the topic on every chosen group, decides, and only then writes, so a
refused create (another queue count somewhere) changes nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from tidemq_server.cli.rest import (
    CliError,
    Endpoints,
    answer,
    call,
    cluster_view,
    segment,
    unreachable,
)

CREATED, UNCHANGED, UPDATED, DELETED, ABSENT, FAILED = (
    "created", "unchanged", "updated", "deleted", "absent", "failed")


@dataclass(frozen=True)
class Group:
    name: str  # broker_name
    address: str  # base URL of its primary


@dataclass(frozen=True)
class GroupResult:
    """What one command did to the topic on one group."""

    broker_name: str
    address: str
    result: str  # created, unchanged, updated, deleted, absent or failed
    queues: int | None = None
    perm: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def groups_of(cluster: dict[str, Any]) -> dict[str, str]:
    """Broker name → its primary's address, from a ``GET /v1/cluster`` answer."""
    groups: dict[str, str] = {}
    for broker in cluster.get("brokers", []):
        if broker.get("role", "primary") == "primary":
            groups.setdefault(str(broker["broker_name"]), str(broker["address"]))
    return groups


def choose_groups(client: httpx.Client, ep: Endpoints,
                  wanted: Sequence[str] | None) -> list[Group]:
    """The groups a command acts on: every live one, or those named by ``--group``."""
    url, cluster = cluster_view(client, ep)
    groups = groups_of(cluster)
    if not groups:
        raise CliError(f"UNAVAILABLE: no live broker is registered with the nameserver {url}: "
                       "start one (`tidemq up`), or wait for its first heartbeat")
    names = list(dict.fromkeys(wanted)) if wanted else sorted(groups)
    unknown = [n for n in names if n not in groups]
    if unknown:
        raise CliError(f"BAD_REQUEST: no broker group {', '.join(unknown)} in the cluster; "
                       f"the nameserver {url} lists {', '.join(sorted(groups))}", 2)
    return [Group(n, groups[n]) for n in names]


def read_topic(client: httpx.Client, group: Group, topic: str) -> dict[str, Any] | None:
    """The topic as the group's broker describes it; None when it does not have it."""
    try:
        resp = client.get(f"{group.address}/v1/topics/{segment(topic)}")
    except httpx.HTTPError as exc:
        raise CliError(f"UNAVAILABLE: cannot reach {group.name} at {group.address} "
                       f"({str(exc) or type(exc).__name__})") from exc
    if resp.status_code == 404 and error_code(resp) == "TOPIC_NOT_FOUND":
        return None
    try:
        found: dict[str, Any] = answer(resp)
    except CliError as exc:
        raise CliError(f"{group.name}: {exc.message}", code=exc.code) from None
    return found


def error_code(resp: httpx.Response) -> str | None:
    try:
        return str(resp.json()["code"])
    except (ValueError, KeyError, TypeError):
        return None


def _put(client: httpx.Client, group: Group, topic: str, queues: int, perm: str,
         done: str) -> GroupResult:
    try:
        answer = call(client, "PUT", f"{group.address}/v1/topics/{segment(topic)}",
                      json={"queues": queues, "perm": perm})
    except CliError as exc:
        return GroupResult(group.name, group.address, FAILED, error=exc.message)
    return GroupResult(group.name, group.address, done, int(answer.get("queues", queues)),
                       str(answer.get("perm", perm)))


def create(client: httpx.Client, groups: list[Group], topic: str, queues: int,
           perm: str) -> list[GroupResult]:
    """Create ``topic`` where it is missing. Where it exists with the same queue count and
    permission nothing changes (creating twice is idempotent); where it differs nothing is
    written anywhere and a CliError points to ``tidemq topic update``."""
    current = {g.name: read_topic(client, g, topic) for g in groups}
    differ = [f"{g.name} ({c['queues']} queue(s), perm {c['perm']})"
              for g in groups if (c := current[g.name]) is not None
              and (c.get("queues"), c.get("perm")) != (queues, perm)]
    if differ:
        raise CliError(f"TOPIC_EXISTS: topic {topic} already exists on {', '.join(differ)}, "
                       f"not {queues} queue(s), perm {perm}; nothing was changed. Change it "
                       f"explicitly with `tidemq topic update {topic} --queues {queues}"
                       f"{'' if perm == 'rw' else f' --perm {perm}'}`")
    results = []
    for group in groups:
        if current[group.name] is not None:
            results.append(GroupResult(group.name, group.address, UNCHANGED, queues, perm))
        else:
            results.append(_put(client, group, topic, queues, perm, CREATED))
    return results


def update(client: httpx.Client, groups: list[Group], topic: str, queues: int | None,
           perm: str | None) -> list[GroupResult]:
    """Set the queue count and/or permission of ``topic`` on every chosen group that has it;
    a group without it is reported ``absent`` (``tidemq topic create`` adds it there)."""
    current = {g.name: read_topic(client, g, topic) for g in groups}
    if all(c is None for c in current.values()):
        raise CliError(f"TOPIC_NOT_FOUND: no group among {', '.join(g.name for g in groups)} "
                       f"has topic {topic}: create it with `tidemq topic create {topic}`")
    results = []
    for group in groups:
        cfg = current[group.name]
        if cfg is None:
            results.append(GroupResult(group.name, group.address, ABSENT))
            continue
        want = (queues if queues is not None else int(cfg["queues"]),
                perm if perm is not None else str(cfg["perm"]))
        if want == (cfg.get("queues"), cfg.get("perm")):
            results.append(GroupResult(group.name, group.address, UNCHANGED, *want))
        else:
            results.append(_put(client, group, topic, *want, UPDATED))
    return results


def delete(client: httpx.Client, groups: list[Group], topic: str) -> list[GroupResult]:
    """Delete ``topic`` on every chosen group that has it (``absent`` elsewhere)."""
    results = []
    for group in groups:
        url = f"{group.address}/v1/topics/{segment(topic)}"
        try:
            resp = client.delete(url)
        except httpx.HTTPError as exc:
            results.append(GroupResult(group.name, group.address, FAILED,
                                       error=str(unreachable(url, exc).message)))
            continue
        if resp.status_code == 404 and error_code(resp) == "TOPIC_NOT_FOUND":
            results.append(GroupResult(group.name, group.address, ABSENT))
            continue
        try:
            done = answer(resp)
        except CliError as exc:
            results.append(GroupResult(group.name, group.address, FAILED, error=exc.message))
            continue
        results.append(GroupResult(group.name, group.address, DELETED,
                                   int(done.get("queues", 0))))
    if all(r.result == ABSENT for r in results):
        raise CliError(f"TOPIC_NOT_FOUND: no group among {', '.join(g.name for g in groups)} "
                       f"has topic {topic}")
    return results


def failures(results: list[GroupResult]) -> list[GroupResult]:
    return [r for r in results if r.result == FAILED]
