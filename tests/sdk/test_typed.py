"""``Router`` (tidemq._typed) without a broker: decoding by annotation, routing by tag, the
subscriptions it asks for, bad bodies and bad registrations; a model as a producer's body."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from tidemq import (
    BodyDecodeError,
    ConfigurationError,
    ConsumeResult,
    Message,
    ReceivedMessage,
    Router,
)
from tidemq._send import as_message


class OrderPaid(BaseModel):
    order_id: int
    amount: float


def received(body: bytes, topic: str = "Orders", tag: str | None = "Paid") -> ReceivedMessage:
    return ReceivedMessage(message_id="m-1", topic=topic, queue_id=0, queue_offset=0,
                           body=body, tag=tag)


async def test_each_annotation_decodes_its_way() -> None:
    router = Router()
    got: dict[str, Any] = {}

    @router.handler("Orders", tag="Paid")
    async def paid(order: OrderPaid) -> None:
        got["paid"] = order

    @router.handler("Orders", tag="Note")
    async def note(text: str, message: ReceivedMessage) -> ConsumeResult:
        got["note"] = (text, message.message_id)
        return ConsumeResult.RETRY_LATER

    @router.handler("Audit")
    async def audit(record: dict[str, Any]) -> None:
        got["audit"] = record

    @router.handler("Raw")
    async def raw(body: bytes) -> None:
        got["raw"] = body

    assert await router(received(b'{"order_id": 42, "amount": 9.9}')) is None
    assert got["paid"] == OrderPaid(order_id=42, amount=9.9)
    assert await router(received("déjà".encode(), tag="Note")) is ConsumeResult.RETRY_LATER
    assert got["note"] == ("déjà", "m-1")
    await router(received(b'{"who": "ops"}', topic="Audit", tag=None))
    assert got["audit"] == {"who": "ops"}
    await router(received(b"\xff\x00", topic="Raw", tag="Any"))
    assert got["raw"] == b"\xff\x00"


async def test_exact_tag_first_then_the_topic_catch_all() -> None:
    router, calls = Router(), []

    @router.handler("Orders", tag="Paid")
    async def paid(body: bytes) -> None:
        calls.append("paid")

    @router.handler("Orders")
    async def other(body: bytes) -> None:
        calls.append("other")

    await router(received(b"", tag="Paid"))
    await router(received(b"", tag="Refunded"))
    await router(received(b"", tag=None))
    assert calls == ["paid", "other", "other"]


async def test_a_message_no_handler_takes_is_consumed_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    router = Router()

    @router.handler("Orders", tag="Paid")
    async def paid(body: bytes) -> None:
        raise AssertionError("not this one")

    assert await router(received(b"", tag="Refunded")) is ConsumeResult.SUCCESS
    assert "no handler for topic 'Orders' tag 'Refunded'" in caplog.text


def test_subscriptions_cover_every_handler() -> None:
    router = Router()

    async def h(body: bytes) -> None: ...

    router.handler("Orders", tag="Paid")(h)
    router.handler("Orders", tag="Created")(h)
    router.handler("Audit", tag="Login")(h)
    router.handler("Audit")(h)
    assert router.subscriptions == {"Orders": "Created || Paid", "Audit": "*"}


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"order_id": "x", "amount": 1}', "not a valid OrderPaid: 1 error(s): order_id:"),
    (b'{"amount": 1}', "order_id: Field required"),
    (b"not json", "not a valid OrderPaid"),
])
async def test_a_body_that_is_not_the_model_raises_with_the_reason(body: bytes,
                                                                    reason: str) -> None:
    router = Router()

    @router.handler("Orders", tag="Paid")
    async def paid(order: OrderPaid) -> None:
        raise AssertionError("never called with a bad body")

    with pytest.raises(BodyDecodeError, match="message m-1 of 'Orders'") as caught:
        await router(received(body))
    assert reason in str(caught.value)


@pytest.mark.parametrize(("annotation", "body", "reason"), [
    (dict, b"[1, 2]", "JSON but not an object: list"),
    (dict, b"{", "the body is not JSON"),
    (str, b"\xff", "not UTF-8 text"),
])
async def test_dict_and_str_refuse_what_they_cannot_read(annotation: type, body: bytes,
                                                         reason: str) -> None:
    router = Router()

    async def handler(value: Any) -> None: ...

    router.handler("T", model=annotation)(handler)
    with pytest.raises(BodyDecodeError, match=reason):
        await router(received(body, topic="T"))


def test_registrations_that_cannot_work_fail_at_once() -> None:
    router = Router()

    async def h(body: bytes) -> None: ...

    router.handler("Orders", tag="Paid")(h)
    with pytest.raises(ConfigurationError, match="already has a handler for tag 'Paid'"):
        router.handler("Orders", tag="Paid")(h)
    with pytest.raises(ConfigurationError, match="one tag"):
        router.handler("Orders", tag="A || B")
    with pytest.raises(ConfigurationError, match="must be async"):
        router.handler("Sync")(lambda body: None)
    with pytest.raises(ConfigurationError, match="body type must be"):
        router.handler("Ints", model=int)(h)

    class Local(BaseModel):  # not resolvable from the module: the error says what to do
        x: int

    async def local(value: Local) -> None: ...

    with pytest.raises(ConfigurationError, match="pass model="):
        router.handler("Local")(local)
    router.handler("Local", model=Local)(local)  # the way out works


def test_a_model_is_sent_as_its_json() -> None:
    message = as_message(OrderPaid(order_id=7, amount=1.5), {"topic": "Orders"})
    assert message == Message(body=b'{"order_id":7,"amount":1.5}', topic="Orders")
    with pytest.raises(ConfigurationError, match="a pydantic model"):
        as_message(object(), {"topic": "Orders"})  # type: ignore[arg-type]
