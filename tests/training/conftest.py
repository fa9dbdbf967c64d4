"""Helpers for training tests: run a real training process with telemetry, read it back."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "tests"))

import childenv  # noqa: E402


def unique_job(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def clean_env(**extra: str) -> dict[str, str]:
    """`childenv.clean_env` with metrics exported every second (`extra` wins)."""
    return childenv.clean_env(**{"OTEL_METRIC_EXPORT_INTERVAL": "1000", **extra})


def run_py(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return proc


def otlp_env(vm, job: str, **extra: str) -> dict[str, str]:
    return clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=vm.url + "/opentelemetry",
                     OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTELGPU_JOB=job, **extra)


def query_until(vm, expr: str, want: int, timeout: float = 15.0):
    """PromQL `expr` on `vm` until it returns at least `want` series (VictoriaMetrics flushed)."""
    from otel_gpu.promql import PromClient

    client = PromClient(vm.url)
    deadline = time.monotonic() + timeout
    while True:
        vm.flush()
        result = client.query(expr)
        if len(result) >= want or time.monotonic() > deadline:
            return result
        time.sleep(0.3)


@pytest.fixture
def torch_mod():
    return pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
