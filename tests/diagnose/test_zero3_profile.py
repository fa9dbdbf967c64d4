"""ZeRO-3 communication-bound from real profiles: DeepSpeed on CPU (2 ranks, gloo, tiny buckets) under
`otel-gpu run`, metrics into VictoriaMetrics, wall-clock profiles from the real pyroscope-io agent
decoded as pprof; the comm rule reads the flame graph's wait share. Also: the flame-graph decoding
of Pyroscope's render API format, on a hand-made flamebearer (no Pyroscope server here)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from otel_gpu.diagnose import diagnose
from otel_gpu.diagnose.comm import LATENCY_SPACE
from otel_gpu.diagnose.profiles import flame_weights, from_flamebearers, from_profiles
from otel_gpu.promql import PromClient
from tests.pyroscope_receiver import Receiver
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[2]


def _env(vm, job):
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OTEL_", "OTELGPU_", "SLURM_", "TORCHELASTIC_", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONPATH=str(REPO), DS_ACCELERATOR="cpu", OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry",
               OTEL_METRIC_EXPORT_INTERVAL="1000", OTELGPU_PROFILE_UPLOAD_S="2")
    return env


@pytest.mark.slow
def test_zero3_tiny_buckets_is_communication_bound(victoriametrics, tmp_path):
    pytest.importorskip("deepspeed", reason="deepspeed not installed (otel-gpu[train])")
    vm, job = victoriametrics, f"zero3-{uuid.uuid4().hex[:8]}"
    start = time.time()
    with Receiver() as rx:
        cmd = [sys.executable, "-m", "otel_gpu", "run", "--job", job, "--pyroscope", rx.url, "--",
               shutil.which("torchrun") or "torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()),
               str(Path(__file__).with_name("zero3_train.py")), "30"]
        p = subprocess.run(cmd, env=_env(vm, job), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "rank 0 finished" in p.stdout and "rank 1 finished" in p.stdout
        profiles = list(rx.profiles)
    end = time.time() + 1
    vm.flush()
    time.sleep(1.5)
    vm.flush()
    assert sorted({pr.series["rank"] for pr in profiles}) == ["0", "1"]
    summary = from_profiles(profiles)
    with PromClient(vm.url) as client:
        report = diagnose(client, job, start, end, profile=summary)
    assert len(report.window.ranks) == 2
    (f,) = [x for x in report.findings if x.rule == "comm"]
    print(f"ZeRO-3 wait share {f.evidence['wait_share']:.3f}: {f.evidence['by_kind_s']}, {f.evidence['top_functions']}")
    assert f.evidence["zero"] is True and f.evidence["profile_source"] == "pprof"
    assert f.evidence["wait_share"] >= 0.2 and f.severity in ("warning", "critical")
    assert {"all_gather", "reduce_scatter"} <= set(f.evidence["by_kind_s"])   # measured per kind
    assert "least collective wait" in f.basis and f.where["ranks"] == ["0", "1"]
    assert any("fetch_sub_module" in fn or "ipg_grads" in fn for fn in f.evidence["top_functions"])
    assert f.tune_space == LATENCY_SPACE and "otel-gpu tune" in f.action   # no interconnect metrics: bucket sizes first
    assert f.evidence["bound"] == "unknown"
    with PromClient(vm.url) as client:   # without profiles: the all-gathers waited in forward/backward say ZeRO-3
        (g,) = [x for x in diagnose(client, job, start, end).findings if x.rule == "comm"]
    print(f"without profiles: {g.title}; {g.evidence['zero_evidence']}")
    assert g.evidence["zero"] is True and "parameter fetch" in g.evidence["zero_evidence"] and g.tune_space == LATENCY_SPACE


def _level(*nodes):
    """Flamebearer 'single' level from (offset-from-previous-end, total, self, name index) tuples."""
    return [x for n in nodes for x in n]


def test_flamebearer_weights_and_merge():
    names = ["total", "main", "train_step", "PartitionedParameterCoordinator.fetch_sub_module",
             "all_gather_into_tensor", "matmul", "Thread.run", "wait"]
    # total 100: main 80 (train_step 80: fetch 30 [all_gather 25], matmul 40); a helper thread 20 in wait
    # recursion: fetch_sub_module calls itself once more (its total counted once)
    levels = [
        _level((0, 100, 0, 0)),
        _level((0, 80, 0, 1), (0, 20, 0, 6)),
        _level((0, 80, 10, 2), (0, 20, 20, 7)),
        _level((0, 30, 5, 3), (0, 40, 40, 5)),
        _level((0, 25, 0, 3)),
        _level((0, 25, 25, 4)),
    ]
    root, comm, fns = flame_weights({"names": names, "levels": levels}, unit_s=1.0)
    assert root == 100 and comm == 30
    assert fns["PartitionedParameterCoordinator.fetch_sub_module"] == [5, 30]
    assert fns["all_gather_into_tensor"] == [25, 25] and fns["matmul"] == [40, 40]
    # the phase-tagged flame graph holds the training thread only
    tagged_levels = [_level((0, 80, 0, 0)), _level((0, 80, 0, 1)), _level((0, 80, 10, 2)),
                     _level((0, 30, 5, 3), (0, 40, 40, 5)), _level((0, 25, 0, 3)), _level((0, 25, 25, 4))]
    tagged = {"names": names, "levels": tagged_levels}
    s = from_flamebearers(tagged, {"names": names, "levels": levels}, unit_s=1.0)
    assert s.training_s == 80 and s.comm_s == 30 and s.comm_share() == pytest.approx(30 / 80)
    assert s.uses_zero() and s.source == "pyroscope"
