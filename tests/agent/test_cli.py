"""`otel-gpu agent` / `doctor` as a user runs them: real subprocesses, real /proc and /sys."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from otel_gpu import names

from .nodetree import sys_with_infiniband

SPEC_NAMES = {s.name for s in names.all_specs()}


def otel_gpu(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "otel_gpu", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    root = tmp_path_factory.mktemp("node")
    ckpt = root / "ckpt"
    ckpt.mkdir()
    out = otel_gpu("agent", "--once", "--json", "--fake-gpus", "8", "--sys-root", str(sys_with_infiniband(root)),
                   "--checkpoint-dir", str(ckpt))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_once_json_has_every_group_of_readings(snapshot):
    got = {row["name"] for row in snapshot}
    for must in ("hw.gpu.utilization", "otelgpu.gpu.sm.activity", "hw.power", "hw.energy", "hw.gpu.memory.usage",
                 "hw.temperature", "otelgpu.gpu.clock", "system.cpu.utilization", "system.memory.usage",
                 "system.network.io", "system.disk.io", "hw.network.io", "hw.network.bandwidth.limit",
                 "system.filesystem.usage", "otelgpu.agent.source.up"):
        assert must in got, must
    assert got <= SPEC_NAMES, f"names not in names.py / docs: {got - SPEC_NAMES}"
    for row in snapshot:
        assert set(row) == {"name", "unit", "value", "attributes"}
        assert isinstance(row["value"], (int, float))


def test_once_json_covers_eight_gpus_by_uuid(snapshot):
    uuids = {r["attributes"]["hw.id"] for r in snapshot if r["name"] == "hw.gpu.utilization"}
    assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)
    sm = [r["value"] for r in snapshot if r["name"] == "otelgpu.gpu.sm.activity"]
    assert len(sm) == 8 and all(0 <= v <= 1 for v in sm)


def test_no_nvidia_driver_keeps_host_metrics_and_says_so_once():
    out = otel_gpu("agent", "--once", "--json")          # this machine has no NVIDIA driver
    if "GPU metrics are off" not in out.stderr:
        pytest.skip("an NVIDIA driver is present on this machine")
    assert out.returncode == 0
    assert out.stderr.count("GPU metrics are off") == 1
    assert len(out.stderr.strip().splitlines()) == 1
    got = {row["name"] for row in json.loads(out.stdout)}
    assert "system.cpu.utilization" in got and not any(n.startswith("hw.gpu") for n in got)


@pytest.mark.parametrize("args, env, message", [
    (["--interval", "0.01"], {}, "--interval='0.01': must be between 0.1 and 3600"),
    (["--interval", "fast"], {}, "--interval='fast': expected a number"),
    (["--prometheus-port", "70000"], {}, "--prometheus-port"),
    (["--checkpoint-dir", "/nonexistent/ckpt"], {}, "not a directory"),
    ([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ([], {"OTEL_METRIC_EXPORT_INTERVAL": "-5"}, "OTEL_METRIC_EXPORT_INTERVAL"),
    ([], {"OTELGPU_INTERVAL": "abc"}, "--interval='abc'"),
    (["--json"], {}, "--json needs --once"),
])
def test_bad_flags_and_environment_give_one_line_and_exit_2(args, env, message):
    out = otel_gpu("agent", "--no-live", *args, env=env)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_sigterm_flushes_and_exits_0_within_5_s(tmp_path):
    from tests.servers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--fake-gpus", "2",
                             "--prometheus-port", str(port), "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    time.sleep(3)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=10)
    assert rc == 0, proc.stderr.read()
    assert time.monotonic() - start < 5.0


def test_doctor_reports_gpus_and_groups():
    out = otel_gpu("doctor", "--json", "--fake-gpus", "2")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"nvml", "host", "net", "disk"} <= set(report["sources"])
