"""The loopback receivers and the store, for real: the SDK's OTLP exporter and pyroscope-io's push
body over HTTP into SQLite, read back; bad bodies; forwarding to an upstream; a killed writer."""
from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from otel_gpu.record import decode
from otel_gpu.record.reader import Recording, RecordingError
from otel_gpu.record.receiver import PUSH_PATH, Receiver
from otel_gpu.record.store import Writer

from .otlp_bodies import body
from .test_decode import PUSH

REPO = Path(__file__).resolve().parents[2]


def _export_through_sdk(url: str, rounds: int = 3) -> None:
    exporter = OTLPMetricExporter(endpoint=url + "/v1/metrics")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
    provider = MeterProvider(resource=Resource.create({"host.name": "n1", "otelgpu.job": "j"}), metric_readers=[reader])
    meter = provider.get_meter("t")
    steps = meter.create_counter("otelgpu.train.steps")
    hist = meter.create_histogram("otelgpu.train.step.duration", unit="s")
    meter.create_observable_gauge("hw.gpu.utilization", [lambda o: [Observation(0.5, {"hw.id": "GPU-1"})]], unit="1")
    for _ in range(rounds):
        for rank in ("0", "1"):
            steps.add(1, {"otelgpu.rank": rank})
            hist.record(0.1, {"otelgpu.rank": rank})
        assert reader.force_flush()
        time.sleep(0.01)
    provider.shutdown()


def test_sdk_exports_are_stored_per_series_with_every_attribute(tmp_path):
    rx = Receiver(Writer(tmp_path)).start()
    try:
        _export_through_sdk(rx.url)
    finally:
        rx.stop()
        rx.writer.close()
    assert rx.counts.metric_requests >= 3 and rx.counts.rejected == 0
    with Recording.open([tmp_path]) as rec:
        assert {"otelgpu.train.steps", "otelgpu.train.step.duration", "hw.gpu.utilization"} <= set(rec.metrics())
        steps = rec.series("otelgpu.train.steps")
        assert sorted(s.get("otelgpu.rank") for s in steps) == ["0", "1"]
        assert all(s.get("otelgpu.job") == "j" and s.get("host.name") == "n1" for s in steps)
        assert all(s.points[-1][1] == 3 for s in steps)
        hist = rec.series("otelgpu.train.step.duration")
        assert all(s.counts[-1] == 3 and s.points[-1][1] == pytest.approx(0.3) for s in hist)
        assert rec.job == "j" or rec.job is None


def test_pyroscope_push_is_stored_with_labels_and_stacks(tmp_path):
    rx = Receiver(Writer(tmp_path, {"job": "scout"})).start()
    raw = PUSH.read_bytes()
    try:
        r = httpx.post(rx.url + PUSH_PATH, content=raw,
                       headers={"content-type": "application/proto", "content-encoding": "gzip"})
        assert r.status_code == 200
        bad = httpx.post(rx.url + PUSH_PATH, content=b"\x1f\x8bnot gzip", headers={"content-encoding": "gzip"})
        assert bad.status_code == 400 and "gzip" in bad.text
        assert httpx.post(rx.url + "/elsewhere", content=b"").status_code == 404
    finally:
        rx.stop()
        rx.writer.close()
    want = decode.push_profiles(gzip.decompress(raw))[0]
    with Recording.open([tmp_path]) as rec:
        rows = list(rec.profile_stacks())
        assert rec.profile_count() == 1
        assert sum(v for _, v, _, _ in rows) == sum(v for _, _, v in want.samples)
        assert {labels["rank"] for _, _, labels, _ in rows} == {"0"}
        assert any(labels.get("phase") == "tagged" for _, _, labels, _ in rows) == \
            any(dict(lb).get("phase") == "tagged" for _, lb, _ in want.samples)
    assert rx.counts.rejected == 1


def test_forwarding_sends_the_same_body_upstream_and_reports_an_upstream_failure(tmp_path):
    upstream = Receiver(Writer(tmp_path / "up")).start()
    rx = Receiver(Writer(tmp_path / "rec"), forward_metrics=upstream.url + "/v1/metrics",
                  forward_profiles=upstream.url).start()
    try:
        _export_through_sdk(rx.url, rounds=2)
        assert httpx.post(rx.url + PUSH_PATH, content=PUSH.read_bytes(), headers={"content-encoding": "gzip"}).status_code == 200
        upstream.stop()
        upstream.writer.close()
        down = httpx.post(rx.url + PUSH_PATH, content=PUSH.read_bytes(), headers={"content-encoding": "gzip"})
        assert down.status_code == 502        # recorded, but the sender learns that upstream failed
    finally:
        rx.stop()
        rx.writer.close()
    with Recording.open([tmp_path / "rec"]) as mine, Recording.open([tmp_path / "up"]) as theirs:
        assert mine.metrics() == theirs.metrics()
        assert [s.points for s in mine.series("otelgpu.train.steps")] == [s.points for s in theirs.series("otelgpu.train.steps")]
        assert (mine.profile_count(), theirs.profile_count()) == (2, 1)
    assert rx.counts.forward_failures == 1


WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from otel_gpu.record.store import Writer
from otel_gpu.record import decode
body = bytes.fromhex(sys.argv[3])
w = Writer(Path(sys.argv[1]), {"job": "crash"})
for i in range(1000000):
    w.add_points(decode.otlp_points(body))
    if i == 20:
        print("ready", flush=True)
"""


def test_a_killed_writer_leaves_a_readable_recording(tmp_path):
    b = body(lambda m: m.create_counter("c").add(1, {"k": "v"}))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(REPO), b.hex()], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with Recording.open([tmp_path]) as rec:
        assert rec.job == "crash"
        assert len(rec.series("c")[0].points) >= 1      # one point per distinct time, every committed one readable


def test_a_directory_without_a_recording_is_one_clear_error(tmp_path):
    with pytest.raises(RecordingError, match="not a recording"):
        Recording.open([tmp_path])
    (tmp_path / "recording.sqlite").write_text("not sqlite at all, just text " * 100)
    with pytest.raises(RecordingError, match="unreadable|not an otel-gpu recording"):
        Recording.open([tmp_path])


def test_meta_is_plain_key_value(tmp_path):
    w = Writer(tmp_path, {"job": "j", "command": json.dumps(["python", "t.py"])})
    w.close()
    with Recording.open([tmp_path]) as rec:
        assert rec.metas[0]["format"] == "otel-gpu-recording" and json.loads(rec.metas[0]["command"]) == ["python", "t.py"]
