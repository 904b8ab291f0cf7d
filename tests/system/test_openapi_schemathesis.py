"""Every service's OpenAPI document against the running service, with schemathesis.

For each operation of the broker, nameserver, scheduler, checker and metrics sidecar, cases are
generated from the document (valid ones and invalid ones, bodies in JSON and msgpack, answers
asked in JSON and in msgpack, internal endpoints with the cluster token) and sent to real
processes. Each answer must be no 5xx, carry a status the document declares, and match the
schema declared for that status. The number of cases per operation is bounded so the whole run
stays near a minute.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)
from tidemq.protocol import CONTENT_JSON, CONTENT_MSGPACK

from tests.support import openapi
from tests.support.broker import TOKEN
from tests.support.cluster import Cluster, all_services
from tidemq_server.common.constants import TOKEN_HEADER

pytestmark = pytest.mark.integration

__all__ = ["all_services", "openapi"]  # the fixture; msgpack for schemathesis

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
EXAMPLES = 10  # generated cases per operation and variant
# (generation mode, the answer's encoding): valid cases both ways, invalid ones in JSON
VARIANTS = ((schemathesis.GenerationMode.POSITIVE, CONTENT_JSON),
            (schemathesis.GenerationMode.POSITIVE, CONTENT_MSGPACK),
            (schemathesis.GenerationMode.NEGATIVE, CONTENT_JSON))
SERVICES = ("broker", "nameserver", "scheduler", "checker", "metrics")


def _check(operation: Any, mode: schemathesis.GenerationMode, base_url: str,
           headers: dict[str, str]) -> None:
    """Send ``EXAMPLES`` generated cases of one operation; raises when a check fails."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=10)

    run()


def _failures_of(schema: Any, base_url: str) -> list[str]:
    """Run every operation of ``schema``; one entry per operation and variant that failed."""
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode, answer in VARIANTS:
            try:
                _check(operation, mode, base_url, {TOKEN_HEADER: TOKEN, "accept": answer})
            except Unsatisfiable:  # no invalid input exists (e.g. no parameters at all)
                continue
            except (Exception, BaseExceptionGroup) as exc:  # checks failed: report all at the end
                failures.append(f"{operation.label} [{mode.value}, {answer}]: {exc}"[:3000])
    return failures


@pytest.mark.parametrize("service", SERVICES)
def test_service_conforms_to_its_openapi(all_services: Cluster, service: str) -> None:
    base_url = all_services.urls()[service]
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 3, [o.label for o in operations]
    failures = _failures_of(schema, base_url)
    assert not failures, "\n\n".join(failures)
