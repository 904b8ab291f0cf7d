"""The ACL file's model, its reload, and the signatures (unit tests, no processes)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from tidemq.protocol.signing import (
    body_digest,
    format_date,
    grpc_signature,
    rest_signature,
    sign_rest,
    string_to_sign,
)

from tests.support.procs import REPO
from tidemq_server.common.auth import Gate, Need, Refused, Resource
from tidemq_server.common.auth.gate import topic_need
from tidemq_server.common.auth.policy import PolicyError, parse_policy
from tidemq_server.common.auth.rest_rules import needs
from tidemq_server.common.auth.store import AclStore

POLICY = {
    "default": "deny",
    "users": [
        {"name": "app", "access_key": "AK1", "secret_key": "s1", "rules": [
            {"resource": "topic:orders-*", "actions": ["pub", "sub"]},
            {"resource": "topic:orders-secret", "actions": ["all"], "decision": "deny"},
            {"resource": "group:billing", "actions": "sub"},
        ]},
        {"name": "root", "access_key": "AK2", "secret_key": "s2",
         "rules": [{"resource": "*", "actions": ["all"]}]},
    ],
}


def test_prefix_wildcards_deny_wins_and_default() -> None:
    policy = parse_policy(POLICY)
    app = policy.user("AK1")
    assert app is not None
    assert policy.allows(app, Resource("topic", "orders-eu"), "pub")
    assert policy.allows(app, Resource("topic", "orders-eu"), "sub")
    assert not policy.allows(app, Resource("topic", "orders-eu"), "admin")
    assert not policy.allows(app, Resource("topic", "orders-secret"), "sub")  # deny wins
    assert not policy.allows(app, Resource("topic", "order"), "pub")
    assert policy.allows(app, Resource("group", "billing"), "sub")
    assert not policy.allows(app, Resource("cluster"), "admin")
    root = policy.user("AK2")
    assert root is not None and policy.allows(root, Resource("cluster"), "admin")
    opened = parse_policy({**POLICY, "default": "allow"})
    assert opened.allows(app, Resource("cluster"), "admin")  # no matching rule: the default
    assert not opened.allows(app, Resource("topic", "orders-secret"), "pub")


@pytest.mark.parametrize(("raw", "says"), [
    ({"users": [{"name": "x", "access_key": "A", "secret_key": "s",
                 "rules": [{"resource": "queue:x", "actions": ["pub"]}]}]}, "type must be"),
    ({"users": [{"name": "x", "access_key": "A", "secret_key": "s",
                 "rules": [{"resource": "topic:x", "actions": ["write"]}]}]}, "unknown action"),
    ({"users": [{"name": "x", "access_key": "A"}]}, "secret_key"),
    ({"users": [{"access_key": "A", "secret_key": "s"},
                {"access_key": "A", "secret_key": "t"}]}, "used twice"),
    ({"default": "maybe"}, "default"),
    ([1, 2], "mapping"),
])
def test_bad_policies_name_what_is_wrong(raw: object, says: str) -> None:
    with pytest.raises(PolicyError, match=says):
        parse_policy(raw)


def test_reload_and_a_bad_file_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "acl.yaml"
    path.write_text("users:\n  - {name: a, access_key: AK1, secret_key: s1}\n")
    store = AclStore(path, check_s=0.0)
    assert store.policy().user("AK1") is not None
    path.write_text("users:\n  - {name: b, access_key: AK9, secret_key: s9}\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert store.policy().user("AK9") is not None and store.policy().user("AK1") is None
    path.write_text("users: [ {name: broken\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert store.policy().user("AK9") is not None  # the last good policy stays
    assert store.failures == 1 and "not valid YAML" in store.last_error


def test_gate_refuses_each_bad_signature(tmp_path: Path) -> None:
    path = tmp_path / "acl.yaml"
    path.write_text("users:\n  - {name: a, access_key: AK1, secret_key: s1, rules: "
                    "[{resource: 'topic:t', actions: [pub]}]}\n")
    gate = Gate(AclStore(path), None)
    body = b'{"messages": []}'
    good = sign_rest("AK1", "s1", "POST", "/v1/topics/t/messages", "", body)
    date, auth = good["X-Tidemq-Date"], good["Authorization"]
    user = gate.verify_rest("POST", "/v1/topics/t/messages", "", body_digest(body), date, auth)
    gate.authorize("rest", user, [], "x")
    cases = {
        "tampered": ("POST", "/v1/topics/t/messages", "", body_digest(b"{}"), date, auth),
        "path": ("POST", "/v1/topics/u/messages", "", body_digest(body), date, auth),
        "query": ("POST", "/v1/topics/t/messages", "a=1", body_digest(body), date, auth),
        "none": ("POST", "/v1/topics/t/messages", "", body_digest(body), date, ""),
    }
    for name, args in cases.items():
        with pytest.raises(Refused) as info:
            gate.verify_rest(*args)
        assert info.value.code.http_status == 401, name
    wrong = sign_rest("AK1", "nope", "POST", "/p", "", None)
    unknown = sign_rest("AK7", "s1", "POST", "/p", "", None)
    stale = sign_rest("AK1", "s1", "POST", "/p", "", None, when_s=time.time() - 16 * 60)
    for headers, reason in ((wrong, "bad_signature"), (unknown, "unknown_key"),
                            (stale, "stale_date")):
        with pytest.raises(Refused) as info:
            gate.verify_rest("POST", "/p", "", body_digest(None), headers["X-Tidemq-Date"],
                            headers["Authorization"])
        assert info.value.reason == reason
    now = format_date()
    gauth = f"MQv2-HMAC-SHA1 Credential=AK1, SignedHeaders=x-mq-date-time, Signature=" \
            f"{grpc_signature('s1', now)}"
    assert gate.verify_grpc(gauth, now, "SendMessage").name == "a"
    with pytest.raises(Refused):
        gate.verify_grpc(gauth.replace("AK1", "AK2"), now, "SendMessage")
    with pytest.raises(Refused) as info:
        gate.authorize("rest", user, [Need(Resource("topic", "u"), ("pub",))], "x")
    assert info.value.code.http_status == 403 and "pub on topic:u" in info.value.message


def test_the_worked_example_of_docs_api_verifies() -> None:
    """docs/api.md's example: its string to sign and signature are what this code computes."""
    doc = (REPO / "docs" / "api.md").read_text()
    block = re.search(r"<!-- signing-example -->\n```text\n(.*?)```", doc, re.S)
    assert block is not None, "docs/api.md lost its signing example"
    fields = dict(re.findall(r"^(\w[\w ]*?): +(.*)$", block.group(1), re.M))
    body = fields["body"].encode()
    text = string_to_sign(fields["date"], fields["method"], fields["path"], fields["query"],
                          body_digest(body))
    shown = re.search(r"<!-- string-to-sign -->\n```text\n(.*?)\n```", doc, re.S)
    assert shown is not None and shown.group(1) == text
    signature = rest_signature(fields["secret key"], text)
    assert fields["signature"] == signature
    assert f"Credential={fields['access key']}, Signature={signature}" in doc


