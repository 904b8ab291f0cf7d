"""OpenTelemetry traces for tidemq (``pip install 'tidemq[otel]'``), switched on the way
OpenTelemetry instrumentations are::

    from tidemq.otel import TidemqInstrumentor
    TidemqInstrumentor().instrument()          # the global tracer provider, or tracer_provider=

or with no code at all by ``opentelemetry-instrument python app.py`` (entry point
``opentelemetry_instrumentor``). ``uninstrument()`` switches it off again. Off, nothing of
this runs: no wrapper is installed and the SDK's hook (``tidemq._hooks``) is None.

Spans follow the OpenTelemetry messaging conventions (``messaging.system=rocketmq``):

==========================  ========  ==================================================
span                        kind      where
==========================  ========  ==================================================
``send {topic}``            PRODUCER  ``Producer.send`` / ``send_oneway`` / ``send_batch``,
                                      ``TransactionProducer.send`` (half, local
                                      transaction and end; type ``transaction``)
``check {topic}``           CONSUMER  a transactional producer answering a check-back
``receive {topic}``         CLIENT    ``SimpleConsumer.receive``
``process {topic}``         CONSUMER  a push consumer's handler, one message
``settle {topic}``          CLIENT    ``SimpleConsumer.ack`` (``tidemq.settle.action=ack``),
                                      a push consumer's hand-back to ``%RETRY%`` (``retry``)
==========================  ========  ==================================================

with ``messaging.destination.name``, ``messaging.message.id``,
``messaging.consumer.group.name``, ``messaging.rocketmq.message.type`` (normal, fifo, delay,
transaction), ``.tag``, ``.keys``, ``.delivery_timestamp``, ``.delay_time_level`` and the
rest listed in ``tidemq.otel._attributes``. Kinds are those of the conventions' table
(receive and settle are CLIENT operations).

The send span's context travels in the message's properties (W3C ``traceparent``), through a
half message and its commit — also a commit after a check-back, whose ``check`` span is a
child of that context — a delay of any length, and retries. A "process" span is a child of the
message's creation context and links to it, so one trace runs from the request that sent a
message to every handler that consumed it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
        BaseInstrumentor,
    )
except ModuleNotFoundError as exc:  # the extra is not installed: say which one
    raise ModuleNotFoundError(
        f"tidemq.otel needs OpenTelemetry ({exc.name} is missing): "
        "pip install 'tidemq[otel]' (opentelemetry-api and opentelemetry-instrumentation; "
        "the application brings its opentelemetry-sdk and exporter)", name=exc.name) from exc

from tidemq import __version__, _hooks
from tidemq.otel._attributes import SCHEMA_URL, Shapes
from tidemq.otel._propagation import creation_context
from tidemq.otel._tracer import OtelTracer
from tidemq.otel._wrappers import Patch, unwrap, wrap

__all__ = ["TidemqInstrumentor", "creation_context"]


class TidemqInstrumentor(BaseInstrumentor):
    """Instruments every tidemq client of this process (a singleton, as every instrumentor)."""

    _patches: list[Patch] = []

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("tidemq >= 0.1",)

    def _instrument(self, **kwargs: Any) -> None:
        tracer = trace.get_tracer(__name__, __version__, kwargs.get("tracer_provider"),
                                  schema_url=SCHEMA_URL)
        shapes = Shapes()
        self._patches = wrap(tracer, shapes)
        _hooks.tracer = OtelTracer(tracer, shapes)

    def _uninstrument(self, **kwargs: Any) -> None:
        _hooks.tracer = None
        unwrap(self._patches)
        self._patches = []
