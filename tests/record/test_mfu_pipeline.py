"""MFU through the real pipeline: an untouched CPU job under `otel-gpu run --record`, its rank listed on a
fake H100 by the agent (`--fake-gpus=1 --process`), exported at once to VictoriaMetrics: the recorded window
and the Prometheus window give the same FLOPs, dtype, peak, MFU and account; the run summary shows them."""
from __future__ import annotations

import time
import uuid

import pytest

from otel_gpu.diagnose import diagnose
from otel_gpu.diagnose.account import account
from otel_gpu.diagnose.mfu import job_work
from otel_gpu.diagnose.queries import dur
from otel_gpu.diagnose.work import flops_per_gpu_promql, mfu_promql
from otel_gpu.peaks import peak_of
from otel_gpu.promql import PromClient
from otel_gpu.record.diagnose import diagnose_recording
from tests.childenv import clean_env

from .conftest import HERE, record
import sys

pytestmark = pytest.mark.slow
STEPS = 40


def test_recorded_and_prometheus_mfu_agree_on_a_fake_h100(victoriametrics, tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    vm = victoriametrics
    job = f"mfu-{uuid.uuid4().hex[:8]}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                    OTEL_METRIC_EXPORT_INTERVAL="500", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    r = record(tmp_path / "run", [sys.executable, str(HERE / "mfu_job.py"), str(STEPS)], "--job", job, "--no-profile",
               "--agent-arg=--fake-gpus=1", "--agent-arg=--process=mfu_job.py", "--agent-arg=--interval=0.5",
               env=env, cwd=tmp_path)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    recorded = diagnose_recording([r.directory])
    vm.flush()
    time.sleep(1.0)
    vm.flush()
    w = recorded.window
    with PromClient(vm.url) as client:
        served = diagnose(client, job, w.start, w.end)
        # the dashboards' form: one PromQL expression each, over the training time, at its end
        rng, at = dur(w.train_end - w.train_start), w.train_end
        (per_rank,) = client.query(mfu_promql(f'otelgpu_job="{job}"', "", rng), at)
        (per_gpu,) = client.query(flops_per_gpu_promql(f'otelgpu_job="{job}"', "", rng), at)
    s = served.window
    (a,), (b,) = w.ranks, s.ranks
    assert a.flops and a.flops == pytest.approx(b.flops, rel=1e-9) and a.flops_basis == b.flops_basis == "6N+attention"
    assert a.tokens == b.tokens == STEPS * 8 * 32
    assert a.compute_dtype == b.compute_dtype == "bf16"
    (ga,), (gb,) = w.gpus, s.gpus
    assert ga.ranks == gb.ranks == ["0"]
    assert ga.peaks == gb.peaks == pytest.approx(dict(peak_of("NVIDIA H100 80GB HBM3").flops))
    mine, theirs = job_work(w), job_work(s)
    assert mine.mfu is not None and theirs.mfu is not None, (mine.why_not, theirs.why_not)
    assert mine.mfu == pytest.approx(a.flops / (w.rank_wall_s(a) * 989.5e12))
    assert mine.mfu == pytest.approx(theirs.mfu, rel=0.05)
    assert mine.flops_per_s_per_gpu == pytest.approx(theirs.flops_per_s_per_gpu, rel=0.05)
    assert per_rank.labels["otelgpu_dtype"] == "bf16" and per_rank.labels["hw_id"] == ga.uuid
    assert per_rank.value == pytest.approx(mine.mfu, rel=0.1)      # rate() over the training time vs the rank's wall (1.6% apart here)
    assert per_gpu.value == pytest.approx(mine.flops_per_s_per_gpu, rel=0.1)
    # the account adds up on both paths and the two agree part by part
    ours, served_acc = account(w, mine), account(s, theirs)
    for acc in (ours, served_acc):
        assert sum(p.share for p in acc.parts) == pytest.approx(1.0)
        assert [p.key for p in acc.parts][-3:] == ["gpu_idle", "gpu_below_peak", "mfu"]
    for p, q in zip(ours.parts, served_acc.parts):
        assert p.key == q.key and p.share == pytest.approx(q.share, abs=0.03), (p, q)
    assert {p.key: p.share for p in ours.parts}["data_wait"] > 0.05
    # what the user reads: the run summary and the diagnosis
    assert "  work: " in r.proc.stderr and "MFU " in r.proc.stderr and "  time: data wait" in r.proc.stderr, r.proc.stderr
    assert served.as_dict()["work"]["job"]["mfu_value"] == pytest.approx(theirs.mfu)
    page = (r.directory / "report.html").read_text()
    assert '<section id="sec-work">' in page and "Where the time went" in page and "NVIDIA H100 80GB HBM3" in page
