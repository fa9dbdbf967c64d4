"""The allocator exporter on a real GPU: retries provoked under a per-process memory cap are seen in the
exported metrics, and a process that never touched CUDA exports nothing and stays without a context."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import names
from otel_gpu.training.session import Session
from tests.childenv import clean_env
from tests.training.test_session import _points

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
MIB = 1 << 20
CAP = 2 << 30   # the allocator may reserve this much here (set_per_process_memory_fraction)


def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (this torch build or machine has none)")


def _by_device(points, spec):
    return {p.attributes[names.CUDA_DEVICE]: p.value for p in points.get(spec.name, [])}


@pytest.mark.gpu
def test_retries_provoked_near_the_limit_are_exported():
    """Under the cap a request that fits no cached block fails (c10/cuda/CUDACachingAllocator.cpp: alloc_block
    refuses past the fraction; release_available_cached_blocks does nothing without max_split_size), so the
    allocator frees its cached blocks and tries again: one retry counted."""
    _needs_cuda()
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        pytest.skip("PYTORCH_CUDA_ALLOC_CONF is set: the retry path this test provokes assumes the default allocator")
    dev = torch.cuda.current_device()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(CAP / torch.cuda.get_device_properties(dev).total_memory, dev)
    reader = InMemoryMetricReader()
    session = Session({"RANK": "0", "WORLD_SIZE": "1", "OTELGPU_JOB": "gpu-alloc"}, readers=[reader], profile=False)
    try:
        before = torch.cuda.memory_stats(dev).get("num_alloc_retries", 0)
        kept, freed, sizes = [], [], (20, 36, 52)   # MiB: each its own segment, none fits the large request below
        i = 0
        while torch.cuda.memory_reserved(dev) < CAP - 400 * MIB:
            t = torch.empty(sizes[i % 3] * MIB, dtype=torch.uint8, device=dev)
            (kept if i % 2 else freed).append(t)
            i += 1
        del freed   # back in the cache, in pieces too small for what comes next
        big = torch.empty(600 * MIB, dtype=torch.uint8, device=dev)   # over the cap: flush the cache, retry
        with session.timer.step(samples=1):
            pass
        torch.cuda.synchronize(dev)
        truth = torch.cuda.memory_stats(dev)
        points, _ = _points(reader)
    finally:
        session.shutdown()
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
    assert truth["num_alloc_retries"] > before, "the cap did not provoke a retry"
    retries = _by_device(points, names.TRAIN_ALLOC_RETRIES)
    assert retries[str(dev)] == truth["num_alloc_retries"] >= 1
    assert _by_device(points, names.TRAIN_ALLOC_RESERVED)[str(dev)] == truth["reserved_bytes.all.current"]
    assert _by_device(points, names.TRAIN_ALLOC_ALLOCATED)[str(dev)] == truth["allocated_bytes.all.current"]
    assert str(dev) in _by_device(points, names.TRAIN_ALLOC_INACTIVE_SPLIT)
    del big, kept


@pytest.mark.gpu
def test_a_process_that_never_used_cuda_gets_no_context():
    _needs_cuda()
    code = ("import torch, gc\n"
            "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
            "from otel_gpu.training.session import Session\n"
            "r = InMemoryMetricReader()\n"
            "s = Session({}, readers=[r], profile=False)\n"
            "with s.timer.step(samples=1):\n    gc.collect()\n"
            "names = [m.name for rm in r.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics]\n"
            "s.shutdown()\n"
            "assert not torch.cuda.is_initialized(), 'reading initialised CUDA'\n"
            "assert not [n for n in names if '.allocator.' in n], names\n"
            "assert 'otelgpu.train.gc.time' in names, names\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
