"""The run's receiver against what any local process can send: bodies that inflate, amplify or never
end, requests without the run's key, resets. Its memory (VmHWM of `otel-gpu run`) stays within a
bound, and the run goes on; each bound is named in one line."""
from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings, strategies as st
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_gpu.inflate import Inflater, TooLarge, inflate
from otel_gpu.profiling import RECORD_KEY_HEADER
from otel_gpu.record import decode, protos, receiver, wire
from otel_gpu.record.reader import Recording
from otel_gpu.record.receiver import METRICS_PATH, PUSH_PATH, Receiver
from otel_gpu.record.session import with_header
from otel_gpu.record.store import SERIES_BOUND, STACK_BOUND, STACK_PLACEHOLDER, RunLimits, Writer
from tests.childenv import clean_env

from .otlp_bodies import body
from .receiver_attack import deep_profile, push

REPO = Path(__file__).resolve().parents[2]
PEAK_BOUND_KB = 192 << 10   # `otel-gpu run`'s peak resident memory under the attacks (its own ~45 MB included)


def test_run_memory_stays_bounded_under_attack_bodies_and_the_run_goes_on(tmp_path):
    env = {**clean_env(), "OTELGPU_TRAINING": "0"}
    proc = subprocess.run([sys.executable, "-m", "otel_gpu", "run", "--record", str(tmp_path / "rec"), "--no-agent",
                           "--no-report", "--no-profile", "--", sys.executable, str(Path(__file__).with_name("receiver_attack.py"))],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert got["forged_steps_without_key"] == "401"
    for name in ("gzip_bomb", "deflate_bomb", "profile_bomb", "million_points"):
        assert got[name] == "413", name
    assert got["oversized_body"] in ("413", "-1")   # refused before its body is read: the sender may see a reset
    assert got["deep_stack"] == got["series_flood"] == "200"
    assert got["simultaneous_64_not_200"] == "0"
    assert int(got["peak"]) < PEAK_BOUND_KB, f"otel-gpu run peaked at {int(got['peak']) >> 10} MiB"
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("otel-gpu run: ")]
    assert len(lines) == len(set(lines))    # each bound said once
    assert any("without the run's key" in x for x in lines)
    assert any("inflate to more than 16 MiB" in x or "inflates to more than 16 MiB" in x for x in lines)
    assert any("more than 250,000 messages" in x for x in lines)
    assert any("reset" in x for x in lines)
    with Recording.open([tmp_path / "rec"]) as rec:
        assert "otelgpu.train.steps" not in rec.metrics()      # the forged push was not recorded
        stacks = [frames for frames, _, _, _ in rec.profile_stacks()]
    assert len(stacks) == 1 and len(stacks[0]) == decode.LIMITS.max_depth
    assert stacks[0][-1] == f"[{100_000 - decode.LIMITS.max_depth + 1} deeper frames not recorded]"


def _rx(tmp_path, **kw) -> Receiver:
    return Receiver(Writer(tmp_path), key="s3cret", say=lambda line: None, **kw).start()


def _gauge_body(n: int = 1) -> bytes:
    return body(lambda m: m.create_observable_gauge("g", [lambda o: [Observation(float(i), {"i": i}) for i in range(n)]]))


def test_a_request_without_the_key_is_refused_unread_and_not_recorded(tmp_path):
    rx = _rx(tmp_path)
    try:
        assert httpx.post(rx.url + METRICS_PATH, content=_gauge_body()).status_code == 401
        assert httpx.post(rx.url + METRICS_PATH, content=_gauge_body(), headers={RECORD_KEY_HEADER: "guess"}).status_code == 401
        ok = httpx.post(rx.url + METRICS_PATH, content=_gauge_body(), headers={RECORD_KEY_HEADER: "s3cret"})
        assert ok.status_code == 200
    finally:
        rx.stop()
        rx.writer.close()
    assert (rx.counts.unauthorized, rx.counts.metric_requests) == (2, 1)


