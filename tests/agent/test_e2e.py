"""End to end: the real agent scraped by a real Prometheus, and exporting OTLP into a real VictoriaMetrics.

Every metric family the agent reads on this node (8 fake Hopper GPUs, the real host, the
InfiniBand fixture tree) is queried back by the name docs/metrics.md gives for that path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from otel_gpu import names
from otel_gpu.promql import PromClient
from tests.servers import free_port, wait_until

from .nodetree import sys_with_infiniband

pytestmark = pytest.mark.slow
SPECS = {s.name: s for s in names.all_specs()}
for _spec in list(SPECS.values()):
    if _spec.windowed:
        for _c in names.windowed_companions(_spec):
            SPECS[_c.name] = _c


@pytest.fixture(scope="module")
def node_args(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-node")
    (root / "ckpt").mkdir()
    return ["--fake-gpus", "8", "--sys-root", str(sys_with_infiniband(root)), "--checkpoint-dir", str(root / "ckpt")]


@pytest.fixture(scope="module")
def expected_names(node_args):
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "agent", "--once", "--json", *node_args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {row["name"] for row in json.loads(out.stdout)}
    # windowed gauges also export their min/max companions; health is exported for every source
    for n in list(got):
        if SPECS[n].windowed:
            got |= {c.name for c in names.windowed_companions(SPECS[n])}
    return got | {"otelgpu.agent.source.duration", "otelgpu.agent.source.errors", "otelgpu.agent.samples"}


def start_agent(args, env=None):
    proc = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--interval", "0.5", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    return proc


def stop_agent(proc):
    proc.terminate()
    assert proc.wait(timeout=10) == 0, proc.stderr.read()


def missing_families(client: PromClient, expected, form) -> list[str]:
    present = set(client.label_values("__name__"))
    missing = []
    for name in sorted(expected):
        prom = form(SPECS[name])
        if prom not in present:
            missing.append(f"{name} -> {prom}")
    return missing


def test_prometheus_scrapes_every_family(prometheus, node_args, expected_names):
    port = free_port()
    proc = start_agent([*node_args, "--prometheus-port", str(port)])
    try:
        prometheus.add_scrape_target("otelgpu-agent-e2e", f"127.0.0.1:{port}", interval="1s")
        client = PromClient(prometheus.url)
        form = lambda s: s.prometheus_name()  # the same names as the OTLP translation
        wait_until(lambda: not missing_families(client, expected_names, form), 20, "every family in Prometheus")
        util = client.query('hw_gpu_utilization_ratio{job="otelgpu-agent-e2e"}')
        assert len({s.labels["hw_id"] for s in util}) == 8
        assert all(0 <= s.value <= 1 for s in util)
        assert all(s.labels.get("host_name") for s in util)
        ib = client.query('hw_network_io_bytes_total{job="otelgpu-agent-e2e"}')
        assert ib, "InfiniBand ports are their own series"
    finally:
        stop_agent(proc)
        prometheus.remove_scrape_target("otelgpu-agent-e2e")


def victoriametrics_name(spec) -> str:
    """The name VictoriaMetrics 1.145 stores: Prometheus 3's, except that it also gives `_ratio` to an
    up-down counter of unit 1 (hw.status; tests/test_prom_names.py pins that one difference)."""
    if spec.unit == "1" and spec.kind == "updowncounter":
        return spec.prometheus_name() + "_ratio"
    return spec.prometheus_name()


def test_otlp_into_victoriametrics_every_family(victoriametrics, node_args, expected_names):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"{victoriametrics.url}/opentelemetry",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRIC_EXPORT_INTERVAL": "1000",
           "OTEL_RESOURCE_ATTRIBUTES": "otelgpu.job=e2e-job,deployment.environment=test"}
    proc = start_agent(node_args, env)
    try:
        client = PromClient(victoriametrics.url)

        def missing():
            victoriametrics.flush()
            return missing_families(client, expected_names, victoriametrics_name)

        wait_until(lambda: not missing(), 30, "every family in VictoriaMetrics")
        # OTEL_RESOURCE_ATTRIBUTES reach every series; SM activity for each of the 8 GPUs
        sm = wait_until(lambda: victoriametrics.flush() or
                        client.query('otelgpu_gpu_sm_activity_ratio{otelgpu_job="e2e-job"}'), 10, "labelled series")
        assert len(sm) == 8 and all(0 <= s.value <= 1 for s in sm)
        assert all(s.labels["deployment_environment"] == "test" for s in sm)
        energy = client.query("hw_energy_joules_total")
        assert energy and all(s.value > 0 for s in energy)
    finally:
        stop_agent(proc)


def test_a_reading_is_visible_within_two_export_intervals(victoriametrics):
    """From the moment a value changes to the moment PromQL returns it: <= 2 export intervals."""
    from otel_gpu.agent.cli import AgentConfig
    from otel_gpu.agent.runtime import AgentRuntime
    from otel_gpu.export import OtlpSettings
    from otel_gpu.agent.node import Node, NodeConfig

    from .sources import SwitchSource

    export_s = 1.0
    otlp = OtlpSettings(f"{victoriametrics.url}/opentelemetry", "http/protobuf", interval_s=export_s, timeout_s=1.0)
    source = SwitchSource(name="latency", before=0.2, after=0.9)
    runtime = AgentRuntime(AgentConfig(NodeConfig(), 0.1, otlp, None, "127.0.0.1", False), Node(sources=[source]))
    client = PromClient(victoriametrics.url)
    query = 'otelgpu_hw_gpu_utilization_max_ratio{hw_id="GPU-test"}'

    def value():
        victoriametrics.flush()
        got = client.query(query)
        return got[0].value if got else None

    runtime.sampler.start()
    try:
        wait_until(lambda: value() == 0.2, 15, "the first value exported", interval=0.05)
        flipped = source.flip()
        wait_until(lambda: value() == 0.9, 10, "the new value visible", interval=0.05)
        latency = time.monotonic() - flipped
        print(f"reading-to-PromQL latency: {latency:.2f} s (export interval {export_s:g} s)")
        assert latency <= 2 * export_s, latency
    finally:
        runtime.shutdown()


def test_otlp_over_grpc_every_family_then_the_receiver_goes_away(node_args, expected_names):
    """OTLP/gRPC into a real gRPC receiver; once it is gone the agent counts failed exports,
    keeps serving, and still stops within 5 s."""
    import httpx

    from .otlp_grpc import GrpcReceiver

    receiver = GrpcReceiver()
    port = free_port()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_EXPORTER_OTLP_TIMEOUT": "1000",
           "OTEL_RESOURCE_ATTRIBUTES": "otelgpu.job=grpc-job"}
    proc = start_agent([*node_args, "--prometheus-port", str(port)], env)
    try:
        wait_until(lambda: expected_names <= receiver.metric_names(), 30, "every family over gRPC")
        sm = receiver.points("otelgpu.gpu.sm.activity")
        last = {attrs["hw.id"]: (resource, attrs, v) for resource, attrs, v in sm}
        assert len(last) == 8 and all(0 <= v <= 1 for _, _, v in last.values())
        resource, attrs, _ = next(iter(last.values()))
        assert resource["otelgpu.job"] == "grpc-job" and resource["service.instance.id"]
        assert attrs["host.name"] == resource["host.name"]

        receiver.stop()   # the backend goes away: exports fail, sampling and scraping go on

        def failures() -> float:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            line = next(x for x in text.splitlines() if x.startswith("otelgpu_agent_export_failures_total"))
            return float(line.rsplit(" ", 1)[1])

        wait_until(lambda: failures() >= 2, 20, "failed gRPC exports counted")
        assert proc.poll() is None
        started = time.monotonic()
        stop_agent(proc)
        assert time.monotonic() - started < 5
    finally:
        receiver.stop()
        if proc.poll() is None:
            proc.kill()
