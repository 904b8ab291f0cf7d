"""The broker's gRPC front door: RocketMQ 5's ``apache.rocketmq.v2.MessagingService``.

The official RocketMQ 5 clients (e.g. PyPI ``rocketmq-python-client``) work against tidemq
through it unmodified. Every RPC calls the broker's service layer, the same functions the REST
routes call. Modules: ``proto`` (the generated stubs), ``errors`` (status mapping), ``messages``
(conversions), ``sessions`` (connected clients, settings), ``routing``, ``producing``,
``consuming``, ``telemetry`` (the RPC handlers), ``servicer`` (dispatch), ``server``.
"""

from __future__ import annotations

from tidemq_server.broker.grpc.server import GrpcFrontDoor

__all__ = ["GrpcFrontDoor"]
