"""The evaluation rule (otel_gpu/diagnose/evaluation.py) on hand-built windows, and evaluation kept out of
the per-step rules (eval time and the waits inside it are not step time)."""
from __future__ import annotations

import pytest

from otel_gpu.diagnose import fmt, run_rules
from otel_gpu.diagnose.evaluation import evaluation
from otel_gpu.diagnose.model import Timeline
from otel_gpu.diagnose.straggler import busy_per_step
from otel_gpu.diagnose.thresholds import Thresholds
from otel_gpu.diagnose.unphased import unphased

from .windows import T0, gpu, grid, rank, window

TH = Thresholds()


def only(findings):
    assert len(findings) == 1, findings
    return findings[0]


@pytest.mark.parametrize("eval_s, severity", [(2.0, None), (6.0, "info"), (15.0, "warning"), (40.0, "critical")])
def test_severity_follows_the_share_of_wall_time(eval_s, severity):
    w = window(ranks=[rank(0, eval=eval_s), rank(1, eval=eval_s)])      # 120 s of wall time each
    found = evaluation(w, TH)
    if severity is None:
        assert found == []
        return
    f = only(found)
    assert f.rule == "eval" and f.severity == severity
    assert f.lost_share == pytest.approx(eval_s / 120.0) and f.lost_s == pytest.approx(2 * eval_s)
    assert f.where["ranks"] == ["0", "1"]


def test_waits_inside_eval_count_once_and_the_slowest_rank_counts():
    # rank 1 evaluates 10 s of its own and waits 14 s in the loss all-reduce inside eval, for rank 0, which
    # evaluates 30 s and waits 0.5 s there: the all-reduce's own time, which every rank pays
    w = window(ranks=[rank(0, eval=30.0, waits={"eval": 0.5, "": 3.0}), rank(1, eval=10.0, waits={"eval": 14.0})])
    f = only(evaluation(w, TH))
    # rank 1's 13.5 s beyond that were rank 0's evaluation, already in rank 0's 30 s
    assert f.evidence["per_rank_share"] == {"0": pytest.approx(30.5 / 120, abs=1e-4), "1": pytest.approx(10.5 / 120, abs=1e-4)}
    assert f.evidence["eval_s"] == pytest.approx(30.5) and f.evidence["share"] == pytest.approx(30.5 / 120, abs=1e-4)
    assert f.evidence["eval_collective_left_out_s"] == {"1": pytest.approx(13.5)}
    assert "rank 0 on n0 evaluated" in f.seen and "rank 1 13.5 s blocked inside eval" in f.seen, f.seen


def test_waits_inside_eval_for_another_ranks_checkpoint_are_not_counted_twice():
    """Rank 0 saves (10.2 s) while rank 1 has gone on into eval and blocks in its first all-reduce until the
    save ends: those seconds are the checkpoint finding's (every rank waits for the slowest save), not eval's.
    The passes themselves are 5 s on each rank, their all-reduces 0.1 s."""
    ranks = [rank(0, eval=5.0, checkpoint=10.2, waits={"eval": 0.1, "": 1.0}),
             rank(1, eval=5.0, waits={"eval": 10.3, "": 1.0})]
    found = {f.rule: f for f in run_rules(window(ranks=ranks), TH)}
    ev, ck = found["eval"], found["checkpoint"]
    assert ev.lost_share == pytest.approx(5.1 / 120, abs=1e-4), ev.evidence   # was 15.3 / 120: rank 1's wait counted
    assert ev.evidence["per_rank_share"] == {"0": pytest.approx(5.1 / 120, abs=1e-4), "1": pytest.approx(5.1 / 120, abs=1e-4)}
    assert ck.lost_s == pytest.approx(2 * 10.2)                                  # the save, on both ranks
    # the two findings' seconds on rank 1 add up to what its wall time holds of them, each counted once
    assert ev.lost_s + ck.lost_s == pytest.approx(2 * (5.1 + 10.2))
    assert "rank 1 10.2 s blocked inside eval" in ev.seen, ev.seen


def test_passes_and_how_much_less_often():
    t = grid()                                               # 5 s grid over 120 s
    ev = [1.0 if i % 6 == 5 else 0.0 for i in range(len(t))]   # a pass every 30 s, from 25 s
    tl = Timeline(t=t, series={"phase_eval": ev})
    f = only(evaluation(window(ranks=[rank(0, eval=20.0)], timeline=tl), TH))
    assert f.evidence["passes"] == 4 and f.evidence["every_s"] == pytest.approx(30.0)
    assert all(T0 <= a <= b <= T0 + 120 for a, b in f.ranges)
    share = 20.0 / 120
    # a share of 16.7% at one pass every 30 s: every 30 * share / 5% = 100 s brings it to 5%
    assert f"every {fmt.secs(100.0)} instead of every {fmt.secs(30.0)}" in f.action, f.action
    for words in ("fewer batches", "asynchronously", "inference_mode"):
        assert words in f.action
    assert f.severity == "warning" and f.lost_share == pytest.approx(share)


def test_gpu_activity_during_eval():
    t = grid()
    ev = [i >= 18 for i in range(len(t))]
    tl = Timeline(t=t, series={"sm": [0.1 if e else 0.6 for e in ev], "phase_eval": [1.0 if e else 0.0 for e in ev]})
    f = only(evaluation(window(ranks=[rank(0, eval=30.0)], gpus=[gpu(0)], timeline=tl), TH))
    assert f.evidence["activity_drop"] == pytest.approx(1 - 0.1 / 0.6)
    assert "SM activity 10.0% during eval vs 60.0% otherwise" in f.seen
    assert "of their training activity" in f.why and f.lost_s == pytest.approx(30.0)


def test_no_eval_no_finding_and_run_rules_names_it_once():
    assert evaluation(window(ranks=[rank(0), rank(1)]), TH) == []
    found = [f for f in run_rules(window(ranks=[rank(0, eval=40.0)]), TH) if f.rule == "eval"]
    assert len(found) == 1


def test_eval_is_not_step_time_for_the_per_step_rules():
    # eval passes and their all-reduce waits lie outside the steps: the per-step rules leave them alone
    plain = rank(0, forward=30.0, backward=40.0, waits={"backward": 10.0})
    evaluated = rank(0, forward=30.0, backward=40.0, eval=50.0, waits={"backward": 10.0, "eval": 8.0})
    assert unphased(evaluated) == pytest.approx(unphased(plain)) and unphased(plain)[0] == pytest.approx(20.0)
    assert busy_per_step(evaluated) == pytest.approx(busy_per_step(plain))
