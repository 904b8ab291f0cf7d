"""The generated protobuf and gRPC modules of ``apache.rocketmq.v2``, and small helpers for them.

The modules come from the official client's wheel (``rocketmq-python-client``, package
``rocketmq.grpc_protocol``); tidemq ships no generated code of its own. Importing
``rocketmq.grpc_protocol`` the ordinary way runs ``rocketmq/__init__.py`` first, which starts the
whole client: OpenTelemetry, thread pools, and a log file under ``$HOME/logs``. The broker wants
only the message classes, so ``_load`` imports the subpackage under a bare stand-in for its
parent and removes the stand-in afterwards (an application importing ``rocketmq`` later still
gets the real client).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

PARENT = "rocketmq"
PACKAGE = "rocketmq.grpc_protocol"


def _load() -> tuple[Any, Any, Any]:
    """(definition_pb2, service_pb2, service_pb2_grpc) without running the client's __init__."""
    if PACKAGE not in sys.modules and PARENT not in sys.modules:
        spec = importlib.util.find_spec(PARENT)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("the gRPC front door needs the rocketmq-python-client package "
                              "(pip install rocketmq-python-client)")
        stand_in = types.ModuleType(PARENT)
        stand_in.__path__ = list(spec.submodule_search_locations)
        stand_in.__spec__ = spec
        sys.modules[PARENT] = stand_in
        try:
            importlib.import_module(PACKAGE)
        finally:
            if sys.modules.get(PARENT) is stand_in:
                del sys.modules[PARENT]
    return (importlib.import_module(f"{PACKAGE}.definition_pb2"),
            importlib.import_module(f"{PACKAGE}.service_pb2"),
            importlib.import_module(f"{PACKAGE}.service_pb2_grpc"))


pb, service_pb, service_grpc = _load()

#: ``apache.rocketmq.v2.Code`` values used by the front door.
Code = pb.Code
ClientType = pb.ClientType
MessageType = pb.MessageType
Permission = pb.Permission
FilterType = pb.FilterType
TransactionResolution = pb.TransactionResolution
TransactionSource = pb.TransactionSource

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"


def status(code: int, message: str = "") -> Any:
    """A ``Status`` with ``code``; the message defaults to the code's name."""
    return pb.Status(code=code, message=message or Code.Name(code))


def ok() -> Any:
    return status(Code.OK)


def duration_ms(value: Duration) -> int:
    return int(value.seconds) * 1000 + int(value.nanos) // 1_000_000


def timestamp_ms(value: Timestamp) -> int:
    return int(value.seconds) * 1000 + int(value.nanos) // 1_000_000


def set_timestamp(target: Timestamp, ms: int) -> None:
    target.seconds, rest = divmod(ms, 1000)
    target.nanos = rest * 1_000_000


def set_duration(target: Duration, ms: int) -> None:
    target.seconds, rest = divmod(ms, 1000)
    target.nanos = rest * 1_000_000
