"""Lightning's validation loop in a job nobody instrumented by hand: a LightningModule trained with DDP
(2 ranks, gloo, CPU, launched by torchrun) that validates mid-epoch every `val_check_interval` batches on
`limit_val_batches` batches, after a sanity check as long as a whole pass. Recorded with `otel-gpu run`
while the bodies go on to VictoriaMetrics; `diagnose RUN_DIR` and the PromQL diagnosis must both find
validation's share of the training time within 5 points of what each rank measured itself (the sanity
check, before the first batch, left out of both), name no straggler and no input problem, and count the
training batches as trained, each without the validation in it."""
from __future__ import annotations

import pytest

from tests.diagnose.test_eval_jobs import eval_shares, explain, run_both_ways, ways_agree
from tests.record.conftest import REPO, torchrun

pytestmark = pytest.mark.slow
JOB = REPO / "tests" / "diagnose" / "jobs" / "eval_lightning.py"
# passes after batches 110 and 220 of an epoch of 520 per rank: mid-epoch, none at the end;
# the sanity check runs a whole pass's worth of batches before the first one
STEPS, EVERY, BATCHES = 260, 110, 40


def test_lightning_validation_share_as_measured_and_nothing_else_named(victoriametrics, tmp_path):
    pytest.importorskip("lightning", reason="lightning not installed (otel-gpu[train])")
    cmd = torchrun(JOB, str(tmp_path / "truth{rank}.json"), str(tmp_path / "out"), "--steps", str(STEPS),
                   "--val-every", str(EVERY), "--val-batches", str(BATCHES), "--sanity", str(BATCHES))
    truth, recorded, served = run_both_ways(victoriametrics, tmp_path, "lightning-val", cmd)
    for t in truth.values():   # the scenario as meant: two passes mid-epoch, a sanity check before training
        assert t["steps"] == STEPS and t["passes"] == 2 and t["sanity_s"] > 0.3 * t["eval_s"] / t["passes"], t
    shares = {}
    for way, report in (("recording", recorded), ("prometheus", served)):
        # the batches as trained, none added by validation or the sanity check; no step holds a pass
        f, shares[way] = eval_shares(report, truth, way, STEPS)
        assert f.severity in ("warning", "critical") and "val_check_interval" in f.action, (way, f.severity, f.action)
        named = [(x.rule, x.severity) for x in report.findings
                 if x.rule in ("straggler", "input") and x.severity != "info"]
        assert not named, (way, explain(report))
        for rank in report.window.ranks:
            assert "forward" in rank.phases and "eval" in rank.phases, (way, rank.phases)
    print(f"lightning: eval share per rank, recording {shares['recording']}, prometheus {shares['prometheus']}, "
          f"measured { {k: round(t['eval_share'], 4) for k, t in truth.items()} }, "
          f"sanity check { {k: round(t['sanity_s'], 3) for k, t in truth.items()} } s")
    ways_agree(shares, truth)
