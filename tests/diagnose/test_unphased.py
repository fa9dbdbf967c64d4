"""The unphased rule over hand-built windows: step time no phase covers, on every rank."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.diagnose import run_rules
from otel_gpu.diagnose.thresholds import Thresholds
from otel_gpu.diagnose.unphased import unphased, unphased_time

from .windows import rank, window

TH = Thresholds()


def test_own_iterator_on_every_rank_is_a_finding_with_its_share_per_rank():
    # 100 steps of 1 s; no data_wait phase (batches from the job's own generator): 0.6 s / 0.5 s per step outside
    ranks = [rank(0, forward=20, backward=15, optimizer=5), rank(1, forward=25, backward=20, optimizer=5)]
    [f] = unphased_time(window(ranks=ranks), TH)
    assert f.rule == "unphased" and f.severity == "critical"
    assert f.evidence["per_rank_share"] == {"0": 0.6, "1": 0.5}
    assert f.evidence["share"] == 0.5 and f.lost_share == 0.5
    assert f.evidence["per_rank_s_per_step"] == {"0": pytest.approx(0.6), "1": pytest.approx(0.5)}
    assert "50.0%" in f.title and "every rank" in f.title
    assert "rank 0: 60.0%, 600 ms per step" in f.seen
    assert "own iterator or generator" in f.why and f.evidence["can_be"][0].startswith("fetching batches")
    assert "phase('data_wait')" in f.action
    assert f.lost_s == pytest.approx(0.5 * sum(window(ranks=ranks).rank_wall_s(r) for r in ranks))


def test_eval_and_its_waits_are_neither_step_time_nor_subtracted_and_the_finding_says_so():
    # 100 steps of 1 s (an evaluation pass is never in a step): 40 s of phases, 10 s of waits in backward and
    # between phases; eval's 30 s and its 20 s all-reduce are outside the steps and not taken off them
    ranks = [rank(i, forward=20, backward=15, optimizer=5, eval=30, waits={"backward": 6, "": 4, "eval": 20})
             for i in range(2)]
    assert unphased(ranks[0]) == (pytest.approx(50.0), pytest.approx(0.5))
    [f] = unphased_time(window(ranks=ranks), TH)
    assert "minus every phase but eval" in f.seen and "every collective wait outside eval" in f.seen, f.seen
    assert "evaluation never in it" in f.seen


def test_quiet_when_phases_cover_the_steps_or_one_rank_only():
    covered = [rank(i, data_wait=5, forward=40, backward=40, optimizer=10) for i in range(2)]   # 5% outside
    assert unphased_time(window(ranks=covered), TH) == []
    one = [rank(0, forward=20, backward=20, optimizer=5), rank(1, forward=45, backward=45, optimizer=5)]
    assert unphased_time(window(ranks=one), TH) == []   # rank 1 has 5%: not every rank (a straggler's case)
    assert unphased_time(window(), TH) == []
    assert unphased_time(window(ranks=[rank(0, steps=0, forward=1)]), TH) == []


def test_severity_follows_the_thresholds_and_candidates_follow_the_phases():
    ranks = [rank(i, data_wait=30, forward=30, backward=20, optimizer=5) for i in range(2)]   # 15% outside
    [f] = unphased_time(window(ranks=ranks), TH)
    assert f.severity == "info" and "batch preparation outside the DataLoader" in f.evidence["can_be"][0]
    assert not any("model call" in c for c in f.evidence["can_be"])
    assert unphased_time(window(ranks=ranks), Thresholds({"unphased": {"share_min": 0.2}})) == []
    [g] = unphased_time(window(ranks=ranks), Thresholds({"unphased": {"share_warning": 0.1}}))
    assert g.severity == "warning"
    plain = [rank(i, backward=30, optimizer=5) for i in range(2)]   # no forward phase timed
    [h] = unphased_time(window(ranks=plain), TH)
    assert any("model call" in c for c in h.evidence["can_be"])


def test_ranked_among_the_other_findings_and_unit_without_gpus():
    ranks = [rank(i, forward=20, backward=15, optimizer=5) for i in range(2)]
    found = run_rules(window(ranks=ranks))
    f = next(x for x in found if x.rule == "unphased")
    assert "rank-min" in f.why and "GPU" not in f.why   # no GPUs in the window


@settings(max_examples=200, deadline=None)
@given(step=st.floats(0.01, 10.0), steps=st.integers(1, 10_000),
       parts=st.lists(st.floats(0.0, 1.0), min_size=0, max_size=6))
def test_unphased_share_is_step_time_minus_phases(step, steps, parts):
    r = rank(0, steps=steps, step_s=step, **{f"p{i}": x * step * steps for i, x in enumerate(parts)})
    secs, share = unphased(r)
    covered = sum(parts) * step * steps
    assert 0.0 <= share <= 1.0
    assert secs == pytest.approx(max(0.0, step * steps - covered), abs=1e-6 * step * steps)


def test_collective_waits_outside_the_phases_are_not_unexplained():
    # phase seconds are own time (the 5 s waited inside backward are not in it): 65 s outside phases
    r = rank(0, waits={"": 30.0, "backward": 5.0}, forward=20, backward=10, optimizer=5)
    assert unphased(r) == (pytest.approx(30.0), pytest.approx(0.3))
