"""A job we did not shape, recorded with `otel-gpu run`: DDP whose batches come from the script's own
generator (no DataLoader), the generator's time chosen by the script per rank and per run (sleeping in
one run, computing in the other). The unphased finding's share on each rank is within 5 points of the
share the script measured itself; the diagnosis says why the input rule could not run, in words that
fit a CPU-only run."""
from __future__ import annotations

import json

import pytest

from otel_gpu.diagnose import report as R
from otel_gpu.record.diagnose import diagnose_recording

from .conftest import REPO, record, torchrun

pytestmark = pytest.mark.slow
JOB = REPO / "tests" / "diagnose" / "jobs" / "own_iterator.py"


@pytest.mark.parametrize("mode, seed", [("sleep", 3), ("cpu", 8)])
def test_unexplained_share_matches_the_scripts_own_measure(tmp_path, mode, seed):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    r = record(tmp_path / "run", torchrun(JOB, str(tmp_path), "--steps", "150", "--mode", mode, "--seed", str(seed)),
               "--no-profile", cwd=tmp_path, timeout=300)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    truth = {t["rank"]: t for t in (json.loads((tmp_path / f"truth{i}.json").read_text()) for i in range(2))}
    assert abs(truth["0"]["amount_ms"] - truth["1"]["amount_ms"]) > 0.5   # the ranks differ
    rep = diagnose_recording([r.directory])
    [f] = [x for x in rep.findings if x.rule == "unphased"]
    shares = f.evidence["per_rank_share"]
    detail = {k: (round(shares[k], 3), round(t["generator_share"], 3)) for k, t in truth.items()}
    print(f"{mode}: rank -> (unphased share, the script's generator share): {detail}")
    for k, t in truth.items():
        assert shares[k] == pytest.approx(t["generator_share"], abs=0.05), detail
    assert f.evidence["share"] == min(shares.values())
    assert f.evidence["can_be"][0].startswith("fetching batches from the job's own iterator"), f.evidence
    [inp] = [x for x in rep.findings if x.rule == "input"]
    assert inp.missing and "do not come from a torch DataLoader" in inp.action
    out = R.text(rep.as_dict())
    assert "GPU-s" not in out and "GPU-min" not in out and "rank-" in out
    assert all("confidence" not in line for line in out.splitlines() if "not checked" in line)
    assert "run the otel-gpu agent" not in out
