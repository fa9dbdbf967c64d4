"""The checkpoint rule on hand-built windows: savers are the ranks that spend time writing (not a rank
that writes its RNG state in 6 ms), ranks that wait for them are said as waiting, the save count is an
integer, and the step rate during saves is taken only where it can be resolved (a stall reads 0%,
never above normal)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.diagnose import saves
from otel_gpu.diagnose.model import Timeline
from otel_gpu.diagnose.rules_train import checkpoint
from otel_gpu.diagnose.thresholds import Thresholds

from .windows import T0, rank, window

TH = Thresholds()


def _hf_like(saver: int):
    """The saver writes 1.4 s over 8 saves; the other rank writes 6 ms per save and waits for the saver in
    its next collective (1.2 s more wait)."""
    ranks = []
    for r in range(2):
        mine = r == saver
        x = rank(r, steps=100, step_s=0.3, wall=40.0, waits={"": 0.1, "data_wait": 0.0 if mine else 1.2},
                 checkpoint=1.4 if mine else 0.048, forward=10.0, backward=12.0)
        x.saves = 8.0
        x.save_ranges = [(T0 + 5 + 4 * i, T0 + 5.18 + 4 * i) for i in range(8)]
        ranks.append(x)
    return window(ranks=ranks, duration=40.0)


@pytest.mark.parametrize("saver", [0, 1])
def test_only_the_rank_that_writes_is_a_saver_and_the_other_waits(saver):
    other = 1 - saver
    (f,) = checkpoint(_hf_like(saver), TH)
    assert f.where["ranks"] == [str(saver)] and f.evidence["savers"] == [str(saver)]
    assert f.evidence["waiting"] == {str(other): pytest.approx(1.2)}
    assert f.evidence["saves"] == 8 and isinstance(f.evidence["saves"], int)
    assert "(8 saves, one every 4 s)" in f.seen and "8.0 saves" not in f.seen
    assert f"saving: rank {saver}; waiting for the saves: rank {other}" in f.seen


def test_every_rank_that_writes_its_shards_is_a_saver():
    ranks = [rank(r, waits={"checkpoint": 0.5}, checkpoint=10.0 + r) for r in range(4)]   # ZeRO: each its shard
    (f,) = checkpoint(window(ranks=ranks), TH)
    assert f.where["ranks"] == ["3", "2", "1", "0"] and f.evidence["waiting"] == {}


def test_a_rank_whose_save_is_mostly_a_barrier_is_not_a_saver():
    """Own time: the barrier inside rank 1's save is collective wait, not saving."""
    ranks = [rank(0, waits={"": 1.0}, checkpoint=20.0), rank(1, waits={"checkpoint": 19.5}, checkpoint=0.5)]
    (f,) = checkpoint(window(ranks=ranks), TH)
    assert f.where["ranks"] == ["0"] and f.evidence["waiting"] == {"1": pytest.approx(18.5)}


def _rate_window(save_s: float, rate_inside: float, every: float = 20.0, normal: float = 2.0):
    """100 s at 0.5 s grid and export interval (each step-rate point covers 1.5 s), saves of `save_s`."""
    step, interval = 0.5, 0.5
    t = [T0 + i * step for i in range(int(100 / step) + 1)]
    starts = [T0 + 10 + every * i for i in range(4)]
    ranges = [(a, a + save_s) for a in starts]
    smooth = step + 2 * interval
    rate = []
    for x in t:
        overlap = sum(max(0.0, min(x, b) - max(x - smooth, a)) for a, b in ranges)
        rate.append((normal * (smooth - overlap) + rate_inside * overlap) / smooth)   # what a rate over the range reads
    r = rank(0, steps=180, step_s=0.5, wall=100.0, waits={}, checkpoint=4 * save_s)
    r.saves, r.save_ranges, r.first_t, r.last_t = 4.0, ranges, T0, T0 + 100
    w = window(ranks=[r], duration=100.0, step=step,
               timeline=Timeline(t=t, series={"steps": rate, "phase_checkpoint": [
                   1.0 if any(a <= x <= b for a, b in ranges) else 0.0 for x in t]}))
    w.interval_s = interval
    w.set_training_span()
    return w


def test_a_stalled_job_reads_zero_during_long_saves():
    (f,) = checkpoint(_rate_window(save_s=5.0, rate_inside=0.0), TH)
    assert f.evidence["step_rate_during_share"] == pytest.approx(0.0)
    assert "step rate 0.0% of normal during saves" in f.seen and "wholly inside" in f.basis


def test_a_job_that_keeps_stepping_reads_normal_and_never_above():
    (f,) = checkpoint(_rate_window(save_s=5.0, rate_inside=2.0), TH)
    assert f.evidence["step_rate_during_share"] == pytest.approx(1.0)
    (f,) = checkpoint(_rate_window(save_s=5.0, rate_inside=2.6), TH)   # counter noise above normal
    assert f.evidence["step_rate_during_share"] == 1.0


def test_saves_shorter_than_a_point_are_not_measured_not_guessed():
    (f,) = checkpoint(_rate_window(save_s=0.2, rate_inside=0.0), TH)
    assert f.evidence["step_rate_during_share"] is None
    assert "step rate during saves not measured: the saves last up to 0.20 s, shorter than the 1.5 s" in f.seen


@settings(max_examples=150, deadline=None)
@given(save_s=st.floats(0.1, 12.0), inside=st.floats(0.0, 5.0), normal=st.floats(0.1, 5.0))
def test_step_rate_during_saves_is_a_share_of_normal_and_a_stall_is_zero(save_s, inside, normal):
    w = _rate_window(save_s=save_s, rate_inside=inside, normal=normal)
    share, note = saves.step_rate_during(w, w.ranks[0].save_ranges)
    if share is None:
        assert "not measured" in note
    else:
        assert 0.0 <= share <= 1.0
        assert share == pytest.approx(min(1.0, inside / normal), abs=1e-9)
