"""Real OTLP/HTTP request bodies, made by the OpenTelemetry SDK and its exporter's encoder."""
from __future__ import annotations

from typing import Callable

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource


def body(record: Callable, resource: dict[str, str] | None = None) -> bytes:
    """`record(meter)` creates and records instruments; returns the encoded request of one collection."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=Resource.create(resource or {"host.name": "n1"}), metric_readers=[reader])
    try:
        record(provider.get_meter("test"))
        return encode_metrics(reader.get_metrics_data()).SerializeToString()
    finally:
        provider.shutdown()
