"""Authentication and authorisation of one request, for both doors.

``Gate.verify_rest`` / ``Gate.verify_grpc`` verify a signature (docs/api.md "Authentication") and
return the account; ``Gate.authorize`` checks the rules. Refusals raise ``Refused`` with the API
code (UNAUTHORIZED, FORBIDDEN) and a message safe to show the caller; each one is logged (access
key and reason, never a secret or a signature) and counted in
``tidemq_auth_failures_total{door, reason}``.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from tidemq.protocol import ErrorCode
from tidemq.protocol.signing import (
    GRPC_SCHEME,
    REST_SCHEME,
    SIGNATURE_WINDOW_S,
    SignatureError,
    fresh,
    grpc_signature,
    parse_authorization,
    parse_date,
    rest_signature,
    string_to_sign,
)
from tidemq.protocol.topics import DLQ_PREFIX, RETRY_PREFIX

from tidemq_server.common.auth.policy import Resource, User
from tidemq_server.common.auth.store import AclStore

log = logging.getLogger("tidemq.auth")


@dataclass(frozen=True, slots=True)
class Need:
    """A request needs one of ``actions`` on ``resource``."""

    resource: Resource
    actions: tuple[str, ...]


def topic_need(name: str, actions: tuple[str, ...]) -> Need:
    """What ``actions`` on topic ``name`` need. A group's retry and dead-letter topics
    (``%RETRY%G``, ``%DLQ%G``) belong to the group: reading them needs ``group:G`` sub (writing
    them through the public API is refused anyway: FORBIDDEN_SYSTEM_TOPIC), as in RocketMQ."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix) and len(name) > len(prefix):
            return Need(Resource("group", name[len(prefix):]), ("sub",))
    return Need(Resource("topic", name), actions)


class Refused(Exception):
    def __init__(self, code: ErrorCode, message: str, reason: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason  # metric label: missing, malformed, unknown_key, ...


class Gate:
    def __init__(self, store: AclStore, registry: CollectorRegistry | None,
                 window_s: float = SIGNATURE_WINDOW_S) -> None:
        self.store = store
        self.window_s = window_s
        self.failures = Counter("tidemq_auth_failures", "Refused requests (ACL on) by door and "
                                "reason", ["door", "reason"], registry=registry)
        allowed = Counter("tidemq_auth_allowed", "Requests that passed the ACL, by door",
                          ["door"], registry=registry)
        self.allowed = {door: allowed.labels(door) for door in ("rest", "grpc")}  # hot path
        reloads = Gauge("tidemq_acl_reloads", "ACL file reloads since start, by result",
                        ["result"], registry=registry)
        reloads.labels("ok").set_function(lambda: float(store.reloads))
        reloads.labels("failed").set_function(lambda: float(store.failures))

    def _refuse(self, door: str, code: ErrorCode, reason: str, message: str, who: str,
                what: str) -> Refused:
        self.failures.labels(door, reason).inc()
        log.warning("%s request refused (%s): %s [access key %r, %s]", door, reason, message,
                    who[:64], what[:200])
        return Refused(code, message, reason)

    def _user(self, door: str, access_key: str, what: str) -> User:
        user = self.store.policy().user(access_key)
        if user is None:
            raise self._refuse(door, ErrorCode.UNAUTHORIZED, "unknown_key",
                               "unknown access key", access_key, what)
        return user

    def _date(self, door: str, value: str, who: str, what: str) -> None:
        try:
            when = parse_date(value)
        except SignatureError as exc:
            raise self._refuse(door, ErrorCode.UNAUTHORIZED, "malformed", str(exc), who,
                               what) from exc
        if not fresh(when, time.time(), self.window_s):
            raise self._refuse(door, ErrorCode.UNAUTHORIZED, "stale_date",
                               f"the signed date {value} is more than {self.window_s:.0f} s "
                               "away from the server's clock (replay window)", who, what)

    def _credentials(self, door: str, scheme: str, authorization: str, what: str,
                     ) -> tuple[str, str]:
        if not authorization:
            raise self._refuse(door, ErrorCode.UNAUTHORIZED, "missing",
                               f"sign the request ({scheme}, docs/api.md Authentication)", "",
                               what)
        try:
            return parse_authorization(authorization, scheme)
        except SignatureError as exc:
            raise self._refuse(door, ErrorCode.UNAUTHORIZED, "malformed", str(exc), "",
                               what) from exc

    def verify_rest(self, method: str, path: str, query: str, digest: str, date: str,
                   authorization: str) -> User:
        """The account that signed this REST request; ``Refused`` (401) otherwise."""
        what = f"{method} {path}"
        access_key, signature, user = self._signer("rest", REST_SCHEME, authorization, date,
                                                   "X-Tidemq-Date", what)
        expected = rest_signature(user.secret_key,
                                  string_to_sign(date, method, path, query, digest))
        self._match("rest", expected, signature, "the signature does not match (method, path, "
                    "query, body, date and secret key must all be as signed)", access_key, what)
        return user

    def verify_grpc(self, authorization: str, date: str, rpc: str) -> User:
        """The account that signed this gRPC call (RocketMQ 5 MQv2-HMAC-SHA1)."""
        access_key, signature, user = self._signer("grpc", GRPC_SCHEME, authorization, date,
                                                   "x-mq-date-time", rpc)
        self._match("grpc", grpc_signature(user.secret_key, date), signature,
                    "the signature does not match (check the secret key)", access_key, rpc)
        return user

    def _signer(self, door: str, scheme: str, authorization: str, date: str, date_header: str,
                what: str) -> tuple[str, str, User]:
        """(access key, signature, account) of a signed request whose date is in the window."""
        access_key, signature = self._credentials(door, scheme, authorization, what)
        if not date:
            raise self._refuse(door, ErrorCode.UNAUTHORIZED, "missing",
                               f"the {date_header} header is missing", access_key, what)
        self._date(door, date, access_key, what)
        return access_key, signature, self._user(door, access_key, what)

    def _match(self, door: str, expected: str, signature: str, message: str, access_key: str,
               what: str) -> None:
        if not hmac.compare_digest(expected, signature.lower()):
            raise self._refuse(door, ErrorCode.UNAUTHORIZED, "bad_signature", message,
                               access_key, what)

    def authorize(self, door: str, user: User, needs: Iterable[Need], what: str) -> None:
        """``Refused`` (403 FORBIDDEN naming the resource and action) unless every need is met."""
        policy = self.store.policy()
        for need in needs:
            if not any(policy.allows(user, need.resource, a) for a in need.actions):
                actions = " or ".join(need.actions)
                raise self._refuse(door, ErrorCode.FORBIDDEN, "forbidden",
                                   f"account {user.name!r} may not {actions} on "
                                   f"{need.resource}", user.access_key, what)
        self.allowed[door].inc()
