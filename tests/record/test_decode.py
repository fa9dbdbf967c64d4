"""Decoding what arrives: OTLP bodies made by the real SDK, pyroscope-io's real push body."""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from opentelemetry.metrics import Observation

from otel_gpu.record import decode

from .otlp_bodies import body

PUSH = Path(__file__).resolve().parents[1] / "data" / "pyroscope" / "push_request_cpu.bin"


def test_every_instrument_kind_and_attribute_is_kept():
    def record(meter):
        meter.create_counter("c", unit="s").add(2.5, {"otelgpu.rank": "1", "x": "y"})
        meter.create_up_down_counter("u", unit="By").add(-3, {"k": "v"})
        meter.create_histogram("h", unit="s").record(0.2, {"otelgpu.rank": "0"})
        meter.create_observable_gauge("g", [lambda o: [Observation(0.5, {"b": True, "i": 3})]], unit="1")

    pts = {p.metric: p for p in decode.otlp_points(body(record, {"host.name": "n1", "otelgpu.job": "j"}))}
    assert set(pts) == {"c", "u", "h", "g"}
    assert (pts["c"].kind, pts["c"].value, pts["c"].temporality) == ("counter", 2.5, "cumulative")
    assert dict(pts["c"].attrs) == {"otelgpu.rank": "1", "x": "y"}
    assert dict(pts["c"].resource)["otelgpu.job"] == "j"
    assert (pts["u"].kind, pts["u"].value, pts["u"].unit) == ("updowncounter", -3.0, "By")
    assert (pts["h"].kind, pts["h"].value, pts["h"].count, sum(pts["h"].buckets)) == ("histogram", 0.2, 1.0, 1)
    assert len(pts["h"].bounds) + 1 == len(pts["h"].buckets)
    assert dict(pts["g"].attrs) == {"b": "true", "i": "3"}
    assert pts["g"].t > 1.6e9


@settings(max_examples=40, deadline=None)
@given(attrs=st.dictionaries(st.text(min_size=1, max_size=12), st.one_of(st.text(max_size=20), st.integers(-2**63, 2**63 - 1), st.booleans()),
                             max_size=5),
       value=st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
def test_any_attribute_set_round_trips(attrs, value):
    pts = decode.otlp_points(body(lambda m: m.create_observable_gauge("g", [lambda o: [Observation(value, attrs)]])))
    assert len(pts) == 1 and pts[0].value == pytest.approx(value)
    want = {k: ("true" if v is True else "false" if v is False else str(v)) for k, v in attrs.items()}
    assert dict(pts[0].attrs) == want


def test_pyroscope_push_body_decodes_to_its_profiles():
    profiles = decode.push_profiles(decode.decompress(PUSH.read_bytes(), "gzip"))
    assert len(profiles) == 1
    p = profiles[0]
    assert (p.labels["rank"], p.labels["job"], p.sample_type, p.unit) == ("0", "scout", "cpu", "nanoseconds")
    assert p.t1 > p.t0 > 1.6e9
    assert len(p.samples) == 28 and all(v > 0 for _, _, v in p.samples)
    stacks = [s for s, _, _ in p.samples]
    assert all(s[0] == "<module>" for s in stacks)          # root first
    assert any("fib" in s for s in stacks)


@pytest.mark.parametrize("encoding, pack", [("gzip", gzip.compress), ("deflate", zlib.compress), (None, gzip.compress),
                                            ("identity", lambda b: b)])
def test_content_encodings(encoding, pack):
    assert decode.decompress(pack(b"abc"), encoding) == b"abc"


@settings(max_examples=80, deadline=None)
@given(raw=st.binary(max_size=300), encoding=st.sampled_from([None, "gzip", "deflate", "br", ""]))
def test_garbage_is_a_decode_error_never_a_crash(raw, encoding):
    try:
        data = decode.decompress(raw, encoding)
        decode.otlp_points(data)
        decode.push_profiles(data)
    except decode.DecodeError as exc:
        assert str(exc)
