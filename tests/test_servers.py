"""The real test servers: start, scrape or receive, answer queries, stop by PID."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from servers import (
    LIGHT_COLLECTORS,
    NODE_EXPORTER_BIN,
    PROMETHEUS_BIN,
    NodeExporter,
    Prometheus,
    ServerError,
    free_port,
    require_binary,
    wait_until,
)

pytestmark = pytest.mark.slow  # every test here starts a real server


def instant(url: str, expr: str) -> list[dict]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone once it has no /proc status "Z"
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 1024 < port < 65536


def test_prometheus_scrapes_a_python_exporter(prometheus):
    registry = CollectorRegistry()
    Gauge("otelgpu_fixture_value", "a value to scrape", ["kind"], registry=registry).labels("test").set(42.5)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        prometheus.add_scrape_target("fixture_scrape", f"127.0.0.1:{port}")
        result = wait_until(
            lambda: instant(prometheus.url, 'otelgpu_fixture_value{job="fixture_scrape"}'),
            10,
            "scraped value queryable",
        )
        assert len(result) == 1
        assert result[0]["metric"]["kind"] == "test"
        assert float(result[0]["value"][1]) == 42.5
    finally:
        prometheus.remove_scrape_target("fixture_scrape")
        server.shutdown()
        thread.join(5)


def test_prometheus_accepts_remote_write_and_lifecycle(prometheus):
    # the flags tests rely on are on: the remote-write path exists (an empty body is a 400, not 404)
    r = httpx.post(f"{prometheus.url}/api/v1/write", content=b"", timeout=5)
    assert r.status_code == 400
    flags = httpx.get(f"{prometheus.url}/api/v1/status/flags", timeout=5).json()["data"]
    assert flags["web.enable-lifecycle"] == "true"
    assert flags["web.listen-address"] == prometheus.host_port


def test_bad_config_fails_with_log_tail(tmp_path):
    require_binary(PROMETHEUS_BIN, "Prometheus")
    bad = Prometheus("scrape_configs:\n  - job_name: x\n    no_such_key: 1\n", tmp_path)
    with pytest.raises(ServerError) as err:
        bad.start()
    msg = str(err.value)
    assert "exited with status" in msg
    assert "no_such_key" in msg  # the server's own complaint, from its log
    assert bad.proc is None


def test_stop_terminates_by_pid(tmp_path):
    require_binary(PROMETHEUS_BIN, "Prometheus")
    p = Prometheus("global:\n  scrape_interval: 5s\n", tmp_path).start()
    pid = p.pid
    assert pid_alive(pid)
    p.stop()
    assert not pid_alive(pid)
    with pytest.raises(ServerError):
        p.pid


def test_node_exporter_light_collectors(tmp_path):
    require_binary(NODE_EXPORTER_BIN, "node_exporter")
    with NodeExporter(tmpdir=tmp_path, collectors=LIGHT_COLLECTORS) as ne:
        text = httpx.get(f"{ne.url}/metrics", timeout=10).text
    assert "node_cpu_seconds_total{" in text
    assert "node_memory_MemTotal_bytes" in text
    assert 'collector="filesystem"' not in text  # the default set is off


def test_victoriametrics_receives_otlp_with_prometheus_names(victoriametrics):
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    exporter = OTLPMetricExporter(endpoint=f"{victoriametrics.url}/opentelemetry/v1/metrics")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "fixture-otlp", "service.instance.id": "node-a"}),
        metric_readers=[reader],
    )
    try:
        meter = provider.get_meter("fixture")
        meter.create_observable_gauge(
            "otelgpu.fixture.busy",
            callbacks=[lambda _: [Observation(0.25, {"hw.id": "GPU-0"})]],
            unit="1",
        )
        meter.create_counter("otelgpu.fixture.io", unit="By").add(4096, {"network.io.direction": "receive"})
        assert provider.force_flush(10_000)
        pushed = time.monotonic()
        victoriametrics.flush()
        gauge = wait_until(
            lambda: instant(victoriametrics.url, 'otelgpu_fixture_busy_ratio{service_name="fixture-otlp"}'),
            5,
            "OTLP gauge queryable",
        )
        visible_after = time.monotonic() - pushed
        counter = wait_until(
            lambda: instant(victoriametrics.url, "otelgpu_fixture_io_bytes_total"), 5, "OTLP counter queryable"
        )
    finally:
        provider.shutdown()
    assert float(gauge[0]["value"][1]) == 0.25
    assert gauge[0]["metric"]["hw_id"] == "GPU-0"
    assert gauge[0]["metric"]["service_instance_id"] == "node-a"
    assert float(counter[0]["value"][1]) == 4096
    assert counter[0]["metric"]["network_io_direction"] == "receive"
    assert visible_after < 5
