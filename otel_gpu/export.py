"""OpenTelemetry export settings shared by the node agent and the training hooks.

Configured by the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`..._METRICS_ENDPOINT`), `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc` | `http/protobuf`),
`OTEL_METRIC_EXPORT_INTERVAL` (ms), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`.

No OpenTelemetry import here: the SDK side (exporter, reader, MeterProvider, resource) is in
export_sdk.py, imported on first use of one of its names (`from otel_gpu.export import
meter_provider` still works), so a node agent that serves only Prometheus never loads the SDK.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping
from urllib.parse import unquote

from .errors import ConfigError
from .values import http_url, number

PROTOCOLS = ("grpc", "http/protobuf")
INTERVAL_MS = (10.0, 86_400_000.0)   # 10 ms to a day: outside, a typo (or a busy loop, or a window never trimmed)
TIMEOUT_MS = (1.0, 3_600_000.0)      # 1 ms to an hour


@dataclass(frozen=True)
class OtlpSettings:
    endpoint: str | None      # None: no OTLP export
    protocol: str             # "grpc" | "http/protobuf"
    interval_s: float         # export interval, seconds
    timeout_s: float          # one export's timeout, seconds


def otlp_settings(env: Mapping[str, str], default_interval_s: float) -> OtlpSettings:
    """Read the standard OTLP variables; raise ConfigError (one line) on a malformed value.

    The endpoint must be an http(s) URL with a host; the interval and timeout (ms) finite
    and positive, within INTERVAL_MS / TIMEOUT_MS (`inf` or `nan` would never export)."""
    endpoint = (env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or "").strip() or None
    endpoint_var = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
    if endpoint is None:
        endpoint, endpoint_var = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip() or None, "OTEL_EXPORTER_OTLP_ENDPOINT"
    protocol = env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol.strip() not in PROTOCOLS:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if endpoint:
        http_url(endpoint, endpoint_var)
    interval_s = _ms_setting(env, "OTEL_METRIC_EXPORT_INTERVAL", default_interval_s * 1000, INTERVAL_MS) / 1000
    timeout_s = _ms_setting(env, "OTEL_EXPORTER_OTLP_TIMEOUT", min(10_000.0, interval_s * 1000 * 5), TIMEOUT_MS) / 1000
    return OtlpSettings(endpoint, protocol.strip(), interval_s, timeout_s)


def bounded_number(raw: str, what: str, lo: float, hi: float, kind=float):
    """`raw` as a finite `kind` within [lo, hi]; ConfigError naming `what` otherwise."""
    return number(raw, what, lo, hi, kind)


def _ms_setting(env: Mapping[str, str], name: str, default: float, bounds: tuple[float, float]) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return float(default)
    return number(raw, name, *bounds)


def resource_attributes_without_sdk(attrs: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str] | None:
    """The attributes `export_sdk.merged_resource(attrs)` gives, without importing the SDK: the
    SDK's telemetry.sdk.* ones, then `attrs`, then `OTEL_RESOURCE_ATTRIBUTES` (comma-separated
    key=value, values percent-decoded; malformed items and empty keys left out) and
    `OTEL_SERVICE_NAME` on top. None when `OTEL_EXPERIMENTAL_RESOURCE_DETECTORS` names detectors
    (then only the SDK knows what they add)."""
    if (env.get("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS") or "otel").strip() != "otel":
        return None
    from opentelemetry.sdk.version import __version__   # a one-line module: not the SDK

    out = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
           "telemetry.sdk.version": __version__, **attrs}
    for item in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        key, eq, value = item.partition("=")
        if eq and key.strip():
            out[key.strip()] = unquote(value.strip())
    if env.get("OTEL_SERVICE_NAME"):
        out["service.name"] = env["OTEL_SERVICE_NAME"]
    return out


_SDK_NAMES = frozenset({"CountingExporter", "otlp_exporter", "import_exporter", "histogram_views",
                        "periodic_reader", "merged_resource", "meter_provider"})


def __getattr__(name: str):
    """The SDK-side names, from export_sdk.py on first use (PEP 562)."""
    if name in _SDK_NAMES:
        from . import export_sdk
        return getattr(export_sdk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
