"""The MFU PromQL (diagnose/work.py) against a real VictoriaMetrics: a rank's FLOPs meet the GPUs its own job's
processes are listed on, never another job's rank of the same number on the same host; docs/mfu.md shows the
same queries the code builds."""
from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import httpx
import pytest

from otel_gpu.diagnose.work import flops_per_gpu_promql, mfu_promql
from otel_gpu.promql import PromClient

DOCS = Path(__file__).resolve().parents[2] / "docs" / "mfu.md"
STEP_S = 10


def _lines(t0: int, host: str, job: str, gpu: str, flops_per_s: float, peak: float, pid: int) -> str:
    """One rank 0 of `job` on `host` computing `flops_per_s` in bf16 on `gpu` (dense bf16 peak `peak`),
    sampled every STEP_S seconds over the minute before `t0`, as Prometheus text lines."""
    rank = f'otelgpu_job="{job}",host_name="{host}",otelgpu_rank="0"'
    out = []
    for i in range(7):
        t = t0 - 60 + i * STEP_S
        ms = t * 1000
        out += [
            f"otelgpu_train_flops_total{{{rank}}} {flops_per_s * i * STEP_S} {ms}",
            f'otelgpu_train_compute_dtype{{{rank},otelgpu_dtype="bf16"}} 1 {ms}',
            f'otelgpu_gpu_process_memory_usage_bytes{{{rank},hw_id="{gpu}",process_pid="{pid}"}} 1e9 {ms}',
            f'otelgpu_gpu_peak_flops_per_second{{host_name="{host}",hw_id="{gpu}",otelgpu_dtype="bf16"}} {peak} {ms}',
        ]
    return "\n".join(out) + "\n"


def test_two_jobs_on_one_host_with_the_same_rank_each_use_their_own_gpu(victoriametrics):
    vm, tag = victoriametrics, uuid.uuid4().hex[:8]
    host, a, b = f"node-{tag}", f"a-{tag}", f"b-{tag}"
    t0 = int(time.time())
    body = _lines(t0, host, a, "GPU-a", 1e14, 1e15, 100) + _lines(t0, host, b, "GPU-b", 3e14, 2e15, 200)
    r = httpx.post(f"{vm.url}/api/v1/import/prometheus", content=body, timeout=10)
    assert r.status_code == 204, r.text
    vm.flush()
    with PromClient(vm.url) as client:
        for job, gpu, flops, mfu in ((a, "GPU-a", 1e14, 0.1), (b, "GPU-b", 3e14, 0.15)):
            per_rank = client.query(mfu_promql(f'otelgpu_job="{job}"', f'host_name="{host}"', "1m"), t0)
            per_gpu = client.query(flops_per_gpu_promql(f'otelgpu_job="{job}"', f'host_name="{host}"', "1m"), t0)
            assert [(s.labels["hw_id"], s.labels["otelgpu_rank"], s.labels["otelgpu_dtype"]) for s in per_rank] \
                == [(gpu, "0", "bf16")], per_rank
            assert per_rank[0].value == pytest.approx(mfu, rel=0.02)
            assert [s.labels["hw_id"] for s in per_gpu] == [gpu], per_gpu
            assert per_gpu[0].value == pytest.approx(flops, rel=0.02)


def _docs_queries() -> list[str]:
    """The PromQL block of docs/mfu.md's 'In PromQL' paragraph, one query per '#' comment line."""
    text = DOCS.read_text()
    block = re.search(r"\nIn PromQL .*?\n```promql\n(.*?)```", text, re.S)
    assert block, "docs/mfu.md has no 'In PromQL' promql block"
    parts = re.split(r"^#[^\n]*\n", block.group(1), flags=re.M)
    return ["".join(p.split()) for p in parts if p.strip()]


def test_the_docs_show_the_queries_the_code_builds():
    job = 'otelgpu_job="J"'
    assert _docs_queries() == ["".join(q.split()) for q in (flops_per_gpu_promql(job, "", "5m"),
                                                            mfu_promql(job, "", "5m"))]