def test_retry_and_dead_letter_topics_belong_to_their_group() -> None:
    assert topic_need("%RETRY%billing", ("sub",)) == Need(Resource("group", "billing"), ("sub",))
    assert topic_need("%DLQ%billing", ("pub", "sub")) == Need(Resource("group", "billing"),
                                                                ("sub",))
    assert topic_need("orders", ("pub",)) == Need(Resource("topic", "orders"), ("pub",))
    assert topic_need("%RETRY%", ("sub",)) == Need(Resource("topic", "%RETRY%"), ("sub",))
    pull = needs("GET", "/v1/topics/%DLQ%billing/queues/0/messages", {}, b"", None)
    assert pull == [Need(Resource("group", "billing"), ("sub",))]


def test_a_many_queue_pull_needs_sub_on_every_topic_it_names() -> None:
    body = (b'{"group": "billing", "queues": [{"topic": "orders", "queue_id": 0, "offset": 1},'
            b' {"topic": "%RETRY%billing", "queue_id": 0, "offset": 0},'
            b' {"topic": "orders", "queue_id": 1, "offset": 0}]}')
    got = needs("POST", "/v1/pull", {}, body, "application/json")
    assert got == [Need(Resource("group", "billing"), ("sub",)),
                   Need(Resource("topic", "orders"), ("sub",)),
                   Need(Resource("group", "billing"), ("sub",))]
    # not the cluster admin a path without a row needs
    assert Need(Resource("cluster"), ("admin",)) not in got


def test_a_half_batch_needs_its_query_group_and_topic() -> None:
    """A batch body (record format v2) has no fields: the group and topic are the query's."""
    pub = ("pub",)
    want = [Need(Resource("producer_group", "orders-tx"), pub),
            Need(Resource("topic", "orders"), pub)]
    query = {"producer_group": "orders-tx", "topic": "orders"}
    assert needs("POST", "/v1/transactions", query, b"\x00\x00\x00\x41 not json",
                 "application/x-tidemq-batch") == want
    body = b'{"producer_group": "orders-tx", "topic": "orders", "message": {"body": "x"}}'
    assert needs("POST", "/v1/transactions", {}, body, "application/json") == want
    # both given (the route refuses it): each one's need, never fewer
    assert needs("POST", "/v1/transactions", {"topic": "other"}, body, "application/json") == [
        want[0], Need(Resource("topic", "other"), pub), want[1]]


def test_a_cancel_naming_its_topic_needs_pub_on_it_else_cluster_admin() -> None:
    """``?topic=`` confines a cancel to that topic's message (issue 34): its producers may
    cancel; without a topic the cancel may reach any topic, so only a cluster admin may."""
    path = "/v1/messages/order-42/schedule"
    assert needs("DELETE", path, {"topic": "orders"}, b"", None) == [
        Need(Resource("topic", "orders"), ("pub",))]
    assert needs("DELETE", path, {}, b"", None) == [Need(Resource("cluster"), ("admin",))]
