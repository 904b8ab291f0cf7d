"""Typed handlers: a ``Router`` of handlers by topic and tag, bodies decoded by type.

    class OrderPaid(BaseModel):
        order_id: int
        amount: Decimal

    router = Router()

    @router.handler("Orders", tag="Paid")
    async def on_paid(order: OrderPaid) -> None:          # None: consumed
        ...

    @router.handler("Orders")                               # any other tag of Orders
    async def on_other(body: dict, message: ReceivedMessage) -> ConsumeResult:
        ...

    consumer = PushConsumer("billing", nameservers=[...], handler=router,
                            subscriptions=router.subscriptions)

    await producer.send(OrderPaid(order_id=42, amount=Decimal("9.90")), topic="Orders",
                        tag="Paid")                        # a model is sent as its JSON

A handler's first parameter receives the body decoded by its annotation (or ``model=``):
a pydantic model (``model_validate_json``), ``dict`` (a JSON object), ``str`` (UTF-8),
``bytes`` (as is) or ``ReceivedMessage`` (the whole message); a second parameter, if any,
receives the ``ReceivedMessage``. A handler returns None (consumed) or a ``ConsumeResult``.

A body that does not decode raises ``BodyDecodeError`` inside the consumer: the message goes
to the group's retry topic like any failure, then to its DLQ, and every copy the broker makes
carries the reason in the property ``TIDE_CONSUME_FAILURE``.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

from tidemq import _validate as V
from tidemq._exceptions import ConfigurationError
from tidemq._puller import ConsumeResult
from tidemq.protocol import ReceivedMessage

log = logging.getLogger("tidemq.typed")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class BodyDecodeError(ValueError):
    """A message body does not decode into the type its handler takes."""


class JsonModel(Protocol):
    """What ``send`` takes as a model: anything with pydantic's ``model_dump_json``."""

    def model_dump_json(self) -> str: ...


def model_body(value: object) -> bytes | None:
    """The JSON body of a pydantic model (``model_dump_json``); None for anything else."""
    dump = getattr(value, "model_dump_json", None)
    if dump is None or isinstance(value, type):
        return None
    return str(dump()).encode("utf-8")


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and callable(getattr(tp, "model_validate_json", None))


def decoder(tp: Any) -> Callable[[ReceivedMessage], Any]:
    """How a body becomes a ``tp``; ``ConfigurationError`` for a type tidemq cannot decode."""
    origin = typing.get_origin(tp) or tp
    if tp is inspect.Parameter.empty or origin is bytes:
        return lambda m: m.body
    if origin is ReceivedMessage:
        return lambda m: m
    if origin is str:
        return _text
    if origin is dict:
        return _json_object
    if _is_model(tp):
        return lambda m: _model(tp, m)
    raise ConfigurationError(f"a handler's body type must be a pydantic model, dict, str, bytes "
                             f"or ReceivedMessage, got {tp!r}")


def _text(message: ReceivedMessage) -> str:
    try:
        return message.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyDecodeError(f"the body is not UTF-8 text: {exc}") from exc


def _json_object(message: ReceivedMessage) -> dict[str, Any]:
    try:
        value = orjson.loads(message.body)
    except orjson.JSONDecodeError as exc:
        raise BodyDecodeError(f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BodyDecodeError(f"the body is JSON but not an object: {type(value).__name__}")
    return value


def _model(model: Any, message: ReceivedMessage) -> Any:
    try:
        return model.model_validate_json(message.body)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        if callable(errors):
            parts = [f"{'.'.join(map(str, e.get('loc', ()))) or 'body'}: {e.get('msg')}"
                     for e in errors()]
            reason = f"{len(parts)} error(s): " + "; ".join(parts)
        else:
            reason = str(exc)
        raise BodyDecodeError(f"the body is not a valid {model.__name__}: {reason}") from exc


@dataclass(frozen=True, slots=True)
class _Route:
    handler: Callable[..., Awaitable[Any]]
    decode: Callable[[ReceivedMessage], Any]
    with_message: bool  # the handler takes the ReceivedMessage as its second argument


class Router:
    """Handlers by topic and tag; a ``PushConsumer``'s handler (it is callable)."""

    def __init__(self) -> None:
        self._routes: dict[str, dict[str | None, _Route]] = {}

    def handler(self, topic: str, *, tag: str | None = None,
                model: type | None = None) -> Callable[[F], F]:
        """Register the decorated async function for ``topic`` messages with ``tag`` (None:
        every tag without a handler of its own). ``model`` overrides the first parameter's
        annotation (needed when it cannot be resolved, e.g. a class defined in a function)."""
        V.topic_name(topic)
        V.single_tag(tag)

        def register(fn: F) -> F:
            if not inspect.iscoroutinefunction(typing.cast(Any, fn)):
                raise ConfigurationError(f"{fn.__qualname__}: a handler must be async")
            routes = self._routes.setdefault(topic, {})
            if tag in routes:
                raise ConfigurationError(f"{topic!r} already has a handler for tag {tag!r}: "
                                         f"{routes[tag].handler.__qualname__}")
            params = list(inspect.signature(fn).parameters.values())
            if not 1 <= len(params) <= 2:
                raise ConfigurationError(f"{fn.__qualname__}: a handler takes the body and "
                                         "optionally the ReceivedMessage")
            body_type = model if model is not None else _annotation(fn, params[0])
            routes[tag] = _Route(fn, decoder(body_type), len(params) == 2)
            return fn
        return register

    @property
    def subscriptions(self) -> dict[str, str]:
        """Topic → tag expression covering every handler (``*`` where one takes any tag)."""
        return {topic: "*" if None in routes else " || ".join(sorted(t for t in routes if t))
                for topic, routes in self._routes.items()}

    async def __call__(self, message: ReceivedMessage) -> ConsumeResult | None:
        routes = self._routes.get(message.topic, {})
        route = routes.get(message.tag) or routes.get(None)
        if route is None:
            log.warning("no handler for topic %r tag %r: message %s skipped", message.topic,
                        message.tag, message.message_id)
            return ConsumeResult.SUCCESS
        try:
            body = route.decode(message)
        except BodyDecodeError as exc:
            raise BodyDecodeError(f"message {message.message_id} of {message.topic!r}: {exc}") \
                from exc
        result: ConsumeResult | None = await (route.handler(body, message) if route.with_message
                                             else route.handler(body))
        return result


def _annotation(fn: Callable[..., Any], param: inspect.Parameter) -> Any:
    if param.annotation is inspect.Parameter.empty:
        return param.annotation
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError) as exc:
        raise ConfigurationError(f"{fn.__qualname__}: cannot resolve the annotation of "
                                 f"{param.name!r} ({exc}); pass model=... to handler()") from exc
    return hints.get(param.name, inspect.Parameter.empty)
