"""Captures end to end: a real 2-rank gloo job (an untouched script under torchrun) recorded with
`otel-gpu run --trace-steps 5-6`, asked for 3 more steps while it runs (`otel-gpu trace capture`), the
traces analysed at the end and in the report. (A job that never reaches its first step: test_run_traces.py,
in process, as a real run of one costs 4 s of CPU.)"""
from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.cli import main
from tests.childenv import clean_env
from tests.procwatch import wait_until
from tests.servers import free_port

pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLI = [sys.executable, "-m", "otel_gpu"]


def step_marks(path: Path) -> list[int]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return sorted(int(m.group(1)) for e in doc["traceEvents"]
                  if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", "")))))


def test_steps_5_6_and_3_steps_on_request_on_both_ranks_analysed_into_the_report(tmp_path, capsys):
    run_dir, stop = tmp_path / "run", tmp_path / "stop"
    job = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(HERE / "gloo_job.py"), "3000", str(stop)]
    proc = subprocess.Popen(CLI + ["run", "--record", str(run_dir), "--no-agent", "--trace-steps", "5-6", "--", *job],
                            env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = run_dir / "traces" / "steps-5-6"
    try:
        wait_until(lambda: len(list(first.glob("rank*.pt.trace.json.gz"))) == 2 or proc.poll() is not None, 120)
        capsys.readouterr()
        asked = main(["trace", "capture", str(run_dir), "--steps", "3", "--margin", "0.5", "--timeout", "60"])
        said = capsys.readouterr()
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert asked == 0, said.out + said.err
    m = re.search(r"steps (\d+)-(\d+) on ranks 0-1 \(now at step (\d+)\)", said.out)
    assert m, said.out
    start, end, now = map(int, m.groups())
    assert end == start + 2 and start > now
    second = run_dir / "traces" / f"steps-{start}-{end}"
    for rank in (0, 1):
        assert step_marks(first / f"rank{rank}.pt.trace.json.gz") == [5, 6]
        assert step_marks(second / f"rank{rank}.pt.trace.json.gz") == [start, start + 1, start + 2]
    assert "trace of steps 5-6, ranks 0-1" in err and f"trace of steps {start}-{end}, ranks 0-1" in err
    summary = json.loads((run_dir / "traces" / "summary.json").read_text())
    assert [c["steps"] for c in summary["captures"]] == [[5, 6], [start, end]] and not summary["not_captured"]
    report = (run_dir / "report.html").read_text()
    assert "Profiler traces" in report and "Steps 5-6" in report and f"Steps {start}-{end}" in report
    for c in summary["captures"]:
        assert c["error"] is None and c["ranks"] == [0, 1]
        doc = json.loads((run_dir / "traces" / c["analysis"]).read_text())   # `trace analyze`'s document
        assert [f["title"] for f in doc["findings"]] == [f["title"] for f in c["findings"]]
        for f in c["findings"]:
            assert f["title"] in report
        steps = {row["step"] for row in doc["cross_rank"]["steps"]}
        assert steps == set(range(c["steps"][0], c["steps"][1] + 1))   # every captured step analysed
        for rank in ("0", "1"):
            captured, unprofiled = c["step_times"][rank]
            assert captured > 0 and unprofiled > 0
            assert f"{1000 * captured:.1f} ms" in report
