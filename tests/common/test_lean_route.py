"""``LeanRoute``: plain parameters skip FastAPI's machinery, anything else keeps FastAPI's answers,
and the OpenAPI description does not change."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.testclient import TestClient
from starlette.datastructures import QueryParams

from tidemq_server.broker.messaging.pull import DEFAULT_PULL, MAX_PULL
from tidemq_server.broker.routes.messages import pull_params
from tidemq_server.common.constants import LONG_POLL_MAX_MS
from tidemq_server.common.lean import LeanRoute, lean, plain_int

parsed: list[str] = []  # the queries the lean path read


def parse(request: Request) -> dict[str, Any] | None:
    parsed.append(request.url.query)
    n = plain_int(request.query_params.get("n", "1"), 1, 10)
    return None if n is None else {"name": request.path_params["name"], "n": n}


def build(route_class: type[Any]) -> FastAPI:
    router = APIRouter(route_class=route_class)

    @router.get("/things/{name}")
    @lean(parse)
    async def thing(name: str, request: Request,
                    n: Annotated[int, Query(ge=1, le=10)] = 1) -> Response:
        return Response(f"{name}:{n}")

    app = FastAPI()
    app.include_router(router)
    return app


@pytest.mark.parametrize(("query", "status", "text"), [
    ("", 200, "a:1"), ("?n=7", 200, "a:7"), ("?n=+7", 200, "a:7"), ("?n=0", 422, None),
    ("?n=11", 422, None), ("?n=x", 422, None), ("?n=", 422, None),
])
def test_same_answers_as_fastapi(query: str, status: int, text: str | None) -> None:
    parsed.clear()
    got = TestClient(build(LeanRoute)).get("/things/a" + query)
    assert parsed == [query.lstrip("?")]
    want = TestClient(build(APIRouter().route_class)).get("/things/a" + query)
    assert (got.status_code, got.text) == (want.status_code, want.text)
    assert got.status_code == status
    if text is not None:
        assert got.text == text


def test_openapi_unchanged() -> None:
    assert build(LeanRoute).openapi() == build(APIRouter().route_class).openapi()


class FakeRequest:
    def __init__(self, queue_id: str, query: str) -> None:
        self.path_params = {"topic": "t", "queue_id": queue_id}
        self.query_params = QueryParams(query)


def test_pull_params_plain_and_defaults() -> None:
    query = "offset=5&max=10&wait_ms=200&tags=a||b&group=g"
    got = pull_params(FakeRequest("3", query))  # type: ignore[arg-type]
    assert got == {"topic": "t", "queue_id": 3, "offset": 5, "max": 10, "wait_ms": 200,
                   "tags": "a||b", "group": "g", "form": "messages"}
    assert pull_params(FakeRequest("0", "")) == {  # type: ignore[arg-type]
        "topic": "t", "queue_id": 0, "offset": 0, "max": DEFAULT_PULL, "wait_ms": 0,
        "tags": "*", "group": None, "form": "messages"}
    stored = pull_params(FakeRequest("1", "form=stored"))  # type: ignore[arg-type]
    assert stored["form"] == "stored"


@pytest.mark.parametrize(("queue_id", "query"), [
    ("-1", ""), ("x", ""), ("0", "offset=-1"), ("0", "max=0"), ("0", f"max={MAX_PULL + 1}"),
    ("0", f"wait_ms={LONG_POLL_MAX_MS + 1}"), ("0", "offset= 1"), ("0", "offset=1.0"),
])
def test_pull_params_leave_the_rest_to_fastapi(queue_id: str, query: str) -> None:
    assert pull_params(FakeRequest(queue_id, query)) is None  # type: ignore[arg-type]
