"""The agent core: sampler threads, health as data, windowed companions, export isolation."""
from __future__ import annotations

import http.server
import threading
import time
import tracemalloc

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.agent.sampler import Exported, Instruments, Sampler
from otel_gpu.export import OtlpSettings, otlp_exporter, periodic_reader
from otel_gpu.agent.store import Store

from tests.servers import wait_until
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


def test_one_thread_reads_every_source_in_turn():
    a, b, c = ScriptedSource(name="a"), ScriptedSource(name="b"), ScriptedSource(name="c")
    sampler = Sampler([a, b, c], Store(1.0), interval_s=0.05)
    sampler.start()
    try:
        time.sleep(0.6)
        assert a.reads >= 6 and abs(a.reads - c.reads) <= 1
        assert sorted(t.name for t in sampler._threads if t.is_alive()) == ["otelgpu-sampler", "otelgpu-watchdog"]
    finally:
        sampler.stop()


def test_a_hung_source_gets_a_thread_of_its_own_and_the_others_go_on():
    gate = threading.Event()
    before, hung, after = ScriptedSource(name="before"), ScriptedSource(name="hung", hang=gate), ScriptedSource(name="after")
    sampler = Sampler([before, hung, after], Store(1.0), interval_s=0.05, stuck_after_s=0.3)
    sampler.start()
    try:
        wait_until(lambda: after.reads >= 10, 5, "the source behind the hung one read again")
        assert hung.reads == 1 and before.reads >= 10
        names_ = sorted(t.name for t in sampler._threads if t.is_alive())
        assert names_ == ["otelgpu-hung", "otelgpu-sampler", "otelgpu-watchdog"]
        gate.set()   # the hung read returns: its thread reads it alone from now on, nothing twice
        wait_until(lambda: hung.reads >= 5, 5, "the released source read on its own thread")
        reads = before.reads
        time.sleep(0.5)
        assert 5 <= before.reads - reads <= 12   # one thread reads it, every 0.05 s
    finally:
        gate.set()
        sampler.stop()


def test_a_hung_source_does_not_delay_the_agents_shutdown():
    import httpx

    from otel_gpu.agent.cli import AgentConfig
    from otel_gpu.agent.runtime import AgentRuntime
    from otel_gpu.agent.node import Node, NodeConfig
    from tests.servers import free_port

    gate = threading.Event()
    fine, hung = ScriptedSource(name="fine"), ScriptedSource(name="hung", hang=gate)
    port = free_port()
    runtime = AgentRuntime(AgentConfig(NodeConfig(), 0.1, OtlpSettings(None, "http/protobuf", 10.0, 10.0),
                                       port, "127.0.0.1", False), Node(sources=[fine, hung]))
    runtime.sampler.start()
    try:
        wait_until(lambda: hung.reads == 1, 5, "the hung read started")
        assert "hw_energy_joules_total" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        started = time.monotonic()
        assert runtime.shutdown() == 0
        assert time.monotonic() - started < 2.0   # the hung read is abandoned, not waited for
    finally:
        gate.set()


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
