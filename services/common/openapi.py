"""What every service's OpenAPI document says beyond the routes: errors, msgpack, the token.

Routes declare their answer as ``response_model`` (documentation only: they return a ready
``Response``, which FastAPI passes through unvalidated) and the errors they raise with
``responses=errors(...)``. ``finish_openapi`` then completes every operation the same way:

- the error shape ``{code, message}`` (``ErrorBody``) under each status the operation can
  answer: 400 for any parameter or body, 413 and 415 for a body, 401 where the token is needed,
  401 and 403 everywhere but /healthz and /metrics (signed requests, when ACL is on);
  FastAPI's 422 ``HTTPValidationError`` is removed (validation errors answer 400);
- every JSON answer is also offered as ``application/msgpack`` (same fields; bytes stay raw);
- endpoints that need the cluster token (every ``/internal/`` one) declare it through the
  ``ClusterToken`` security scheme (``X-Tidemq-Token``, see
  ``tidemq_server.common.app.token_guard``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path
from pydantic import BaseModel, Field
from tidemq.protocol import CONTENT_JSON, CONTENT_MSGPACK, ErrorCode
from tidemq.protocol.topics import GROUP_NAME_RE, TOPIC_NAME_RE

ERROR_REF = "#/components/schemas/ErrorBody"
_DROPPED_SCHEMAS = ("HTTPValidationError", "ValidationError")

# The name rules, published (not enforced: the routes check names themselves and answer
# INVALID_TOPIC_NAME / BAD_REQUEST with a message saying the rule).
TOPIC_RULE: dict[str, Any] = {"pattern": TOPIC_NAME_RE.pattern}
GROUP_RULE: dict[str, Any] = {"pattern": GROUP_NAME_RE.pattern}
TopicName = Annotated[str, Path(description="a topic: 1-127 of A-Z a-z 0-9 _ % | -",
                                json_schema_extra=TOPIC_RULE)]
GroupName = Annotated[str, Path(description="a group: 1-127 of A-Z a-z 0-9 _ % | -",
                                json_schema_extra=GROUP_RULE)]


class ErrorBody(BaseModel):
    """Every error answer: the API code and a message saying what is wrong and what to do."""

    code: str = Field(description="an API error code (UPPER_SNAKE), e.g. BAD_REQUEST")
    message: str = Field(description="what is wrong and what to do")


class Empty(BaseModel):
    """An answer without fields: ``{}``."""


class Health(BaseModel):
    status: str = Field(description='"ok" while the process serves')


def errors(*codes: ErrorCode) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route that may answer these codes (grouped by HTTP status)."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(code.http_status, []).append(code.value)
    return {status: {"model": ErrorBody, "description": ", ".join(names)}
            for status, names in by_status.items()}


def _add_error(responses: dict[str, Any], status: int, description: str) -> None:
    entry = responses.setdefault(str(status), {})
    known = entry.get("description", "")
    if description not in known:
        entry["description"] = f"{known}, {description}" if known else description


#: Answered without a signature even with ACL on (tidemq_server.common.auth.rest_rules.OPEN_PATHS)
_OPEN = ("/healthz", "/metrics")


def _complete(operation: dict[str, Any], path: str = "") -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    responses.pop("422", None)
    if path not in _OPEN:  # with accounts on (docs/api.md, Authentication)
        _add_error(responses, 401, "UNAUTHORIZED")
        _add_error(responses, 403, "FORBIDDEN")
    if operation.get("parameters") or operation.get("requestBody"):
        _add_error(responses, 400, "BAD_REQUEST")
    if operation.get("requestBody"):
        _add_error(responses, 413, "MESSAGE_TOO_LARGE")
        _add_error(responses, 415, "UNSUPPORTED_MEDIA_TYPE")
    if operation.get("security"):
        _add_error(responses, 401, "UNAUTHORIZED")
    for status, entry in responses.items():
        if status.startswith(("4", "5")):
            entry["content"] = {CONTENT_JSON: {"schema": {"$ref": ERROR_REF}}}
    ok = responses.get("200", {}).get("content", {})
    if CONTENT_JSON in ok and CONTENT_MSGPACK not in ok:
        ok[CONTENT_MSGPACK] = {"schema": ok[CONTENT_JSON].get("schema", {})}


def complete_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Apply the rules of this module to a generated OpenAPI document (in place)."""
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                _complete(operation, path)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in _DROPPED_SCHEMAS:
        schemas.pop(name, None)
    schemas["ErrorBody"] = ErrorBody.model_json_schema()
    return schema


def finish_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` answer the completed document (built once, then cached)."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete_schema(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
