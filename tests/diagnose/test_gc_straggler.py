"""A rank held up by Python's garbage collector is named with its GC time: the untouched DDP job
(tests/diagnose/jobs/ddp_train.py, no otel-gpu import, 2 ranks over gloo, recorded by `otel-gpu run`), where
the slow rank makes cyclic garbage and runs a full (gen-2) collection every step over a long-lived heap; the
script measures the time in `gc.collect()` itself. The slow rank comes from the test's random draw and is read
back from the script's truth file."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from otel_gpu.record.diagnose import diagnose_recording
from tests.record.conftest import record, torchrun

pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
pytestmark = pytest.mark.slow
JOB = Path(__file__).with_name("jobs") / "ddp_train.py"


def test_gc_pauses_name_the_rank_with_its_gc_time(tmp_path):
    slow = random.randrange(2)
    r = record(tmp_path / "run", torchrun(JOB, str(tmp_path / "truth{rank}.json"), "--slow-rank", str(slow),
                                          "--slow-where", "gc", "--slow-ms", "25", "--steps", "40", "--hidden", "256"),
               "--no-profile", "--no-agent", cwd=tmp_path)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    truths = [json.loads((tmp_path / f"truth{k}.json").read_text()) for k in range(2)]
    assert truths[0]["slow_rank"] == slow and truths[0]["slow_where"] == "gc"
    report = diagnose_recording([r.directory])
    rows = [(x.rank, x.mean_step_s, x.collective_s, x.gc_s) for x in report.window.ranks]
    (f,) = [x for x in report.findings if x.rule == "straggler"]
    assert f.where["ranks"] == [str(slow)] and f.severity in ("warning", "critical"), rows
    per_step = truths[slow]["slow_s"] / truths[slow]["steps"]   # the script's own clock around gc.collect()
    gc_seen = f.evidence["gc_s_per_step"]
    print(f"GC per step: diagnosed {gc_seen}, truth {per_step * 1000:.1f} ms on rank {slow}; "
          f"lateness {f.evidence['lateness_s'] * 1000:.1f} ms")
    assert gc_seen[str(slow)] == pytest.approx(per_step, rel=0.3), rows
    assert gc_seen[str(1 - slow)] < 0.2 * per_step
    cause = next(c for c in f.evidence["candidate_causes"] if "garbage collector" in c)
    assert cause.startswith(f"rank {slow} spends") and "full gen-2 collections" in cause
    assert f.action.startswith(f"rank {slow}: its Python garbage collector pauses it")
