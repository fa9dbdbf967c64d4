"""The job consistency check on the recording path: two nodes' real agents (fake NVML variants: an
A100 among H100s, a GPU on 8 lanes, a GPU of a lower maximum SM clock, a node on another driver)
export OTLP into one recording's receiver; `diagnose` on the recording names each odd GPU. And
`doctor` on one node: the same variants in its table of unlike GPUs, alike GPUs said to be alike."""
from __future__ import annotations

import os
import time

import pytest

from otel_gpu.agent.cli import AgentConfig
from otel_gpu.agent.doctor_view import doctor_view
from otel_gpu.agent.node import Node, NodeConfig
from otel_gpu.agent.runtime import AgentRuntime
from otel_gpu.export import OtlpSettings
from otel_gpu.record.diagnose import diagnose_recording
from otel_gpu.record.session import RecordedRun
from otel_gpu.sources.fake_nvml import FakeNvml, a100, hopper
from otel_gpu.sources.nvml import NvmlSource

pytestmark = pytest.mark.slow
NODE_A = [hopper(), hopper(pcie_link=(5, 8, 5, 16)), hopper(max_clocks_mhz=(1755, 2619)), a100()]
NODE_B = [hopper(), hopper()]


def run_agent(monkeypatch, env: dict, host: str, nvml: FakeNvml, seconds: float) -> None:
    """One node's agent (the NVML source only) sampling every 0.25 s, exporting every 0.5 s into the recording."""
    for key in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTELGPU_JOB"):
        monkeypatch.setenv(key, env[key])   # the SDK's exporter reads the recording's key from the process
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"host.name={host}")
    otlp = OtlpSettings(env["OTEL_EXPORTER_OTLP_ENDPOINT"], "http/protobuf", interval_s=0.5, timeout_s=2.0)
    source = NvmlSource(nvml=nvml)
    runtime = AgentRuntime(AgentConfig(NodeConfig(), 0.25, otlp, None, "127.0.0.1", False),
                           Node(sources=[source], gpu=source), env=dict(os.environ))
    runtime.sampler.start()
    try:
        time.sleep(seconds)
    finally:
        runtime.shutdown()
        source.close()


def test_diagnose_on_a_recording_names_the_odd_gpus(tmp_path, monkeypatch):
    run = RecordedRun(tmp_path / "run", "mixed-job", ["mixed-job"], {})
    env = run.child_env({}, profile=False)
    try:
        run_agent(monkeypatch, env, "node-a", FakeNvml(gpus=NODE_A), 1.1)
        run_agent(monkeypatch, env, "node-b", FakeNvml(gpus=NODE_B, driver="580.95.05"), 1.1)
    finally:
        run.finish(0)
    report = diagnose_recording([run.directory], require_steps=False)
    assert len(report.window.gpus) == 6
    found = {f.evidence["property"]: f for f in report.findings if f.rule == "gpu_consistency"}
    assert {k: (f.evidence["common"], f.evidence["odd"]) for k, f in found.items()} == {
        "model": ("NVIDIA H100 80GB HBM3", {"node-a/gpu3": "NVIDIA A100-SXM4-80GB"}),
        "memory (GiB)": (79.6, {"node-a/gpu3": 80.0}),
        "PCIe generation": (5, {"node-a/gpu3": 4}),
        "PCIe width (lanes)": (16, {"node-a/gpu1": 8}),
        "max SM clock (MHz)": (1980, {"node-a/gpu2": 1755, "node-a/gpu3": 1410}),
        "driver": ("590.48.01", {"node-b/gpu0": "580.95.05", "node-b/gpu1": "580.95.05"}),
    }
    assert found["driver"].where == {"gpus": ["node-b/gpu0", "node-b/gpu1"]}
    assert "same driver" in found["driver"].action and "slowest GPU" in found["max SM clock (MHz)"].why
    assert "2 of 6 not 590.48.01" in found["driver"].title


def test_alike_gpus_on_a_recording_give_no_finding(tmp_path, monkeypatch):
    run = RecordedRun(tmp_path / "run", "alike-job", ["alike-job"], {})
    env = run.child_env({}, profile=False)
    try:
        run_agent(monkeypatch, env, "node-c", FakeNvml(gpus=[hopper() for _ in range(4)]), 0.8)
    finally:
        run.finish(0)
    report = diagnose_recording([run.directory], require_steps=False)
    gpus = report.window.gpus
    assert len(gpus) == 4 and {(g.model, g.pcie_gen, g.pcie_width, g.sm_clock_limit_hz, g.driver) for g in gpus} == {
        ("NVIDIA H100 80GB HBM3", 5, 16, 1.98e9, "590.48.01")}
    assert [f for f in report.findings if f.rule == "gpu_consistency"] == []


def test_doctor_lists_the_unlike_gpus_of_one_node():
    source = NvmlSource(nvml=FakeNvml(gpus=NODE_A))
    try:
        info = source.describe()
    finally:
        source.close()
    rows = {r["property"]: r for r in info["gpus_unlike"]}
    assert set(rows) == {"model", "memory (GiB)", "PCIe generation", "PCIe width (lanes)", "max SM clock (MHz)"}
    assert rows["PCIe width (lanes)"]["most"] == 16 and rows["PCIe width (lanes)"]["odd"].endswith("/gpu1 8")
    assert rows["max SM clock (MHz)"]["gpus"] == "all of this node"
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(doctor_view({"sources": {"nvml": info}}))
    text = console.export_text()
    assert "gpus_unlike" in text and "max SM clock (MHz)" in text and "NVIDIA A100-SXM4-80GB" in text


def test_doctor_says_alike_gpus_are_alike_and_one_gpu_is_not_checked():
    for gpus, said in (([hopper(), hopper(), hopper()], "yes: 3 GPUs alike"), ([hopper()], "not checked: 1 GPU read")):
        source = NvmlSource(nvml=FakeNvml(gpus=gpus))
        try:
            info = source.describe()
        finally:
            source.close()
        assert info["gpus_alike"].startswith(said) and "gpus_unlike" not in info
