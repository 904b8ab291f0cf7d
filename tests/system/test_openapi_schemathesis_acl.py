"""schemathesis against every service's OpenAPI with accounts on, every request signed.

The same checks as test_openapi_schemathesis.py (no 5xx, a declared status, the declared
schema) with ACL on in every service and each generated request signed as an admin account
(requests' auth hook: the signature covers the exact bytes sent), and some signed by an account
without rights (answers 403 FORBIDDEN, which every operation must declare). Fewer cases per
operation than the open run: this run is about the signature path, not every input again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)
from tidemq.protocol import CONTENT_JSON
from tidemq.protocol.signing import sign_rest

from tests.support import openapi
from tests.support.acl import USERS, acl_document
from tests.support.cluster import Cluster, run_cluster
from tests.support.procs import RedisServer
from tidemq_server.common.auth.client import SigningAuth

pytestmark = pytest.mark.integration

__all__ = ["openapi"]  # msgpack for schemathesis

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
EXAMPLES = 4  # generated cases per operation and variant
VARIANTS = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
SERVICES = ("broker", "nameserver", "scheduler", "checker", "metrics")


class Signed(requests.auth.AuthBase):
    """Signs a prepared request (what requests will send) as one account."""

    def __init__(self, user: str) -> None:
        self.access_key, self.secret_key, _ = USERS[user]

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        parts = urlsplit(r.url or "")
        body = r.body.encode() if isinstance(r.body, str) else r.body
        r.headers.update(sign_rest(self.access_key, self.secret_key, r.method or "GET",
                                   parts.path, parts.query, body))
        return r


@pytest.fixture(scope="module")
def acl_services(tmp_path_factory: pytest.TempPathFactory,
                 redis_server: RedisServer) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("acl-openapi")
    acl_file = work / "acl.yaml"
    acl_file.write_text(yaml.safe_dump(acl_document()))
    ak, sk, _ = USERS["services"]
    with run_cluster(work, redis_server.url, acl={"acl_file": str(acl_file), "access_key": ak,
                                                  "secret_key": sk}) as running:
        admin = httpx.Client(base_url=running.broker.url, auth=SigningAuth(*USERS["admin"][:2]))
        assert admin.put("/v1/topics/seeded", json={"queues": 2}).status_code == 200
        sent = admin.post("/v1/topics/seeded/messages",
                          json={"messages": [{"body": "seed", "tag": "t", "keys": ["k"]}]})
        assert sent.status_code == 200, sent.text
        admin.close()
        yield running


def _check(operation: Any, mode: schemathesis.GenerationMode, base_url: str,
           user: str, seen: dict[str, Counter[int]]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        response = None
        try:
            response = case.call_and_validate(base_url=base_url, headers={"accept": CONTENT_JSON},
                                              checks=CHECKS, timeout=10, auth=Signed(user))
        except Exception as exc:
            response = getattr(exc, "response", None)
            raise
        finally:
            status = getattr(response, "status_code", None)
            if status is not None:
                seen[user][status] += 1

    run()


@pytest.mark.parametrize("service", SERVICES)
def test_service_conforms_to_its_openapi_with_acl_on(acl_services: Cluster,
                                                     service: str) -> None:
    base_url = acl_services.urls()[service]
    assert httpx.get(f"{base_url}/v1/cluster").status_code in (401, 404)  # ACL is on
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    failures: list[str] = []
    seen: dict[str, Counter[int]] = {"admin": Counter(), "nobody": Counter()}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in VARIANTS:
            for user in ("admin", "nobody"):
                if user == "nobody" and mode is schemathesis.GenerationMode.NEGATIVE:
                    continue
                try:
                    _check(operation, mode, base_url, user, seen)
                except Unsatisfiable:
                    continue
                except (Exception, BaseExceptionGroup) as exc:
                    failures.append(f"{operation.label} [{mode.value}, {user}]: {exc}"[:3000])
    assert not failures, "\n\n".join(failures)
    # every generated request, however odd its path, query or body, verified: the signature's
    # canonical form is the same on both sides
    assert seen["admin"][401] == 0 and seen["nobody"][401] == 0, seen
    assert sum(n for status, n in seen["admin"].items() if status < 300) > 0, seen
    assert seen["nobody"][403] > 0, seen