def test_the_key_reaches_every_exporter_and_never_a_file_or_the_output(tmp_path):
    """A real recorded run: the rank's OTLP export and profile pushes are recorded (so they carried the
    key), and the key is nowhere in the recording's folder or in what `run` printed."""
    job = tmp_path / "job.py"
    job.write_text("import os, time\n"
                   "open(os.environ['KEYFILE'], 'w').write(os.environ['OTELGPU_RECORD_KEY'])\n"
                   "from otel_gpu import training as otg\n"
                   "for _ in range(3):\n"
                   "    with otg.step():\n"
                   "        time.sleep(0.5)\n")
    keyfile = tmp_path / "key.txt"
    env = {**clean_env(), "KEYFILE": str(keyfile), "OTELGPU_PROFILE_UPLOAD_S": "1"}
    proc = subprocess.run([sys.executable, "-m", "otel_gpu", "run", "--record", str(tmp_path / "rec"), "--no-agent",
                           "--no-report", "--", sys.executable, str(job)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    key = keyfile.read_text()
    assert len(key) >= 40
    assert "without the run's key" not in proc.stderr
    with Recording.open([tmp_path / "rec"]) as rec:
        assert "otelgpu.train.steps" in rec.metrics() and rec.profile_count() >= 1
    for f in (tmp_path / "rec").rglob("*"):
        if f.is_file():
            assert key.encode() not in f.read_bytes(), f
    assert key not in proc.stdout + proc.stderr


@settings(max_examples=50, deadline=None)
@given(headers=st.lists(st.tuples(st.text("abcxyz-", min_size=1, max_size=8), st.text("abc123", max_size=8)), max_size=4))
def test_with_header_adds_the_key_once_and_keeps_the_users_headers(headers):
    text = ",".join(f"{k}={v}" for k, v in headers)
    out = with_header(text, f"{RECORD_KEY_HEADER}=k")
    pairs = [h.split("=", 1) for h in out.split(",")]
    assert pairs[-1] == [RECORD_KEY_HEADER, "k"] and [p[0] for p in pairs].count(RECORD_KEY_HEADER) == 1
    assert [tuple(p) for p in pairs[:-1]] == [(k, v) for k, v in headers if k != RECORD_KEY_HEADER]


def test_a_slow_request_head_is_closed_and_counted_without_a_traceback(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(receiver, "REQUEST_S", 0.5)
    rx = _rx(tmp_path)
    try:
        s = socket.create_connection(("127.0.0.1", rx.server.server_port), timeout=5)
        s.sendall(b"POST /v1/metrics HTTP/1.1\r\n")   # and never the rest of the head
        t0 = time.monotonic()
        assert s.recv(100) == b""                      # closed by the receiver
        assert time.monotonic() - t0 < 3
        s.close()
        ok = httpx.post(rx.url + METRICS_PATH, content=_gauge_body(), headers={RECORD_KEY_HEADER: "s3cret"})
        assert ok.status_code == 200
    finally:
        rx.stop()
        rx.writer.close()
    assert "Traceback" not in capfd.readouterr().err


def test_decode_bounds_name_what_was_hit():
    limits = decode.Limits(points=5, frames=50, max_depth=10, max_text=8)
    with pytest.raises(decode.OverLimit, match="more than 5 data points"):
        decode.otlp_points(_gauge_body(6), limits)
    assert len(decode.otlp_points(_gauge_body(5), limits)) == 5
    with pytest.raises(decode.OverLimit, match="more than 50 profile frames"):
        decode.push_profiles(push(deep_profile(51)), limits)
    rows = decode.push_profiles(push(deep_profile(30)), limits)[0]
    stack = rows.samples[0][0]
    assert len(stack) == 10 and stack[-1] == "[21 deeper frames not recorded]" and stack[0] == "recurse"
    long = body(lambda m: m.create_counter("c" * 20).add(1, {"k": "v" * 20}))
    p = decode.otlp_points(long, limits)[0]
    assert p.metric == "c" * 8 + decode.CUT and dict(p.attrs)["k"] == "v" * 8 + decode.CUT
    with pytest.raises(decode.OverLimit, match="inflates to more than 1 KiB"):
        decode.decompress(gzip.compress(b"\0" * 2000), "gzip", 1024)
    with pytest.raises(decode.OverLimit, match="messages nested more than"):
        decode.otlp_points(_nested_any_value(100))


def _nested_any_value(depth: int) -> bytes:
    """A gauge point whose attribute value is an array nested `depth` deep."""
    from tests.record.receiver_attack import ld
    v = ld(1, b"x")
    for _ in range(depth):
        v = ld(5, ld(1, v))                      # AnyValue.array_value(ArrayValue.values(...))
    dp = ld(1, ld(7, ld(1, b"k") + ld(2, v)))
    return ld(1, ld(2, ld(2, ld(1, b"m") + ld(5, dp))))


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=4000), limit=st.integers(0, 5000), encoding=st.sampled_from(["gzip", "deflate"]),
       members=st.integers(1, 3))
def test_inflate_gives_the_data_or_says_it_is_over_the_bound(data, limit, encoding, members):
    pack = gzip.compress if encoding == "gzip" else zlib.compress
    packed = b"".join(pack(data) for _ in range(members if encoding == "gzip" else 1))
    want = data * (members if encoding == "gzip" else 1)
    if len(want) <= limit:
        assert inflate(packed, encoding, limit) == want
        d = Inflater(encoding, limit)
        assert b"".join(d.feed(packed[i:i + 7]) for i in range(0, len(packed), 7)) + d.finish() == want
    else:
        with pytest.raises(TooLarge):
            inflate(packed, encoding, limit)


def _messages(msg) -> int:
    """Messages below `msg` (and repeated strings), counted on the decoded object."""
    n = 0
    for f, value in msg.ListFields():
        items = value if f.is_repeated else [value]
        if f.message_type is not None:
            for item in items:
                n += 1 + _messages(item)
        elif f.is_repeated and f.type in (f.TYPE_STRING, f.TYPE_BYTES):
            n += len(items)
    return n


@settings(max_examples=40, deadline=None)
@given(attrs=st.lists(st.dictionaries(st.text(min_size=1, max_size=5), st.one_of(st.text(max_size=5), st.integers(), st.booleans()),
                                      max_size=3), min_size=1, max_size=5))
def test_the_wire_count_is_the_decoded_message_count(attrs):
    b = body(lambda m: (m.create_observable_gauge("g", [lambda o: [Observation(1.0, a) for a in attrs]]),
                        m.create_histogram("h").record(0.5, attrs[0])))
    schema = wire.schema_of(ExportMetricsServiceRequest.DESCRIPTOR)
    want = _messages(ExportMetricsServiceRequest.FromString(b))
    assert wire.count_messages(b, schema, 10**6) == want
    with pytest.raises(wire.TooMany):
        wire.count_messages(b, schema, want - 1)
    profile = deep_profile(20)
    assert wire.count_messages(profile, wire.schema_of(protos.Profile.DESCRIPTOR), 10**6) == \
        _messages(protos.Profile.FromString(profile))


def test_the_run_bounds_on_series_and_stack_text_drop_and_count(tmp_path):
    w = Writer(tmp_path, limits=RunLimits(series=3, stack_text=200))
    try:
        w.add_points(decode.otlp_points(_gauge_body(5)))
        assert w.over[SERIES_BOUND] == 2
        rows = decode.push_profiles(push(deep_profile(5)))[0]
        w.add_profiles([rows])
        w.add_profiles(decode.push_profiles(push(deep_profile(40))))   # its stack text is over 200 characters
        assert w.over[STACK_BOUND] == 1
    finally:
        w.close()
    with Recording.open([tmp_path]) as rec:
        assert len(rec.series("g")) == 3
        stacks = {tuple(frames) for frames, _, _, _ in rec.profile_stacks()}
    assert STACK_PLACEHOLDER in stacks and ("recurse",) * 5 in stacks


def test_a_recording_folder_is_never_recorded_into_twice(tmp_path):
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "recording.sqlite").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "otel_gpu", "run", "--record", str(tmp_path / "rec"), "--no-agent",
                           "--", "true"], env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "already holds a recording" in proc.stderr
    assert (tmp_path / "rec" / "recording.sqlite").read_bytes() == b""
