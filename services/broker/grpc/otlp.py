"""The official RocketMQ 5 clients' own metrics: accepted on the gRPC door over OTLP.

A RocketMQ 5 client exports its metrics (send cost, delivery latency, await and process time,
cached messages) with OpenTelemetry's OTLP/gRPC exporter to whatever ``Settings.metric`` names.
Saying "off" there is not enough: the official Python push consumer registers its gauges on a
meter provider it only builds when metrics are on, and with "off" it fails on every settings
answer (``'NoneType' object has no attribute 'get_meter'``, logged as an error) and stops
reading its Telemetry stream. So a plaintext door answers "on", naming itself, and serves
``opentelemetry.proto.collector.metrics.v1.MetricsService`` here: each export is counted
(``tidemq_broker_grpc_client_metric_exports_total``, and its data points) and acknowledged;
the figures themselves are not kept. A TLS door answers "off": the clients' exporter always
dials in plaintext (``insecure=True``), and a failing export every minute would be worse.
"""

from __future__ import annotations

from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from prometheus_client import CollectorRegistry, Counter

# data point fields of each metric kind (opentelemetry.proto.metrics.v1.Metric's oneof)
_KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def data_points(request: Any) -> int:
    """How many data points an ``ExportMetricsServiceRequest`` carries."""
    count = 0
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind in _KINDS:
                    count += len(getattr(metric, kind).data_points)
    return count


class MetricsSink(metrics_service_pb2_grpc.MetricsServiceServicer):
    """Acknowledges and counts OTLP metric exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.exports = Counter("tidemq_broker_grpc_client_metric_exports",
                               "OTLP metric exports received from RocketMQ 5 clients",
                               registry=registry)
        self.points = Counter("tidemq_broker_grpc_client_metric_points",
                              "Data points in those exports", registry=registry)

    async def Export(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.exports.inc()
        self.points.inc(data_points(request))
        return metrics_service_pb2.ExportMetricsServiceResponse()


def serve(server: grpc.aio.Server, registry: CollectorRegistry) -> None:
    """Add the OTLP metrics service to the door's gRPC server."""
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsSink(registry), server)
