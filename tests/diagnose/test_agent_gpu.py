"""GPU rules on series from the real agent (OTLP into VictoriaMetrics): fake GPUs scripted with
periodic stalls, SMs idle behind utilization and one thermal throttle (FakeGpu's `stall`,
`sm_share`, `clock_event_reasons`); the real NVML where a GPU exists (`gpu` marker)."""
from __future__ import annotations

import time
import uuid

import pynvml
import pytest

from otel_gpu.agent.cli import AgentConfig
from otel_gpu.agent.runtime import AgentRuntime
from otel_gpu.diagnose import diagnose
from otel_gpu.export import OtlpSettings
from otel_gpu.agent.node import Node, NodeConfig
from otel_gpu.promql import PromClient
from otel_gpu.sources.fake_nvml import FakeNvml, hopper
from otel_gpu.sources.nvml import NvmlSource

pytestmark = pytest.mark.slow
THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown


def run_agent(nvml, vm, job: str, seconds: float) -> tuple[float, float]:
    """The agent (NVML source only) sampling every 0.5 s, exporting OTLP every 1 s for `seconds`."""
    otlp = OtlpSettings(f"{vm.url}/opentelemetry", "http/protobuf", interval_s=1.0, timeout_s=2.0)
    source = NvmlSource(nvml=nvml)
    runtime = AgentRuntime(AgentConfig(NodeConfig(), 0.5, otlp, None, "127.0.0.1", False),
                           Node(sources=[source], gpu=source), env={"OTELGPU_JOB": job})
    start = time.time()
    runtime.sampler.start()
    try:
        time.sleep(seconds)
    finally:
        runtime.shutdown()
        source.close()
    end = time.time() + 1
    vm.flush()
    time.sleep(1.5)
    vm.flush()
    return start, end


@pytest.fixture(scope="module")
def scripted(victoriametrics):
    job = f"fake-gpu-{uuid.uuid4().hex[:8]}"
    # every GPU busy at 97% with SM activity a quarter of that, idle 2.5 s of every 8 s; GPU 7 throttled
    scripted = dict(load=0.97, sm_share=0.25, stall=(8.0, 2.5))
    gpus = [hopper(**scripted) for _ in range(7)] + [hopper(clock_event_reasons=THERMAL, **scripted)]
    nvml = FakeNvml(gpus=gpus)
    start, end = run_agent(nvml, victoriametrics, job, seconds=42)
    with PromClient(victoriametrics.url) as client:
        return diagnose(client, job, start, end, require_steps=False)


def by_rule(report):
    out = {}
    for f in report.findings:
        out.setdefault(f.rule, []).append(f)
    return out


def test_agent_series_read_back(scripted):
    w = scripted.window
    assert len(w.gpus) == 8 and not w.ranks
    assert w.interval_s == pytest.approx(1.0, abs=0.2)
    assert all(g.sm is not None and g.util is not None for g in w.gpus)


def test_sm_idle_behind_utilization_on_the_fake(scripted):
    (f,) = by_rule(scripted)["sm_idle"]
    assert f.evidence["gpus_flagged"] == 8
    assert f.evidence["sm_activity"] / f.evidence["utilization"] == pytest.approx(0.25, abs=0.03)
    assert f.severity == "critical"


def test_periodic_stalls_on_the_fake(scripted):
    (f,) = by_rule(scripted)["periodic"]
    assert f.evidence["period_s"] == pytest.approx(8.0, abs=1.0)
    assert f.evidence["drops"] >= 4 and f.evidence["matched_phase"] is None


def test_thermal_throttling_on_the_fake(scripted):
    (f,) = [x for x in by_rule(scripted)["throttle"] if "thermal" in x.title]
    gpu7 = next(g for g in scripted.window.gpus if g.gpu == "7")
    assert f.where["gpus"] == [gpu7.name]
    assert f.evidence["active_share_max"] > 0.9
    # the fake keeps its clocks up: reported, but no clock loss measured against the other GPUs
    assert f.severity == "warning" and "clocks not lower" in f.basis and f.lost_s < 5


@pytest.mark.gpu
def test_rules_on_the_real_nvml(victoriametrics):
    """Same pipeline on the real GPU(s): every GPU is read back and the GPU rules get their inputs."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        pytest.skip(f"no NVIDIA driver/GPU on this machine: nvmlInit failed ({err})")
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    job = f"real-gpu-{uuid.uuid4().hex[:8]}"
    start, end = run_agent(pynvml, victoriametrics, job, seconds=20)
    with PromClient(victoriametrics.url) as client:
        report = diagnose(client, job, start, end, require_steps=False)
    assert len(report.window.gpus) == count
    g = report.window.gpus[0]
    assert g.util is not None and g.power_w and g.mem_limit_b and g.throttle
    missing = {f.rule: f.missing for f in report.findings if f.missing}
    assert "throttle" not in missing
    if g.sm is None:   # no GPM (pre-Hopper, or MIG): the rule says so
        assert missing["sm_idle"] == ["otelgpu_gpu_sm_activity"]
    else:
        assert "sm_idle" not in missing
    print({f.rule: (f.severity, f.title) for f in report.findings})
