"""The checks of what users hand the SDK: each raises ``ConfigurationError`` naming the argument.

Every entry point (``Message(...)``, ``send`` / ``send_batch`` / transactional ``send``, the
clients' constructors, ``subscribe``, ``Router.handler``) checks its arguments here before
anything is sent, so a wrong type never surfaces as a bare ``TypeError`` from deep inside.

- Integers: an ``int`` (or anything with ``__index__``), never a ``bool``.
- Durations (``delay_ms``): milliseconds as an ``int`` or a whole ``float``, or a
  ``datetime.timedelta`` (rounded down to the millisecond).
- Instants (``deliver_at_ms``): epoch milliseconds as an ``int`` or a whole ``float``, or a
  ``datetime.datetime`` (rounded down to the millisecond; a naive one is local time, as
  ``datetime.timestamp`` reads it).
- Names: topics and groups follow the broker's rule (``tidemq.protocol.topics``), tag
  expressions the broker's parser (``tidemq.protocol.tags``).
- Endpoints: ``nameservers`` is one URL, several comma-separated, or a list of URLs; with
  neither it nor ``broker_url``, ``TIDEMQ_NAMESERVER_URL`` (the CLI's variable) names them.

The per-message checks are type checks only (no regex), cheap enough for the send hot path.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tidemq._constants import NAMESERVER_URL_ENV
from tidemq._exceptions import ConfigurationError
from tidemq.protocol import ProtocolError
from tidemq.protocol.tags import tag_problem
from tidemq.protocol.topics import validate_group_name, validate_topic_name

#: What ``delay_ms`` takes: milliseconds (int or whole float) or a timedelta.
Duration = int | float | timedelta
#: What ``deliver_at_ms`` takes: epoch milliseconds (int or whole float) or a datetime.
Instant = int | float | datetime

_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _got(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def integer(value: object, name: str) -> int:
    """``value`` as an int: an int or an ``__index__`` type; a bool, float or str is refused."""
    if type(value) is int:
        return value
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise ConfigurationError(f"{name}: must be an integer, got {_got(value)}")


def optional_integer(value: object, name: str) -> int | None:
    return None if value is None else integer(value, name)


def _whole(value: object, name: str, what: str) -> int | None:
    """``value`` as an int when it is an int or a whole float (None: neither)."""
    if type(value) is int:
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ConfigurationError(f"{name}: must be a whole number of {what}, got {value!r}")
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def duration_ms(value: object, name: str = "delay_ms") -> int | None:
    """A delay in milliseconds: an int, a whole float or a ``timedelta`` (None stays None)."""
    if value is None or type(value) is int:
        return value
    if isinstance(value, timedelta):
        return value // _MS
    ms = _whole(value, name, "milliseconds")
    if ms is None:
        raise ConfigurationError(f"{name}: must be milliseconds (an int or a whole float) or a "
                                 f"datetime.timedelta, got {_got(value)}")
    return ms


def epoch_ms(value: object, name: str = "deliver_at_ms") -> int | None:
    """A point in time as epoch milliseconds: an int, a whole float or a ``datetime`` (an aware
    one, or a naive one read as local time); None stays None."""
    if value is None or type(value) is int:
        return value
    if isinstance(value, datetime):
        return (value.astimezone(UTC) - _EPOCH) // _MS
    ms = _whole(value, name, "milliseconds")
    if ms is None:
        raise ConfigurationError(f"{name}: must be epoch milliseconds (an int or a whole float) "
                                 f"or a datetime.datetime, got {_got(value)}")
    return ms


def text(value: object, name: str) -> str | None:
    """An optional string argument (None stays None)."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return str(value)
    raise ConfigurationError(f"{name}: must be a string, got {_got(value)}")


def keys(value: object) -> Sequence[str] | str:
    """``keys``: one string, or an iterable of strings (a list or tuple is kept as it is)."""
    if isinstance(value, str):
        return value
    if type(value) is list or type(value) is tuple:  # the common case, without ABC checks
        for item in value:
            if type(item) is not str:
                break
        else:
            return value
    elif isinstance(value, bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise ConfigurationError(f"keys: must be a string or a list of strings, got "
                                 f"{_got(value)}")
    items = value if isinstance(value, list | tuple) else list(value)
    for item in items:
        if not isinstance(item, str):
            raise ConfigurationError(f"keys: every key must be a string, got {_got(item)}")
    return items


def properties(value: object) -> Mapping[str, str]:
    """``properties``: a mapping of strings to strings."""
    if type(value) is dict:  # the common case, without ABC checks
        for k, v in value.items():
            if type(k) is not str or type(v) is not str:
                break
        else:
            return value
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"properties: must be a mapping of str to str, got "
                                 f"{_got(value)}")
    for k, v in value.items():
        if not isinstance(k, str):
            raise ConfigurationError(f"properties: names must be strings, got {_got(k)}")
        if not isinstance(v, str):
            raise ConfigurationError(f"properties: the value of {k!r} must be a string, got "
                                     f"{_got(v)}")
    return value


