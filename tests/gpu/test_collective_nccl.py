"""Collective time per backend: gloo blocks the host (host-timed, basis "host"); NCCL returns before the
GPU has waited, so its collectives are GPU-timed from PyTorch's Flight Recorder (basis "gpu") and must
agree with the GPU time of the collectives' kernels in a profiler trace of the same steps (one rank:
an average, which NCCL runs as a kernel; see collective_job.py)."""
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


def collective_time(backend: str, *args: str, **env) -> dict:
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                    OTELGPU_PROFILE="0", **env)
    p = subprocess.run([sys.executable, "-c", "from otel_gpu.training import auto; auto.install(); "
                        f"import runpy; runpy.run_path({str(JOB)!r}, run_name='__main__')", backend, *args],
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_gloo_collectives_are_host_timed_by_kind():
    out = collective_time("gloo")
    assert set(out["time"]) == {"all_reduce||host|"} and out["time"]["all_reduce||host|"] > 0   # sync and async, one kind
    assert out["unmeasured"] == {}


@pytest.mark.gpu
def test_nccl_collectives_are_gpu_timed_and_agree_with_the_profiler():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (this torch build or machine has none)")
    out = collective_time("nccl", "--profile")
    print(json.dumps(out))
    assert out["unmeasured"] == {} and out["steps"] == 20
    gpu = {k: v for k, v in out["time"].items() if k.split("|")[2] == "gpu"}
    assert set(gpu) == {"all_reduce||gpu|default_pg"}, out
    assert sum(out["gpu_ops"].values()) == 40, out   # 20 steps x 2 all-reduces, one kernel each, nothing else
    assert out["gpu_s"] > 1e-3, out                   # 40 x ~0.2 ms: a measurement, not the launch latency
    assert gpu["all_reduce||gpu|default_pg"] == pytest.approx(out["gpu_s"], rel=0.10), out


@pytest.mark.gpu
def test_nccl_with_one_device_connection_says_why_it_is_not_timed():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (this torch build or machine has none)")
    out = collective_time("nccl", CUDA_DEVICE_MAX_CONNECTIONS="1")
    assert out["time"] == {} and out["unmeasured"] == {"max_connections_1": 1}
