"""Prometheus names: Prometheus 3's OTLP translation, docs/metrics.md and the agent's scrape endpoint agree.

`otel_gpu.prom_names` follows prometheus/otlptranslator (UnderscoreEscapingWithSuffixes). Its
cases are checked against examples from that project's own tests and rules; then every metric
spec's name is compared with the table in docs/metrics.md, with what the real agent serves on
its scrape endpoint, and with what a real VictoriaMetrics (`-opentelemetry.usePrometheusNaming`)
stores from the same agent's OTLP export.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu import names
from otel_gpu.prom_names import UNITS, metric_name, unit_suffixes
from otel_gpu.promql import PromClient
from tests.servers import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]


def all_specs():
    out = []
    for spec in names.all_specs():
        out.append(spec)
        if spec.windowed:
            out += names.windowed_companions(spec)
    return out


# (name, unit, kind, what Prometheus 3 stores): otlptranslator's documented behaviour
@pytest.mark.parametrize("name, unit, kind, expected", [
    ("http.server.duration", "s", "histogram", "http_server_duration_seconds"),
    ("requests.count", "1", "counter", "requests_count_total"),            # no _ratio on counters
    ("memory.usage", "By", "gauge", "memory_usage_bytes"),
    ("system.cpu.utilization", "1", "gauge", "system_cpu_utilization_ratio"),
    ("hw.status", "1", "updowncounter", "hw_status"),                     # only gauges get _ratio
    ("hw.network.bandwidth.limit", "By/s", "gauge", "hw_network_bandwidth_limit_bytes_per_second"),
    ("system.network.packet.count", "{packet}", "counter", "system_network_packet_count_total"),
    ("system.disk.operation_time", "s", "counter", "system_disk_operation_time_seconds_total"),
    ("hw.temperature", "Cel", "gauge", "hw_temperature_celsius"),
    ("gpu.clock", "MHz", "gauge", "gpu_clock_MHz"),                        # unknown units are kept
    ("disk.bytes.read", "By", "counter", "disk_bytes_read_total"),         # the unit is a token already
    ("queue.total.items", "{item}", "counter", "queue_items_total"),       # one `total`, at the end
    ("cache.hit.ratio", "1", "gauge", "cache_hit_ratio"),
    ("requests", "1/s", "gauge", "requests_per_second"),
    ("latency__ms", "ms", "gauge", "latency_ms_milliseconds"),
    ("2xx.responses", "{response}", "counter", "_2xx_responses_total"),
    ("a:b.c", "%", "gauge", "a:b_c_percent"),
])
def test_translation_cases(name, unit, kind, expected):
    assert metric_name(name, unit, kind) == expected


@settings(max_examples=300, deadline=None)
@given(name=st.from_regex(r"[a-z][a-z0-9_.:\-]{0,30}", fullmatch=True),
       unit=st.sampled_from([*UNITS, "By/s", "1/s", "{packet}", "{error}/s", "MHz", "", "KiBy/min"]),
       kind=st.sampled_from(["gauge", "counter", "updowncounter", "histogram"]))
def test_translation_invariants(name, unit, kind):
    out = metric_name(name, unit, kind)
    assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", out) and "__" not in out.lstrip("_")
    if kind == "counter":
        assert out.endswith("_total")
    elif not re.search(r"(^|[^a-zA-Z0-9:])total$", name):
        assert not out.endswith("_total")
    if unit == "1" and kind == "gauge":
        assert out.endswith("_ratio")
    main, per = unit_suffixes(unit)
    if main:
        assert main in out.split("_")
    if per:
        assert per in out
    # translating the result again changes nothing (per-units split into two tokens aside)
    if kind in ("histogram", "updowncounter", "gauge") and "/" not in unit:
        assert metric_name(out, unit, kind) == out


def test_every_spec_follows_the_translation():
    specs = all_specs()
    assert len({s.prometheus_name() for s in specs}) == len(specs)
    for spec in specs:
        assert spec.prometheus_name() == metric_name(spec.name, spec.unit, spec.kind)
    assert names.GPU_STATUS.prometheus_name() == "hw_status"
    assert names.GPU_UTILIZATION.prometheus_name() == "hw_gpu_utilization_ratio"


def test_docs_metrics_md_names_what_prometheus_3_stores():
    table = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \| `([^`]+)` \| (\w+)", line)
        if m:
            table[m.group(1)] = m.group(2)
    specs = all_specs()
    assert len(table) == len(specs)
    for spec in specs:
        assert table[spec.name] == metric_name(spec.name, spec.unit, spec.kind), spec.name


@pytest.fixture(scope="module")
def agent_output(victoriametrics, tmp_path_factory):
    """One real agent (2 fake GPUs): its scrape text, and the names VictoriaMetrics stored from its OTLP."""
    node, port = f"names-{uuid.uuid4().hex[:8]}", free_port()
    ckpt = tmp_path_factory.mktemp("names-ckpt")
    drop = ("OTEL_", "OTELGPU_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])),
               OTEL_EXPORTER_OTLP_ENDPOINT=victoriametrics.url + "/opentelemetry",
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRIC_EXPORT_INTERVAL="1000",
               OTEL_RESOURCE_ATTRIBUTES=f"host.name={node}")
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--interval", "0.5",
                              "--fake-gpus", "2", "--prometheus-port", str(port), "--checkpoint-dir", str(ckpt)],
                             env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def scrape():
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                return None
            # windowed gauges appear once their first window closed
            return text if "otelgpu_gpu_sm_activity_min_ratio{" in text and "hw_status{" in text else None
        wait_until(scrape, 30, "the agent's scrape endpoint")
        client = PromClient(victoriametrics.url)

        def stored():
            victoriametrics.flush()
            got = set(client.label_values("__name__", match=f'{{host_name="{node}"}}'))
            return got if {"otelgpu_gpu_sm_activity_min_ratio", "otelgpu_agent_samples_total"} <= got else None
        vm_names = wait_until(stored, 30, "the agent's series in VictoriaMetrics", interval=0.5)
        text = scrape()
    finally:
        agent.terminate()
        assert agent.wait(timeout=15) == 0, agent.stderr.read()
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.M)) - {"target_info"}
    return served, vm_names


def test_the_agent_serves_the_translated_name_of_every_family(agent_output):
    served, _ = agent_output
    expected = {s.prometheus_name() for s in all_specs()}
    assert served and served <= expected, sorted(served - expected)
    assert "hw_status" in served and "hw_status_ratio" not in served
    # everything the fake GPUs and this host produce, the health metrics included
    assert {"hw_power_watts", "hw_gpu_memory_usage_bytes", "otelgpu_gpu_sm_activity_ratio",
            "otelgpu_agent_source_up", "system_cpu_utilization_ratio"} <= served


def test_victoriametrics_stores_what_the_agent_serves_but_for_updowncounters_of_unit_1(agent_output):
    """VictoriaMetrics 1.145 also gives `_ratio` to a non-monotonic sum of unit 1; Prometheus 3 does not.

    So the tests' stand-in for Prometheus 3 stores `hw_status_ratio` (and the row-remap flags'
    `..._ratio`) where the stack stores `hw_status`; no dashboard or rule queries them (test_generate
    checks the names they use).
    """
    served, stored = agent_output
    stored -= {"target_info"}
    flags = {metric_name(s.name, s.unit, "updowncounter") for s in names.all_specs()
             if s.kind == "updowncounter" and s.unit == "1"} & served
    assert "hw_status" in flags
    assert served - stored == flags and stored - served == {f + "_ratio" for f in flags}
