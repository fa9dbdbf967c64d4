"""Collective wait per backend: gloo blocks the host (measured); NCCL returns before the GPU waited, so
nothing is exported (the rules then say "not checked" rather than report near-zero waits)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.childenv import clean_env
from tests.servers import free_port

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
JOB = Path(__file__).with_name("collective_job.py")


def collective_wait(backend: str) -> dict[str, float]:
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                    OTELGPU_PROFILE="0")
    p = subprocess.run([sys.executable, str(JOB), backend], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_gloo_collectives_are_timed_by_kind():
    waits = collective_wait("gloo")
    assert set(waits) == {"all_reduce|"} and waits["all_reduce|"] > 0   # sync call and async wait, one kind


@pytest.mark.gpu
def test_nccl_collectives_export_no_host_wait():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (this torch build or machine has none)")
    assert collective_wait("nccl") == {}
