"""Pure decoders: an OTLP/HTTP metrics body and a Pyroscope push body -> plain rows for the store.

OTLP bodies are `ExportMetricsServiceRequest` protobufs (opentelemetry-proto's classes); push bodies
are `push.v1.PushRequest` protobufs holding pprof profiles (otel_gpu.record.protos). Every metric,
every data point and every attribute is kept: nothing here knows a metric name.

What a body may cost is bounded (`Limits`, per request): what it inflates to (a gzip body and every
compressed profile in a push together), the messages it holds (counted on the wire before
decoding), its data points, histogram bucket values and profile frames. Past a bound the request is
refused with `OverLimit` naming it. Text longer than `max_text` characters (names, attribute and
label values) is cut and marked, and a stack deeper than `max_depth` frames keeps its root-most
frames and one frame saying how many were left out: both kept, neither costs without bound.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError as _ProtoDecodeError

from ..inflate import GZIP, TooLarge, inflate, mib as _mib
from . import protos, wire


class DecodeError(ValueError):
    """A body that is not what its endpoint expects: one line for the sender."""


class OverLimit(DecodeError):
    """A body past one of the bounds of `Limits`; `bound` names it (one line, no data in it)."""

    def __init__(self, bound: str):
        super().__init__(f"request refused: {bound}")
        self.bound = bound


@dataclass(frozen=True)
class Limits:
    """What one request may cost (sizes in bytes, text in characters)."""
    inflated: int = 16 << 20        # a body and the profiles in it, decompressed, together
    messages: int = 250_000         # protobuf messages (and repeated strings) in one request
    points: int = 50_000            # OTLP data points in one request
    bucket_values: int = 500_000    # histogram bucket counts and bounds in one request
    frames: int = 1_000_000         # profile frames (stack depth summed over samples) in one request
    max_depth: int = 4096           # frames of one stack kept (deeper: root-most kept, the rest counted)
    max_text: int = 4096            # characters of one name or attribute/label value kept


LIMITS = Limits()
CUT = "…[cut]"


class _Budget:
    """What is left of a request's `Limits` while it is decoded."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.inflated = limits.inflated
        self.messages = limits.messages

    def inflate(self, body: bytes, encoding: str | None, what: str) -> bytes:
        try:
            out = decompress(body, encoding, self.inflated, what)
        except OverLimit:
            raise OverLimit(f"{what} inflate to more than {_mib(self.limits.inflated)}, the body included") from None
        if out is not body:
            self.inflated -= len(out)
        return out

    def count(self, body: bytes, schema: dict, what: str) -> None:
        try:
            self.messages -= wire.count_messages(body, schema, self.messages)
        except wire.TooMany:
            raise OverLimit(f"{what} holds more than {self.limits.messages:,} messages") from None
        except wire.TooDeep as exc:
            raise OverLimit(f"{what}: {exc}") from None


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and a mark when it is longer."""
    return text if len(text) <= limit else text[:limit] + CUT


@dataclass(frozen=True, slots=True)
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


def decompress(body: bytes, encoding: str | None, limit: int = LIMITS.inflated, what: str = "the body") -> bytes:
    """Undo a `content-encoding` (gzip, deflate) or a gzip body sent without one, producing at
    most `limit` bytes (OverLimit past it)."""
    enc = (encoding or "").strip().lower()
    try:
        if enc in (GZIP, "deflate") or (not enc and body[:2] == b"\x1f\x8b"):
            return inflate(body, enc or GZIP, limit, what)
    except TooLarge as exc:
        raise OverLimit(str(exc)) from None
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


def _attrs(kvs, limit: int) -> tuple:
    out = []
    for kv in kvs:
        v = kv.value
        text = v.string_value if v.WhichOneof("value") == "string_value" else _value(v)
        key = kv.key
        if len(text) > limit or len(key) > limit:
            key, text = cut(key, limit), cut(text, limit)
        out.append((key, text))
    out.sort()
    return tuple(out)


_TEMPORALITY = {1: "delta", 2: "cumulative"}


_SCHEMAS: dict[str, dict] = {}


def _schema(message) -> dict:
    got = _SCHEMAS.get(message.DESCRIPTOR.full_name)
    if got is None:
        got = _SCHEMAS[message.DESCRIPTOR.full_name] = wire.schema_of(message.DESCRIPTOR)
    return got


def otlp_points(body: bytes, limits: Limits = LIMITS) -> list[Point]:
    """Every data point of an `ExportMetricsServiceRequest` body (already decompressed);
    OverLimit past `limits`."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    _Budget(limits).count(body, _schema(ExportMetricsServiceRequest), "the OTLP request")
    try:
        req = ExportMetricsServiceRequest.FromString(body)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not an OTLP metrics request: {exc}") from None
    metrics = [m for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    n, values = 0, 0
    for m in metrics:
        which = m.WhichOneof("data")
        if which is not None:
            dps = getattr(m, which).data_points
            n += len(dps)
            if which == "histogram":
                values += sum(len(dp.bucket_counts) + len(dp.explicit_bounds) for dp in dps)
    if n > limits.points:
        raise OverLimit(f"the OTLP request holds more than {limits.points:,} data points")
    if values > limits.bucket_values:
        raise OverLimit(f"the OTLP request holds more than {limits.bucket_values:,} histogram bucket values")
    out: list[Point] = []
    text = limits.max_text
    for rm in req.resource_metrics:
        res = _attrs(rm.resource.attributes, text)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out += _metric_points(m, res, text)
    return out


def _metric_points(m, res: tuple, text: int) -> list[Point]:
    which = m.WhichOneof("data")
    out = []
    name, unit = m.name, m.unit
    if len(name) > text or len(unit) > text:
        name, unit = cut(name, text), cut(unit, text)
    if which in ("gauge", "sum"):
        data = getattr(m, which)
        if which == "gauge":
            kind, temp = "gauge", ""
        else:
            kind = "counter" if data.is_monotonic else "updowncounter"
            temp = _TEMPORALITY.get(data.aggregation_temporality, "")
        for dp in data.data_points:
            v = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
            out.append(Point(name, kind, unit, temp, res, _attrs(dp.attributes, text), dp.time_unix_nano / 1e9, v))
    elif which == "histogram":
        temp = _TEMPORALITY.get(m.histogram.aggregation_temporality, "")
        for dp in m.histogram.data_points:
            out.append(Point(name, "histogram", unit, temp, res, _attrs(dp.attributes, text), dp.time_unix_nano / 1e9,
                             dp.sum, float(dp.count), tuple(dp.bucket_counts), tuple(dp.explicit_bounds)))
    elif which in ("exponential_histogram", "summary"):
        data = getattr(m, which)
        temp = _TEMPORALITY.get(getattr(data, "aggregation_temporality", 0), "")
        for dp in data.data_points:
            out.append(Point(name, which, unit, temp, res, _attrs(dp.attributes, text), dp.time_unix_nano / 1e9,
                             dp.sum, float(dp.count)))
    return out


def push_profiles(body: bytes, limits: Limits = LIMITS) -> list[ProfileRows]:
    """Every profile of a Pyroscope `PushRequest` body (already decompressed); OverLimit past
    `limits` (the inflated size and the messages of its profiles count with the body's)."""
    budget = _Budget(limits)
    budget.inflated -= len(body)
    budget.count(body, _schema(protos.PushRequest), "the push")
    try:
        req = protos.PushRequest.FromString(body)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not a Pyroscope push request: {exc}") from None
    out = []
    frames = [limits.frames]
    text = limits.max_text
    for series in req.series:
        labels = {cut(lp.name, text): cut(lp.value, text) for lp in series.labels}
        for raw in series.samples:
            profile = budget.inflate(raw.raw_profile, None, "the push's profiles")
            budget.count(profile, _schema(protos.Profile), "the push's profiles")
            out.append(pprof_rows(profile, labels, limits, frames))
    return out


def pprof_rows(raw: bytes, labels: dict[str, str], limits: Limits = LIMITS, frames: list | None = None) -> ProfileRows:
    """One pprof profile -> rows: stacks as function names, root first; the first sample value.
    `frames`: a one-item list, the frames the request may still hold (OverLimit past it)."""
    try:
        p = protos.Profile.FromString(raw)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not a pprof profile: {exc}") from None
    st = p.string_table
    text, depth = limits.max_text, limits.max_depth
    left = frames if frames is not None else [limits.frames]

    def s(i: int) -> str:
        return cut(st[i], text) if 0 <= i < len(st) else ""

    fn_names = {f.id: s(f.name) for f in p.function}
    loc_frames = {loc.id: [fn_names.get(line.function_id, "?") for line in loc.line] for loc in p.location}
    vt = p.sample_type[0] if p.sample_type else None
    t0 = p.time_nanos / 1e9
    rows = ProfileRows(dict(labels), t0, t0 + p.duration_nanos / 1e9, s(vt.type) if vt else "",
                       s(vt.unit) if vt else "", p.period)
    unknown = ["?"]
    for smp in p.sample:
        leaf_first = [f for loc in smp.location_id for f in loc_frames.get(loc, unknown)]
        left[0] -= len(leaf_first)
        if left[0] < 0:
            raise OverLimit(f"the push holds more than {limits.frames:,} profile frames")
        stack = tuple(reversed(leaf_first))
        if len(stack) > depth:
            stack = stack[:depth - 1] + (f"[{len(stack) - depth + 1} deeper frames not recorded]",)
        lab = tuple(sorted((s(lb.key), s(lb.str) if lb.str else str(lb.num)) for lb in smp.label))
        rows.samples.append((stack, lab, smp.value[0] if smp.value else 0))
    return rows
