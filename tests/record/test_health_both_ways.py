"""The allocator and GC series through the real pipeline, both ways: a one-rank run under `otel-gpu run
--record`, forwarding to VictoriaMetrics, its allocator answers a recorded real `memory_stats()` output with
33 retries and 2 OOMs; `diagnose RUN_DIR` and `diagnose --prometheus` both name the retries per step and see
the rank's GC time."""
from __future__ import annotations

import json
import sys
import uuid

import pytest

from otel_gpu.report.build import write_report
from tests.childenv import clean_env

from .conftest import HERE, REPO, diagnosed_both_ways, record

pytestmark = pytest.mark.slow
STATS = REPO / "tests" / "data" / "cuda_memory_stats" / "oom_retries_v100.json"
STEPS = 60


def test_allocator_retries_and_gc_time_seen_on_both_paths(victoriametrics, tmp_path):
    vm = victoriametrics
    job = f"alloc-{uuid.uuid4().hex[:8]}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_METRIC_EXPORT_INTERVAL="300")
    truth = tmp_path / "truth.json"
    r = record(tmp_path / "run", [sys.executable, str(HERE / "alloc_replay_job.py"), str(STATS), str(STEPS), str(truth)],
               "--job", job, "--no-profile", "--no-agent", env=env, cwd=tmp_path)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    recorded, served = diagnosed_both_ways(vm, r.directory, job)
    w = recorded.window
    measured = json.loads(truth.read_text())
    for report in (recorded, served):
        (f,) = [x for x in report.findings if x.rule == "allocator"]
        (rk,) = report.window.ranks
        assert f.severity == "critical" and f.where["ranks"] == ["0"], f
        assert rk.alloc["0"].retries == 33 and rk.alloc["0"].ooms == 2 and rk.alloc["0"].reserved_max_b == 50331648
        assert f.evidence["retries_per_step"] == pytest.approx(33 / rk.step_count, rel=1e-6)
        assert "expandable_segments:True" in f.action
        # one full collection a step, timed by the rank's GC clock; the script's own clock around gc.collect
        assert rk.gc_n["2"] == pytest.approx(rk.step_count, abs=2)
        assert 0.5 * measured["gc_s"] / STEPS <= rk.gc_s["2"] / rk.step_count <= 1.5 * measured["gc_s"] / STEPS
    a, b = recorded.window.ranks[0], served.window.ranks[0]
    assert a.gc_s["2"] == pytest.approx(b.gc_s["2"], rel=1e-6) and a.step_count == b.step_count
    # the report shows it per rank
    built = write_report([r.directory], tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert '<table id="health">' in page and "cuda:0: 33 retries, 2 OOMs, reserved peak" in page, built.notes