# -- names -----------------------------------------------------------------------------------

def topic_name(value: object, name: str = "topic") -> str:
    """A topic name by the broker's rule."""
    try:
        return validate_topic_name(value)  # type: ignore[arg-type]
    except ProtocolError as exc:
        raise ConfigurationError(f"{name}: {exc.message}") from None


def group_name(value: object, name: str = "group") -> str:
    """A consumer or producer group name by the broker's rule."""
    try:
        return validate_group_name(value)  # type: ignore[arg-type]
    except ProtocolError as exc:
        raise ConfigurationError(f"{name}: {exc.message}") from None


def tag_expression(value: object, name: str = "tag_expression") -> str | None:
    """The type of a tag expression (``TagExpression.parse`` checks its form)."""
    return text(value, name)


def single_tag(value: object, name: str = "tag") -> str | None:
    """One tag a handler is for (None: any tag): a tag a message may carry."""
    tag = text(value, name)
    if tag is None:
        return None
    problem = "is empty" if not tag else tag_problem(tag)
    if problem:
        raise ConfigurationError(f"{name}: one tag, or None for any; {tag!r} {problem}")
    return tag


# -- endpoints -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a client finds its routes: nameserver URLs, or one broker URL."""

    nameservers: tuple[str, ...]
    broker_url: str | None


def parse_urls(value: str) -> tuple[str, ...]:
    """Comma-separated base URLs, without blanks or trailing slashes (as the CLI reads
    ``TIDEMQ_NAMESERVER_URL``)."""
    return tuple(u.strip().rstrip("/") for u in value.split(",") if u.strip())


def endpoints(nameservers: str | Sequence[str] | None, broker_url: str | None,
              env: Mapping[str, str] | None = None) -> Endpoints:
    """The client's endpoints: ``nameservers`` (one URL, comma-separated URLs or a list) or
    ``broker_url``; with neither, ``TIDEMQ_NAMESERVER_URL`` from ``env`` (default: the
    process environment)."""
    if broker_url is not None and not isinstance(broker_url, str):
        raise ConfigurationError(f"broker_url: must be a URL string, got {_got(broker_url)}")
    broker = broker_url.strip().rstrip("/") if broker_url else ""  # "": not given
    if nameservers is None:
        if broker:
            return Endpoints((), broker)
        env = os.environ if env is None else env
        found = parse_urls(env.get(NAMESERVER_URL_ENV, ""))
        if not found:
            raise ConfigurationError(
                f"no endpoints: pass nameservers=[...] (or broker_url=...), or set "
                f"{NAMESERVER_URL_ENV} (comma-separated URLs)")
        return Endpoints(found, None)
    urls = _nameserver_urls(nameservers)
    if broker and urls:
        raise ConfigurationError("give either nameservers=[...] or broker_url=..., not both")
    if broker:
        return Endpoints((), broker)  # nameservers=[] beside a broker_url: the broker
    if not urls:
        raise ConfigurationError(f"nameservers: is empty ({nameservers!r}); give at least one "
                                 f"URL like http://127.0.0.1:9876, or broker_url=...")
    return Endpoints(urls, None)


def _nameserver_urls(nameservers: object) -> tuple[str, ...]:
    if isinstance(nameservers, str):
        urls = parse_urls(nameservers)
    elif isinstance(nameservers, Iterable) and not isinstance(nameservers, bytes | Mapping):
        items = list(nameservers)
        for item in items:
            if not isinstance(item, str):
                raise ConfigurationError(f"nameservers: every entry must be a URL string, got "
                                         f"{_got(item)}")
        urls = tuple(u for item in items for u in parse_urls(item))
    else:
        raise ConfigurationError(f"nameservers: must be a URL, comma-separated URLs or a list "
                                 f"of URLs, got {_got(nameservers)}")
    return urls
