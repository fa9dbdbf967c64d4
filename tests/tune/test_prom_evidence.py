"""Evidence from PromQL against a real VictoriaMetrics fed by the real exporters.

A 2-rank gloo job (`collective_job.py`) runs as one tuner trial with the `otel-gpu run` hooks and its
own node agent (one fake Hopper GPU at the NVML boundary), everything over OTLP into the session's
VictoriaMetrics. The evidence the tuner computes with PromQL over the trial's steady window must equal
the same definitions computed here, in plain Python, from the raw samples the server holds: collective
seconds per step per kind, CPU busy, the GPU readings.
"""
from __future__ import annotations

import shutil
import time
from collections import defaultdict
from pathlib import Path

import pytest

from otel_gpu import names as N
from otel_gpu.promql import PromClient
from otel_gpu.tune import config as C
from otel_gpu.tune import evidence as E
from otel_gpu.tune.objective import PromObjective
from otel_gpu.tune.space import parse_space
from otel_gpu.tune.study import Settings, Tuner, storage_url
from otel_gpu.tune.trial import TRIAL_LABEL

from .helpers import HERE, clean_env, copy_base, flushing

JOB = HERE / "collective_job.py"
LAG_S = 0.020       # rank 1 reaches each all_gather this late


def _at(points, t):
    """The last value at or before t (None: none)."""
    before = [v for ts, v in points if ts <= t]
    return before[-1] if before else None


def _label(name: str) -> str:
    return name.replace(".", "_")


def _expected(raw, t0: float, t1: float) -> dict:
    """The evidence's definitions over the raw samples (window (t0, t1], as PromQL ranges are)."""
    def inside(points):
        return [v for ts, v in points if t0 < ts <= t1]

    def mean_of_means(series):
        means = [sum(v) / len(v) for v in (inside(s.points) for s in series) if v]
        return sum(means) / len(means) if means else None

    steps = sum(_at(s.points, t1) - _at(s.points, t0) for s in raw(N.TRAIN_STEP_DURATION.prometheus_name() + "_count"))
    by_kind: dict[str, float] = defaultdict(float)
    for s in raw(N.TRAIN_COLLECTIVE_TIME.prometheus_name()):
        if s.labels.get(_label(N.PHASE), "") in E.OUTSIDE_STEPS or _at(s.points, t1) is None:
            continue
        by_kind[s.labels[_label(N.COLLECTIVE)]] += _at(s.points, t1) - (_at(s.points, t0) or 0.0)
    idle = [s for s in raw(N.CPU_UTILIZATION.prometheus_name()) if s.labels.get(_label(N.CPU_MODE)) == "idle"]
    peaks = [max(v) for v in (inside(s.points) for s in raw(N.GPU_MEMORY_USAGE.prometheus_name())) if v]
    pcie = [sum(v) / len(v) for v in (inside(s.points) for s in raw(N.GPU_PCIE_RATE.prometheus_name())) if v]
    return {
        "collectives": {k: v / steps for k, v in sorted(by_kind.items()) if v > 0},
        "cpu_busy": 1 - mean_of_means(idle),
        "sm_activity": mean_of_means(raw(N.GPU_SM_ACTIVITY.prometheus_name())),
        "tensor_activity": mean_of_means(raw(N.GPU_TENSOR_ACTIVITY.prometheus_name())),
        "gpu_utilization": mean_of_means(raw(N.GPU_UTILIZATION.prometheus_name())),
        "gpu_memory_peak_bytes": max(peaks) if peaks else None,
        "pcie_bytes_per_s": sum(pcie) if pcie else None,
        "steps": steps,
    }


@pytest.mark.timeout(300)
def test_prometheus_evidence_equals_the_samples_fed(victoriametrics, tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not on PATH (comes with torch)")
    vm, client = victoriametrics, PromClient(victoriametrics.url)
    out = tmp_path / "out"
    command = f"{torchrun} --standalone --nproc_per_node 2 {JOB} --deepspeed {{config}} --steps 40 --lag-ms {LAG_S * 1000:g}"
    settings = Settings(
        base_config=copy_base(tmp_path), command=command, trials=1, out=out, storage=storage_url(out / "study.db"),
        study_name=f"promev{time.time_ns()}", space=parse_space({}),
        facts=C.Facts(hidden_size=64, micro_batch=4, grad_accum=1, world_size=2, max_grad_norm=1.0, precision="fp32"),
        timeout_s=120.0, prune=False, deepspeed_check=False, otlp_endpoint=vm.url + "/opentelemetry",
        export_interval_ms=250, node_agent=True)
    objective = PromObjective(client, warmup=3, settle_s=30, fresh_s=1.5, trial_agent=True)
    tuner = Tuner(settings, objective, env=clean_env(OMP_NUM_THREADS="1", OTELGPU_FAKE_GPUS="1", OTELGPU_INTERVAL="0.25"))
    tuner.prepare()
    start = time.time()
    with flushing(vm):
        (record,) = tuner.run()
        time.sleep(1.0)    # the agent's and the ranks' exit-time exports, searchable
    assert record.status == "ok", (record, (Path(record.directory) / "output.log").read_text()[-2000:])
    assert {"all_gather", "all_reduce"} <= set(record.evidence["collectives"] or {}), record.evidence
    # torchrun exits seconds after its ranks' last export: scored once nothing new came for 5 s, not
    # after the whole 30 s settle
    assert record.overhead_s < 20, record.overhead_s

    # the same objective, over the window it finds now that every sample is in
    stats = objective.measure(record.trial_id, Path(record.directory), start, time.time())
    assert stats.problem(5) is None and stats.ranks == 2, stats
    t0, t1 = stats.window
    ev = objective.evidence(stats, record.trial_id)
    span = int(time.time() - start) + 60

    def raw(metric):
        return client.query(f'{{__name__="{metric}",{TRIAL_LABEL}="{record.trial_id}"}}[{span}s]', time=time.time())

    want = _expected(raw, t0, t1)
    assert want["steps"] >= 2 * 5, want                     # both ranks' steady steps
    assert ev["collectives"] == pytest.approx(want["collectives"], rel=1e-9), (ev, want)
    assert {"all_gather", "all_reduce"} <= set(ev["collectives"]) and ev["collective_basis"] == "host"
    # rank 0 waits about LAG_S at each all_gather, rank 1 hardly: the mean over ranks is near LAG_S / 2
    assert 0.25 * LAG_S < ev["collectives"]["all_gather"] < 2.5 * LAG_S, ev["collectives"]
    for key in ("cpu_busy", "sm_activity", "tensor_activity", "gpu_utilization", "gpu_memory_peak_bytes",
                "pcie_bytes_per_s"):
        assert want[key] is not None and ev[key] == pytest.approx(want[key], rel=1e-9), (key, ev, want)
    assert 0 < ev["cpu_busy"] <= 1 and 0 < ev["gpu_utilization"] <= 1
    assert ev["ib_bytes_per_s"] is None and ev["not_checked"]["ib_bytes_per_s"].startswith("not checked: no InfiniBand")
    assert ev["window_s"] == pytest.approx(t1 - t0)
