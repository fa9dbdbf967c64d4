"""The report's median step is the median of the steps: a job with periodic slow steps (a user's
script, no otel-gpu import) recorded by `otel-gpu run`, its median checked against the step times the
script measured itself, within the histogram bucket's resolution."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from otel_gpu.record.reader import Recording
from otel_gpu.report.steps import step_summary

from .conftest import HERE, record

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("period, offset, slow, where", [(3, 1, 0.25, "loss"), (4, 2, 0.15, "data")])
def test_the_median_step_is_the_steps_median_within_its_bucket(tmp_path, period, offset, slow, where):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    truth = tmp_path / "steps.json"
    run = record(tmp_path / "run", [sys.executable, str(HERE / "slow_steps_job.py"), str(truth), "40", str(period),
                                    str(offset), str(slow), where], "--no-agent")
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    steps = json.loads(truth.read_text())
    true_median = statistics.median(steps)
    mean = statistics.fmean(steps)
    assert mean > 1.3 * true_median          # the slow steps pull the mean far from the median
    with Recording.open([run.directory]) as rec:
        (row,) = step_summary(rec)
    lo, hi = row["median_bucket_s"]
    assert row["steps"] == len(steps)          # a plain loop's step runs from one optimizer.step() to the next
    assert lo <= row["median_step_s"] <= hi
    assert abs(row["median_step_s"] - true_median) <= hi - lo, (row, true_median)
    assert f"median step {1000 * row['median_step_s']:.1f} ms (bucket" in run.proc.stderr, run.proc.stderr[-2000:]


def test_a_run_named_twice_is_reported_once(tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    truth = tmp_path / "steps.json"
    run = record(tmp_path / "run", [sys.executable, str(HERE / "slow_steps_job.py"), str(truth), "12", "5", "0",
                                    "0.05", "loss"], "--no-agent")
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    n = len(json.loads(truth.read_text()))
    report = subprocess.run([sys.executable, "-m", "otel_gpu", "report", str(run.directory), str(run.directory) + "/",
                             "-o", str(tmp_path / "twice.html")], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert f"rank 0: {n} steps" in report.stdout, report.stdout
