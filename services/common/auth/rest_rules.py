"""Which resource and action each REST endpoint needs (docs/api.md "Authentication").

One table for every service (their paths do not overlap). A request needs every ``Need`` its
row lists; names taken from the body (a receive's topic, a transaction's producer group) are read
from the same JSON or msgpack body the route decodes. A path in no row needs ``cluster`` admin
(every ``/internal/`` endpoint, the sidecar's and scheduler's own endpoints); ``OPEN_PATHS``
need no signature at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tidemq.protocol.codec import decode_payload

from tidemq_server.common.auth.gate import Need, topic_need
from tidemq_server.common.auth.policy import Resource

#: Served without a signature: liveness, metrics and the API's own documentation.
OPEN_PATHS = frozenset({"/healthz", "/metrics", "/docs", "/redoc", "/openapi.json",
                        "/docs/oauth2-redirect"})
OPEN_PREFIXES = ("/docs-assets/",)

PUB, SUB, ADMIN = ("pub",), ("sub",), ("admin",)
ANY = ("pub", "sub", "admin")
CLUSTER = Resource("cluster")
CLUSTER_ADMIN = [Need(CLUSTER, ADMIN)]

Query = Mapping[str, str]
Body = Callable[[], Any]  # the decoded body, decoded on first use ({} when none or undecodable)
Builder = Callable[[re.Match[str], Query, Body], list[Need]]


def _topic(name: str, actions: tuple[str, ...]) -> Need:
    return topic_need(name, actions)


def _group(name: str) -> Need:
    return Need(Resource("group", name), SUB)


def _pgroup(name: str) -> Need:
    return Need(Resource("producer_group", name), PUB)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _field(body: Body, name: str) -> str | None:
    data = body()
    return _str(data.get(name)) if isinstance(data, dict) else None


def _body_topics(body: Body) -> list[Need]:
    """Topic sub for a group heartbeat's subscriptions and an offsets commit's rows."""
    data = body()
    if not isinstance(data, dict):
        return []
    names: set[str] = set()
    subs = data.get("subscriptions")
    if isinstance(subs, dict):
        names.update(k for k in subs if isinstance(k, str))
    rows = data.get("offsets")
    if isinstance(rows, list):
        names.update(r["topic"] for r in rows if isinstance(r, dict) and _str(r.get("topic")))
    return [_topic(n, SUB) for n in sorted(names)]


def _optional(need: Callable[[str], Need], value: str | None) -> list[Need]:
    return [need(value)] if value else []


def _pull(m: re.Match[str], q: Query, _: Body) -> list[Need]:
    return [_topic(m["a"], SUB), *_optional(_group, q.get("group"))]


def _pull_many(_: re.Match[str], __: Query, body: Body) -> list[Need]:
    """``POST /v1/pull``: sub on every topic its queues name (and the group, when given)."""
    data = body()
    names: set[str] = set()
    queues = data.get("queues") if isinstance(data, dict) else None
    if isinstance(queues, list):
        names.update(q["topic"] for q in queues if isinstance(q, dict) and _str(q.get("topic")))
    return [*(_topic(n, SUB) for n in sorted(names)),
            *_optional(_group, _field(body, "group"))]


def _receive(m: re.Match[str], _: Query, body: Body) -> list[Need]:
    return [_group(m["a"]), *_optional(lambda t: _topic(t, SUB), _field(body, "topic"))]


def _half(_: re.Match[str], q: Query, body: Body) -> list[Need]:
    """The body's group and topic; a batch body (``application/x-tidemq-batch``) has them in
    the query. Both when both are given (the route refuses that): never fewer needs."""
    needs = []
    for name, need in (("producer_group", _pgroup), ("topic", lambda t: _topic(t, PUB))):
        for value in dict.fromkeys((q.get(name), _field(body, name))):
            needs.extend(_optional(need, value))
    return needs


def _end(_: re.Match[str], __: Query, body: Body) -> list[Need]:
    return _optional(_pgroup, _field(body, "producer_group")) or CLUSTER_ADMIN


def _row(method: str, pattern: str, build: Builder) -> tuple[str, re.Pattern[str], Builder]:
    return method, re.compile(f"^{pattern}$"), build


_SEG = "(?P<a>[^/]+)"
_SEG2 = "(?P<b>[^/]+)"
RULES: list[tuple[str, re.Pattern[str], Builder]] = [
    # listings and the cluster view: any valid account
    _row("GET", "/v1/topics", lambda m, q, b: []),
    _row("GET", "/v1/groups", lambda m, q, b: []),
    _row("GET", "/v1/cluster", lambda m, q, b: []),
    _row("GET", f"/v1/routes/{_SEG}", lambda m, q, b: [_topic(m["a"], ANY)]),
    # topics
    _row("PUT", f"/v1/topics/{_SEG}", lambda m, q, b: [_topic(m["a"], ADMIN)]),
    _row("DELETE", f"/v1/topics/{_SEG}", lambda m, q, b: [_topic(m["a"], ADMIN)]),
    _row("GET", f"/v1/topics/{_SEG}", lambda m, q, b: [_topic(m["a"], ANY)]),
    _row("POST", f"/v1/topics/{_SEG}/messages", lambda m, q, b: [_topic(m["a"], PUB)]),
    _row("GET", f"/v1/topics/{_SEG}/queues/{_SEG2}/messages", _pull),
    _row("POST", "/v1/pull", _pull_many),
    # consumer groups
    _row("POST", f"/v1/groups/{_SEG}/heartbeat",
         lambda m, q, b: [_group(m["a"]), *_body_topics(b)]),
    _row("DELETE", f"/v1/groups/{_SEG}/members/{_SEG2}", lambda m, q, b: [_group(m["a"])]),
    _row("PUT", f"/v1/groups/{_SEG}/offsets", lambda m, q, b: [_group(m["a"]), *_body_topics(b)]),
    _row("GET", f"/v1/groups/{_SEG}/offsets",
         lambda m, q, b: [_group(m["a"]), *_optional(lambda t: _topic(t, SUB), q.get("topic"))]),
    _row("POST", f"/v1/groups/{_SEG}/receive", _receive),
    _row("POST", f"/v1/groups/{_SEG}/(retry|ack|invisibility)", lambda m, q, b: [_group(m["a"])]),
    # transactions and producer groups
    _row("POST", "/v1/transactions", _half),
    _row("POST", "/v1/transactions/end", _end),
    _row("POST", f"/v1/transactions/{_SEG}/end", _end),
    _row("GET", "/v1/transactions",
         lambda m, q, b: _optional(_pgroup, q.get("producer_group")) or CLUSTER_ADMIN),
    _row("POST", f"/v1/producers/{_SEG}/heartbeat", lambda m, q, b: [_pgroup(m["a"])]),
    _row("GET", f"/v1/producers/{_SEG}/checks", lambda m, q, b: [_pgroup(m["a"])]),
    _row("DELETE", f"/v1/producers/{_SEG}/members/{_SEG2}", lambda m, q, b: [_pgroup(m["a"])]),
    # messages and delays: by id the topic is unknown before the lookup, so cluster admin
    _row("GET", "/v1/messages",
         lambda m, q, b: _optional(lambda t: _topic(t, SUB), q.get("topic")) or CLUSTER_ADMIN),
    _row("GET", "/v1/scheduled",
         lambda m, q, b: _optional(lambda t: _topic(t, SUB), q.get("topic")) or CLUSTER_ADMIN),
    # a cancel that names its topic touches only that topic's message: its producers may
    _row("DELETE", f"/v1/messages/{_SEG}/schedule",
         lambda m, q, b: _optional(lambda t: _topic(t, PUB), q.get("topic")) or CLUSTER_ADMIN),
    # the nameserver: registering a broker is a cluster admin action
    _row("POST", "/v1/brokers/heartbeat", lambda m, q, b: CLUSTER_ADMIN),
]


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def needs(method: str, path: str, query: Query, body: bytes, content_type: str | None,
          ) -> list[Need]:
    """What a request needs; ``cluster`` admin for a path no row names."""
    decoded: list[Any] = []

    def lazy_body() -> Any:
        if not decoded:
            try:
                decoded.append(decode_payload(body, content_type) if body else {})
            except Exception:  # undecodable: the route answers 400 itself
                decoded.append({})
        return decoded[0]

    for row_method, pattern, build in RULES:
        if row_method != method:
            continue
        match = pattern.match(path)
        if match is not None:
            return build(match, query, lazy_body)
    return CLUSTER_ADMIN
