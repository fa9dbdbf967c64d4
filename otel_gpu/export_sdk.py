"""The OpenTelemetry SDK side of export: OTLP exporter, periodic reader, MeterProvider, resource.

Imported only where OTLP export starts (or a resource is built), never at `otel-gpu agent`'s
start-up: the SDK and its exporters are ~7 MB of a long-running agent's memory. Settings come
from export.py (`OtlpSettings`).
"""
from __future__ import annotations

import threading
from typing import Mapping, Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from .export import OtlpSettings
from .readings import MetricSpec


class CountingExporter(MetricExporter):
    """Wraps an exporter and counts failed exports (whose points are dropped).

    Cumulative temporality means a dropped export loses resolution, never totals,
    and nothing queues up in memory while the backend is down.
    """

    def __init__(self, inner: MetricExporter, lines=None, reason=None):
        """`lines`: an export_errors.ErrorLines told every result; `reason`: the LastReason of the
        exporter's log (the SDK's own messages then go nowhere else)."""
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self._inner = inner
        self._lock = threading.Lock()
        self.failures = 0
        self.exports = 0
        self.lines, self.reason = lines, reason

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # an exporter bug must not kill the export thread; it is counted
            result = MetricExportResult.FAILURE
            if self.reason is not None:
                self.reason.reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
        with self._lock:
            self.exports += 1
            if result is not MetricExportResult.SUCCESS:
                self.failures += 1
            if self.lines is not None:
                self.lines.result(result is MetricExportResult.SUCCESS, self.reason.reason if self.reason else None)
            if self.reason is not None and result is MetricExportResult.SUCCESS:
                self.reason.reason = None   # a failure's reason holds until an export succeeds
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


def otlp_exporter(settings: OtlpSettings, say=None) -> CountingExporter:
    """The OTLP metric exporter for `settings`, wrapped to count failures. `say`: where a failed export
    is said in one line (export_errors.ErrorLines), the SDK's own log messages taken over."""
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        inner = OTLPMetricExporter(endpoint=settings.endpoint, timeout=settings.timeout_s)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        endpoint = settings.endpoint.rstrip("/")
        if not endpoint.endswith("/v1/metrics"):
            endpoint += "/v1/metrics"
        inner = OTLPMetricExporter(endpoint=endpoint, timeout=settings.timeout_s)
    if say is None:
        return CountingExporter(inner)
    from .export_errors import ErrorLines, probe, take_over
    lines = ErrorLines(say, settings.endpoint, explain=lambda: probe(settings.endpoint))
    return CountingExporter(inner, lines, take_over())


def import_exporter(protocol: str) -> None:
    """Import the OTLP exporter for `protocol` and the HTTP stack it loads when built; starts
    nothing. A process pays these imports (about 0.2 s) where it chooses, not at its first export set-up."""
    if protocol == "grpc":
        import opentelemetry.exporter.otlp.proto.grpc.metric_exporter  # noqa: F401
    else:
        import opentelemetry.exporter.otlp.proto.http.metric_exporter  # noqa: F401
        import importlib.util
        if importlib.util.find_spec("requests") is not None:   # the HTTP transport imports it when built
            import requests  # noqa: F401


def histogram_views(specs: Sequence[MetricSpec]) -> list[View]:
    """Explicit buckets (seconds) for histogram specs: the SDK defaults are for milliseconds."""
    return [View(instrument_name=s.name, aggregation=ExplicitBucketHistogramAggregation(list(s.buckets)))
            for s in specs if s.kind == "histogram" and s.buckets]


def periodic_reader(exporter: MetricExporter, settings: OtlpSettings) -> MetricReader:
    return PeriodicExportingMetricReader(exporter, export_interval_millis=settings.interval_s * 1000,
                                         export_timeout_millis=settings.timeout_s * 1000)


def merged_resource(resource_attrs: Mapping[str, str]) -> Resource:
    """Ours first, then `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME` on top: the user's values win."""
    from opentelemetry.sdk.resources import OTELResourceDetector

    return Resource.create(dict(resource_attrs)).merge(OTELResourceDetector().detect())


def meter_provider(resource: Resource | Mapping[str, str], readers: Sequence[MetricReader],
                   specs: Sequence[MetricSpec] = (), shutdown_on_exit: bool = True) -> MeterProvider:
    """A MeterProvider (not set globally: the user's own OTel setup stays untouched).

    `resource` is a Resource, or our attributes to merge with the OTEL_* variables.
    """
    if not isinstance(resource, Resource):
        resource = merged_resource(resource)
    return MeterProvider(resource=resource, metric_readers=list(readers), views=histogram_views(specs),
                         shutdown_on_exit=shutdown_on_exit)
