"""The agent core: sampler threads, health as data, windowed companions, export isolation."""
from __future__ import annotations

import http.server
import threading
import time
import tracemalloc

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.agent import Exported, Instruments, Sampler
from otel_gpu.export import OtlpSettings, otlp_exporter, periodic_reader
from otel_gpu.node import NodeConfig, build_node
from otel_gpu.store import Store

from .sources import ScriptedSource


def collect(reader) -> dict[str, list]:
    """{metric name: [(value, attributes)]} from one collection."""
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend((p.value, dict(p.attributes)) for p in m.data.data_points)
    return out


def agent_with(sources, window_s=10.0, interval_s=1.0, export_failures=lambda: 0):
    clock = [0.0]
    sampler = Sampler(sources, Store(window_s), interval_s, clock=lambda: clock[0])
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    Instruments(provider.get_meter("t"), Exported(sampler, export_failures), {"host.name": "node-1"})
    return sampler, reader, clock


def test_mean_min_max_over_the_window_show_a_stall():
    src = ScriptedSource(values=[0.95, 0.95, 0.05, 0.95])
    sampler, reader, clock = agent_with([src])
    for t in range(4):
        clock[0] = float(t)
        sampler.read_once(src)
    got = collect(reader)
    (mean, attrs), = got["hw.gpu.utilization"]
    assert abs(mean - 0.725) < 1e-9
    assert attrs["host.name"] == "node-1" and attrs["hw.id"] == "GPU-test"
    assert got["otelgpu.hw.gpu.utilization.min"][0][0] == 0.05
    assert got["otelgpu.hw.gpu.utilization.max"][0][0] == 0.95
    assert got["hw.energy"][0][0] == 400.0


def test_failing_source_is_data_and_others_keep_reporting():
    bad = ScriptedSource(name="bad", fail_on={2, 3})
    good = ScriptedSource(name="good")
    sampler, reader, clock = agent_with([bad, good])
    for t in range(3):
        clock[0] = float(t)
        sampler.read_once(bad)
        sampler.read_once(good)
    got = collect(reader)
    up = {a["otelgpu.source"]: v for v, a in got["otelgpu.agent.source.up"]}
    errors = {a["otelgpu.source"]: v for v, a in got["otelgpu.agent.source.errors"]}
    assert up == {"bad": 0.0, "good": 1.0}
    assert errors == {"bad": 2, "good": 0}
    assert "scripted failure on read 3" in sampler.health["bad"].last_error
    # the failed source's series are gone, the good one's remain
    assert len(got["hw.energy"]) == 1


def test_a_hung_source_does_not_stop_the_others():
    gate = threading.Event()
    hung = ScriptedSource(name="hung", hang=gate)
    fine = ScriptedSource(name="fine")
    sampler = Sampler([hung, fine], Store(1.0), interval_s=0.05)
    sampler.start()
    try:
        time.sleep(1.0)
        assert fine.reads >= 10
        assert hung.reads == 1
    finally:
        gate.set()
        sampler.stop()


def test_lanes_share_a_thread_and_a_hung_lane_stops_only_itself():
    gate = threading.Event()
    hung, a, b = ScriptedSource(name="hung", hang=gate), ScriptedSource(name="a"), ScriptedSource(name="b")
    sampler = Sampler([hung, a, b], Store(1.0), interval_s=0.05, lanes=[[hung], [a, b]])
    sampler.start()
    try:
        time.sleep(1.0)
        assert a.reads >= 10 and abs(a.reads - b.reads) <= 1   # one thread reads both, in turn
        assert hung.reads == 1
        assert sorted(t.name for t in sampler._threads if t.is_alive()) == ["otelgpu-a+b", "otelgpu-hung"]
    finally:
        gate.set()
        sampler.stop()
    with pytest.raises(ValueError, match="exactly once"):
        Sampler([hung, a, b], Store(1.0), interval_s=0.05, lanes=[[hung], [a]])


def test_the_node_gives_nvml_and_checkpoint_filesystems_lanes_of_their_own(tmp_path):
    node = build_node(NodeConfig(fake_gpus=2, checkpoint_dirs=(str(tmp_path),)))
    try:
        lanes = [[s.name for s in lane] for lane in node.lanes]
        assert lanes[:2] == [["nvml"], ["disk"]]
        assert lanes[2][:2] == ["host", "net"] and "process" in lanes[2] and "disk" not in lanes[2]
    finally:
        node.close()
    plain = build_node(NodeConfig(gpus=False))
    assert len(plain.lanes) == 1 and {s.name for s in plain.lanes[0]} >= {"host", "net", "disk", "process"}


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    delay_s = 3.0

    def do_POST(self):
        time.sleep(self.delay_s)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_backend():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _run_exporting(endpoint: str, seconds: float):
    settings = OtlpSettings(endpoint, "http/protobuf", interval_s=0.2, timeout_s=0.5)
    exporter = otlp_exporter(settings)
    src = ScriptedSource(values=[0.5])
    sampler = Sampler([src], Store(1.0), interval_s=0.1)
    provider = MeterProvider(metric_readers=[periodic_reader(exporter, settings)])
    Instruments(provider.get_meter("t"), Exported(sampler, lambda: exporter.failures), {})
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    provider.shutdown(timeout_millis=1000)
    return exporter, src


def test_slow_backend_never_blocks_sampling(slow_backend):
    exporter, src = _run_exporting(slow_backend, 2.0)
    assert src.reads >= 15, "sampling at 10 Hz must go on while exports hang"
    assert exporter.failures >= 1, "timed-out exports are counted"


def test_backend_down_counts_dropped_exports_with_bounded_memory():
    tracemalloc.start()
    _run_exporting("http://127.0.0.1:9", 1.0)            # warm-up: imports, first allocations
    base, _ = tracemalloc.get_traced_memory()
    exporter, src = _run_exporting("http://127.0.0.1:9", 4.0)
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert exporter.failures >= 5
    assert src.reads >= 30
    assert grown - base < 2_000_000, f"memory grew by {grown - base} bytes while the backend was down"
