"""The end of a run's captures: step times (profiled against unprofiled), the lines for captures not made
(a job that never reached its first step: a real Timer and capture, in process), and the report section."""
from __future__ import annotations

import json

import pytest

from otel_gpu.report.traces import html
from otel_gpu.trace import capture_files as cf
from otel_gpu.trace.run_traces import finish_run, load_summary, not_captured, step_times, unprofiled_step_s


def status(rank="0", pid=1, time=1.0, state=cf.WRITTEN, window=(5, 6), step=10, **more) -> dict:
    return {"rank": rank, "pid": pid, "start_ticks": 1, "time": time, "step": step, "state": state,
            "window": list(window) if window else None, **more}


def test_step_times_pair_the_traces_median_step_with_the_ranks_latest_unprofiled_median():
    doc = {"ranks": [0, 1], "cross_rank": {"steps": [
        {"step": 5, "per_rank": {"0": {"step_us": 10_000.0}, "1": {"step_us": 30_000.0}}},
        {"step": 6, "per_rank": {"0": {"step_us": 14_000.0}, "1": {"step_us": 32_000.0}}},
        {"step": 7, "per_rank": {"0": {"step_us": 12_000.0}}}]}}
    statuses = [status("0", time=1.0, unprofiled_median_s=0.5), status("0", pid=2, time=2.0, unprofiled_median_s=0.011),
                status("1", unprofiled_median_s=float("nan"))]
    assert step_times(doc, statuses) == {0: (0.012, 0.011), 1: (0.031, None)}
    assert unprofiled_step_s(statuses) == {0: 0.011}


def test_not_captured_names_each_reason_once_with_its_ranks():
    lines = not_captured([
        status("0", state=cf.ENDED, message="steps 50-60 not captured: the job ended at step 2"),
        status("1", state=cf.ENDED, message="steps 50-60 not captured: the job ended at step 2"),
        status("2", state=cf.ARMED, step=7),
        status("3", state=cf.WRITTEN), status("4", state=cf.IDLE, window=None)], (50, 60))
    assert lines == ["ranks 0-1: steps 50-60 not captured: the job ended at step 2",
                     "rank 2: steps 5-6 not captured: the rank stopped reporting at step 7 (armed)"]
    assert not_captured([], (5, 6)) == ["steps 5-6 not captured: no rank started training "
                                        "(a rank registers at its first step or data batch)"]
    assert not_captured([], None) == []


def test_a_job_that_never_reaches_step_a_says_so_at_the_end_and_in_the_report(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    from otel_gpu.training import trace_capture
    from otel_gpu.training.timing import Timer

    class Sink:
        def step(self, *a):
            pass

    root = tmp_path / "traces"
    timer = Timer(Sink())
    capture = trace_capture.install({cf.TRACE_STEPS: "50-60", cf.TRACE_DIR: str(root)}, "0", timer,
                                    at_exit=lambda fn: None)
    for _ in range(3):   # three optimizer steps: two closed
        torch.ones(2).sum()
        timer.mark_step("optimizer")
    capture.at_exit()
    summary, lines = finish_run(root, (50, 60))
    assert lines == ["trace not captured: rank 0: steps 50-60 not captured: the job ended at step 2"]
    assert summary["captures"] == [] and not (root / "steps-50-60").exists()
    assert load_summary(tmp_path) == json.loads((root / "summary.json").read_text()) == summary
    page = html(summary)
    assert "Not captured: rank 0: steps 50-60 not captured: the job ended at step 2" in page


def test_the_report_section_escapes_and_survives_a_damaged_summary():
    summary = {"captures": [{"steps": [5, 6], "folder": "steps-5-6", "files": {"0": "steps-5-6/rank0.pt.trace.json.gz"},
                             "ranks": [0], "error": None, "analysis": "analysis/steps-5-6.json",
                             "findings_text": None, "step_times": {"0": [0.0125, 0.01]},
                             "findings": [{"title": "<script>x</script>", "ranks_text": "0", "share_pct": 12.0,
                                           "span": "GPU span", "fix": "f"}]}],
               "not_captured": []}
    page = html(summary)
    assert "&lt;script&gt;" in page and "<script>x" not in page
    assert "12.5 ms" in page and "10.0 ms" in page and "1.25x" in page
    assert 'href="traces/steps-5-6/rank0.pt.trace.json.gz"' in page
    assert "could not be read" in html({"captures": [{"steps": 5}]})
    assert html(None) == ""


def test_a_captures_gpu_time_by_code_reaches_the_reports_flame_graph(tmp_path):
    from otel_gpu.report.flames import GPU_PHASE, add_gpu_time
    from otel_gpu.report.traces import gpu_time
    from tests.trace.test_gpu_flame import EXPECTED, crafted

    root = tmp_path / cf.RUN_SUBDIR
    (root / "steps-3-3").mkdir(parents=True)
    crafted(str(root / "steps-3-3" / "rank0.pt.trace.json"))
    summary, _ = finish_run(root, (3, 3))
    assert summary["captures"][0]["gpu_time"] == "analysis/steps-3-3.gpu_time.json"
    assert load_summary(tmp_path) == summary
    per_rank = gpu_time([tmp_path], summary)
    assert per_rank == {0: EXPECTED}   # the same stacks and nanoseconds as the trace's own reading
    doc = add_gpu_time({"names": [], "ranks": [], "phases": [], "trees": {}}, per_rank)
    tree = doc["trees"][f"0|{GPU_PHASE}"]
    assert tree[1] == sum(EXPECTED.values())   # the root's total: every kernel's GPU time
    (root / "analysis" / "steps-3-3.gpu_time.json").write_text("{not json")
    assert gpu_time([tmp_path], summary) == {}   # a damaged file is left out, never a failure
