"""Pure decoders: an OTLP/HTTP metrics body and a Pyroscope push body -> plain rows for the store.

OTLP bodies are `ExportMetricsServiceRequest` protobufs (opentelemetry-proto's classes); push bodies
are `push.v1.PushRequest` protobufs holding pprof profiles (otel_gpu.record.protos). Every metric,
every data point and every attribute is kept: nothing here knows a metric name.
"""
from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError as _ProtoDecodeError

from . import protos


class DecodeError(ValueError):
    """A body that is not what its endpoint expects: one line for the sender."""


@dataclass(frozen=True)
class Point:
    """One data point. `value`: the gauge/sum value, or a histogram's sum; `count` and `buckets`
    only for histograms (bucket counts, `bounds` on the series); `t` unix seconds."""
    metric: str
    kind: str               # gauge | counter | updowncounter | histogram | exponential_histogram | summary
    unit: str
    temporality: str        # cumulative | delta | "" (gauges)
    resource: tuple         # sorted (key, value) pairs of the resource attributes
    attrs: tuple            # sorted (key, value) pairs of the point attributes
    t: float
    value: float
    count: float | None = None
    buckets: tuple | None = None
    bounds: tuple | None = None


@dataclass
class ProfileRows:
    """One pprof profile: series labels, time span (unix s), value type, samples (stack root first,
    sample labels as sorted pairs, value in the profile's unit)."""
    labels: dict[str, str]
    t0: float
    t1: float
    sample_type: str
    unit: str
    period: int
    samples: list[tuple[tuple[str, ...], tuple, int]] = field(default_factory=list)


def decompress(body: bytes, encoding: str | None) -> bytes:
    """Undo a `content-encoding` (gzip, deflate) or a gzip body sent without one."""
    enc = (encoding or "").strip().lower()
    try:
        if enc == "gzip" or (not enc and body[:2] == b"\x1f\x8b"):
            return gzip.decompress(body)
        if enc == "deflate":
            return zlib.decompress(body)
    except (OSError, EOFError, zlib.error) as exc:
        raise DecodeError(f"bad {enc or 'gzip'} body: {exc}") from None
    if enc not in ("", "identity", "gzip", "deflate"):
        raise DecodeError(f"unsupported content-encoding {encoding!r}")
    return body


def _value(v):
    """An OTLP AnyValue as a string (lists and maps as their text form)."""
    which = v.WhichOneof("value")
    if which is None:
        return ""
    x = getattr(v, which)
    if which == "bool_value":
        return "true" if x else "false"
    if which in ("string_value", "int_value", "double_value"):
        return str(x)
    if which == "bytes_value":
        return x.hex()
    if which == "array_value":
        return "[" + ",".join(_value(e) for e in x.values) + "]"
    return "{" + ",".join(f"{kv.key}={_value(kv.value)}" for kv in x.values) + "}"


def _attrs(kvs) -> tuple:
    out = []
    for kv in kvs:
        v = kv.value
        out.append((kv.key, v.string_value if v.WhichOneof("value") == "string_value" else _value(v)))
    out.sort()
    return tuple(out)


_TEMPORALITY = {1: "delta", 2: "cumulative"}


def otlp_points(body: bytes) -> list[Point]:
    """Every data point of an `ExportMetricsServiceRequest` body (already decompressed)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    try:
        req = ExportMetricsServiceRequest.FromString(body)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not an OTLP metrics request: {exc}") from None
    out: list[Point] = []
    for rm in req.resource_metrics:
        res = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out += _metric_points(m, res)
    return out


def _metric_points(m, res: tuple) -> list[Point]:
    which = m.WhichOneof("data")
    out = []
    if which in ("gauge", "sum"):
        data = getattr(m, which)
        if which == "gauge":
            kind, temp = "gauge", ""
        else:
            kind = "counter" if data.is_monotonic else "updowncounter"
            temp = _TEMPORALITY.get(data.aggregation_temporality, "")
        for dp in data.data_points:
            v = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
            out.append(Point(m.name, kind, m.unit, temp, res, _attrs(dp.attributes), dp.time_unix_nano / 1e9, v))
    elif which == "histogram":
        temp = _TEMPORALITY.get(m.histogram.aggregation_temporality, "")
        for dp in m.histogram.data_points:
            out.append(Point(m.name, "histogram", m.unit, temp, res, _attrs(dp.attributes), dp.time_unix_nano / 1e9,
                             dp.sum, float(dp.count), tuple(dp.bucket_counts), tuple(dp.explicit_bounds)))
    elif which in ("exponential_histogram", "summary"):
        data = getattr(m, which)
        temp = _TEMPORALITY.get(getattr(data, "aggregation_temporality", 0), "")
        for dp in data.data_points:
            out.append(Point(m.name, which, m.unit, temp, res, _attrs(dp.attributes), dp.time_unix_nano / 1e9,
                             dp.sum, float(dp.count)))
    return out


def push_profiles(body: bytes) -> list[ProfileRows]:
    """Every profile of a Pyroscope `PushRequest` body (already decompressed)."""
    try:
        req = protos.PushRequest.FromString(body)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not a Pyroscope push request: {exc}") from None
    out = []
    for series in req.series:
        labels = {lp.name: lp.value for lp in series.labels}
        for raw in series.samples:
            out.append(pprof_rows(decompress(raw.raw_profile, None), labels))
    return out


def pprof_rows(raw: bytes, labels: dict[str, str]) -> ProfileRows:
    """One pprof profile -> rows: stacks as function names, root first; the first sample value."""
    try:
        p = protos.Profile.FromString(raw)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not a pprof profile: {exc}") from None
    st = p.string_table

    def s(i: int) -> str:
        return st[i] if 0 <= i < len(st) else ""

    fn_names = {f.id: s(f.name) for f in p.function}
    loc_frames = {loc.id: [fn_names.get(line.function_id, "?") for line in loc.line] for loc in p.location}
    vt = p.sample_type[0] if p.sample_type else None
    t0 = p.time_nanos / 1e9
    rows = ProfileRows(dict(labels), t0, t0 + p.duration_nanos / 1e9, s(vt.type) if vt else "",
                       s(vt.unit) if vt else "", p.period)
    for smp in p.sample:
        leaf_first = [f for loc in smp.location_id for f in loc_frames.get(loc, ["?"])]
        lab = tuple(sorted((s(lb.key), s(lb.str) if lb.str else str(lb.num)) for lb in smp.label))
        rows.samples.append((tuple(reversed(leaf_first)), lab, smp.value[0] if smp.value else 0))
    return rows
