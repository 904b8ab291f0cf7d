"""``TidemqInstrumentor`` on and off (no system needed): off, the SDK's methods are its own and
its hook is None, so tracing costs nothing; ``opentelemetry-instrument`` finds it by its entry
point."""

from __future__ import annotations

import importlib.metadata

from tidemq import Producer, SimpleConsumer, TransactionProducer, _hooks
from tidemq.otel import TidemqInstrumentor


def test_off_means_the_sdk_own_methods_and_no_hook() -> None:
    methods = [(Producer, "send"), (Producer, "send_oneway"), (Producer, "send_batch"),
               (TransactionProducer, "send"), (SimpleConsumer, "receive"),
               (SimpleConsumer, "ack")]
    originals = [owner.__dict__[name] for owner, name in methods]
    assert _hooks.tracer is None
    TidemqInstrumentor().instrument()
    try:
        wrapped = [owner.__dict__[name] for owner, name in methods]
        assert all(w is not o for w, o in zip(wrapped, originals, strict=True))
        assert all(w.__wrapped__ is o for w, o in zip(wrapped, originals, strict=True))
        assert _hooks.tracer is not None
    finally:
        TidemqInstrumentor().uninstrument()
    assert [owner.__dict__[name] for owner, name in methods] == originals
    assert _hooks.tracer is None


def test_opentelemetry_instrument_finds_the_instrumentor() -> None:
    found = {e.name: e.value for e in importlib.metadata.entry_points(
        group="opentelemetry_instrumentor")}
    assert found.get("tidemq") == "tidemq.otel:TidemqInstrumentor"


def test_without_the_extra_the_import_names_it() -> None:
    """``import tidemq.otel`` with OpenTelemetry missing says which extra to install."""
    import subprocess
    import sys

    code = ("import sys\n"
            "sys.modules['opentelemetry'] = None  # as if not installed\n"
            "try:\n"
            "    import tidemq.otel\n"
            "except ModuleNotFoundError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "pip install 'tidemq[otel]'" in out and "opentelemetry" in out


def test_server_attributes_from_a_broker_url() -> None:
    from tidemq.otel._attributes import server

    assert server("http://10.0.0.7:10911") == {"server.address": "10.0.0.7", "server.port": 10911}
    assert server("https://broker-a.example") == {"server.address": "broker-a.example",
                                                  "server.port": 443}
    assert server("[::1]:10911") == {"server.address": "::1", "server.port": 10911}
    assert server(None) == {} and server("") == {}
