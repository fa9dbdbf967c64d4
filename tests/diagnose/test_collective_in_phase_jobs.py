"""A straggler's slow logging makes the other rank wait in the logging's own all-reduce: only the slow
rank is named. The job (tests/diagnose/jobs/logging_ddp_train.py, no otel-gpu import) logs from an
optimizer step hook, so both the slow part and the all-reduce sit inside the optimizer phase; the
waiting rank's optimizer phase keeps only its own time. 2 ranks by torchrun under `otel-gpu run`,
diagnosed from the recording, the slow rank 0 in one run and 1 in the other; the script measures its
own truth (the slow seconds, the seconds in the logging all-reduce)."""
from __future__ import annotations

import json

import pytest

from otel_gpu.record.diagnose import diagnose_recording
from tests.record.conftest import REPO, record, torchrun

pytestmark = pytest.mark.slow
JOB = REPO / "tests" / "diagnose" / "jobs" / "logging_ddp_train.py"


@pytest.mark.parametrize("slow", [0, 1])
def test_slow_logging_names_the_slow_rank_not_the_one_waiting_in_its_all_reduce(tmp_path, slow):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    r = record(tmp_path / "run", torchrun(JOB, str(tmp_path / "truth{rank}.json"), "--slow-rank", str(slow),
                                          "--slow-ms", "40", "--steps", "80"),
               "--no-profile", "--no-agent", cwd=tmp_path, timeout=240)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    truth = {t["rank"]: t for t in (json.loads((tmp_path / f"truth{i}.json").read_text()) for i in range(2))}
    other = 1 - slow
    assert truth[other]["log_allreduce_s"] > 0.5 * truth[slow]["slow_s"]   # the other rank did wait in logging
    rep = diagnose_recording([r.directory])
    explain = "; ".join(f"{f.severity} {f.rule}: {f.title}" for f in rep.findings if f.severity != "info")
    found = [f for f in rep.findings if f.rule == "straggler"]
    assert len(found) == 1 and found[0].severity in ("warning", "critical"), explain
    f = found[0]
    per_step = truth[slow]["slow_s"] / truth[slow]["steps"]
    print(f"slow rank {slow}: named {f.where['ranks']}, {f.evidence['phase']} grew "
          f"{f.evidence['phase_growth_s'] * 1000:.1f} ms (truth {per_step * 1000:.1f} ms); growth by phase "
          f"{f.evidence['growth_by_phase_s']}")
    assert f.where["ranks"] == [str(slow)] and f.evidence["phase"] == "optimizer", explain
    assert f.evidence["phase_growth_s"] == pytest.approx(per_step, rel=0.3)
    # the waiting rank's optimizer phase is its own time: its wait went to collective wait, by phase
    [waiting] = [x for x in rep.window.ranks if x.rank == str(other)]
    assert waiting.collective_by_phase.get("optimizer", 0.0) == pytest.approx(truth[other]["log_allreduce_s"], rel=0.3)
    assert waiting.phases["optimizer"] < 0.5 * truth[other]["log_allreduce_s"]
    assert not [x for x in rep.findings if x.rule in ("input", "checkpoint") and x.severity != "info"], explain
